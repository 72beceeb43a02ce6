"""candidate_topk: a hand-derived top-k, a brute-force twin, permutation invariance,
the cases and the bugs their pitfall cases must catch."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from conformance.cases import candidate_topk as cases
from reference import numerics, precision
from reference.candidate_topk import candidate_topk
from reference.numerics import storage, to_bf16, to_fp32

FP32_ULP = 2.0**-23  # relative spacing of FP32 just above a power of two


def bf(x):
    return storage(np.asarray(x, dtype=np.float64), "bf16")


# -- hand-derived ---------------------------------------------------------------------------------

# hidden (1, 2); head rows and their logits z = head . hidden:
#   r0 (1, 0) -> 1   r1 (0, 1) -> 2   r2 (2, 0) -> 2   r3 (1, 1) -> 3   r4 (-1, 0) -> -1   r5 (5, 5) -> 15
# vocab_size 5 drops r5 (the largest). Order: r3 (3), then the tie r1 = r2 = 2 in row order, then r0 (1).
HAND = {"hidden": bf([[[1.0, 2.0]]]), "head": bf([[1, 0], [0, 1], [2, 0], [1, 1], [-1, 0], [5, 5]])}


def test_hand_top3():
    """ids [3, 1, 2]. Margins: rank 0 min(inf, 3-2) = 1; rank 1 min(3-2, 2-2) = 0; rank 2
    min(2-2, 2-1) = 0 (its lower neighbour r0 is the best row left out)."""
    out = candidate_topk(**HAND, vocab_size=5, top_k=3)
    np.testing.assert_array_equal(out["ids"], [[[3, 1, 2]]])
    np.testing.assert_array_equal(out["ids.margin"], [[[1.0, 0.0, 0.0]]])
    np.testing.assert_array_equal(out["scores"], [[[3.0, 2.0, 2.0]]])
    assert out["ids"].dtype == np.int32


def test_hand_transform_after_selection():
    """m only: u = 0.5 z = (1.5, 1, 1). c only: u = 2 tanh(z / 2) = 2 tanh(1.5), 2 tanh(1), 2 tanh(1)
    = 1.8102965..., 1.5231883..., each rounded once to FP32. Both: 2 tanh(0.5 z / 2)."""
    out = candidate_topk(**HAND, vocab_size=5, top_k=3, output_multiplier=0.5)
    np.testing.assert_array_equal(out["scores"], [[[1.5, 1.0, 1.0]]])
    out = candidate_topk(**HAND, vocab_size=5, top_k=3, softcap=2.0)
    expect = to_fp32([2 * math.tanh(1.5), 2 * math.tanh(1.0), 2 * math.tanh(1.0)])
    # math.tanh and np.tanh may differ by one float64 ulp, which moves an FP32 rounding by at most one ulp
    np.testing.assert_allclose(out["scores"][0, 0], expect, rtol=FP32_ULP, atol=0)
    assert abs(out["scores"][0, 0, 0] - 1.8102965) < 1e-6
    out = candidate_topk(**HAND, vocab_size=5, top_k=3, output_multiplier=0.5, softcap=2.0)
    expect = to_fp32([2 * math.tanh(0.75), 2 * math.tanh(0.5), 2 * math.tanh(0.5)])
    np.testing.assert_allclose(out["scores"][0, 0], expect, rtol=FP32_ULP, atol=0)
    np.testing.assert_array_equal(out["ids"], [[[3, 1, 2]]])


def test_hand_shortlist_ties_by_row_not_id():
    """Shortlist [40, 30, 20, 10, 50, 60], vocab 55: r5 (id 60) is padding. The tie r1 = r2 goes to
    row 1 (id 30) although id 20 is lower; every returned id is a global id."""
    out = candidate_topk(**HAND, vocab_size=55, top_k=4, shortlist=np.array([40, 30, 20, 10, 50, 60], np.int32))
    np.testing.assert_array_equal(out["ids"], [[[10, 30, 20, 40]]])
    np.testing.assert_array_equal(out["ids.margin"], [[[1.0, 0.0, 0.0, 1.0]]])  # rank 3's lower row: r4 at -1


def test_hand_forced_ids_and_refusal():
    forced = candidate_topk(**HAND, vocab_size=5, top_k=3, forced_ids=np.array([[[3, 2, 5]]]))
    np.testing.assert_array_equal(forced["ids"], [[[3, 1, 2]]])  # its own choice, reported as such
    np.testing.assert_array_equal(forced["scores"][0, 0, :2], [3.0, 2.0])
    assert np.isnan(forced["scores"][0, 0, 2])  # id 5 is padding: no eligible row holds it
    with pytest.raises(ValueError):
        candidate_topk(**HAND, vocab_size=2, top_k=3)


# -- brute force ----------------------------------------------------------------------------------


def brute_force(hidden, head, vocab_size, top_k, output_multiplier=0.0, softcap=0.0, shortlist=None):
    """Python sort with the C4 key (-z, row) on explicit dot products; the margin of a rank
    as the distance to the nearest other eligible logit (the neighbours in sorted order)."""
    hidden, head = np.asarray(hidden, np.float64), np.asarray(head, np.float64)
    nb, nk, h = hidden.shape
    gid = list(range(head.shape[0])) if shortlist is None else [int(v) for v in shortlist]
    elig = [r for r in range(head.shape[0]) if 0 <= gid[r] < vocab_size]
    ids = np.zeros((nb, nk, top_k), np.int64)
    margin = np.zeros((nb, nk, top_k))
    scores = np.zeros((nb, nk, top_k))
    for b in range(nb):
        for i in range(nk):
            z = {r: sum(float(hidden[b, i, c]) * float(head[r, c]) for c in range(h)) for r in elig}
            top = sorted(elig, key=lambda r: (-z[r], r))[:top_k]
            for rank, r in enumerate(top):
                ids[b, i, rank] = gid[r]
                margin[b, i, rank] = min((abs(z[r] - z[v]) for v in elig if v != r), default=math.inf)
                u = z[r] * (output_multiplier if output_multiplier > 0 else 1.0)
                scores[b, i, rank] = softcap * math.tanh(u / softcap) if softcap > 0 else u
    return {"ids": ids, "ids.margin": margin, "scores": to_fp32(scores)}


@st.composite
def coarse_problem(draw):
    """Values k/4 and k/8 with |k| <= 2: logits are exact multiples of 1/32 and ties abound."""
    nb, nk = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    h = draw(st.integers(1, 6))
    vr = draw(st.integers(2, 40))
    hidden = draw(hnp.arrays(np.int64, (nb, nk, h), elements=st.integers(-2, 2))) / 4.0
    head = draw(hnp.arrays(np.int64, (vr, h), elements=st.integers(-2, 2))) / 8.0
    shortlist = None
    if draw(st.booleans()):
        shortlist = np.array(draw(st.permutations(range(vr + 8)))[:vr], np.int32)
        vocab = draw(st.integers(1, vr + 8))
    else:
        vocab = draw(st.integers(1, vr + 4))
    gid = np.arange(vr) if shortlist is None else shortlist
    n_elig = int(((gid >= 0) & (gid < vocab)).sum())
    if n_elig == 0:
        vocab, n_elig = vr + 8, vr
    top_k = draw(st.integers(1, n_elig))
    params = {"vocab_size": vocab, "top_k": top_k}
    params["output_multiplier"] = draw(st.sampled_from([0.0, 0.5, 3.0]))
    params["softcap"] = draw(st.sampled_from([0.0, 0.25, 7.0]))
    kw = {"hidden": bf(hidden), "head": bf(head), **params}
    if shortlist is not None:
        kw["shortlist"] = shortlist
    return kw


@settings(max_examples=150, deadline=None)
@given(coarse_problem())
def test_matches_brute_force(kw):
    ref = candidate_topk(**kw)
    bf_out = brute_force(**kw)
    np.testing.assert_array_equal(ref["ids"], bf_out["ids"])
    np.testing.assert_array_equal(ref["ids.margin"], bf_out["ids.margin"])  # logits exact: gaps exact
    # math.tanh versus np.tanh: one float64 ulp apart at most, one FP32 ulp after rounding
    np.testing.assert_allclose(ref["scores"], bf_out["scores"], rtol=FP32_ULP, atol=0)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(2, 64), st.integers(1, 16))
def test_row_permutation_with_shortlist_changes_nothing(seed, vr, top_k):
    """Without ties the answer depends on logits and global ids only: moving head rows
    and their shortlist entries together leaves ids and scores unchanged."""
    rng = np.random.default_rng(seed)
    top_k = min(top_k, vr)
    hidden, head = bf(rng.standard_normal((2, 2, 8))), bf(rng.standard_normal((vr, 8)))
    shortlist = rng.choice(1000, vr, replace=False).astype(np.int32)
    out = candidate_topk(hidden=hidden, head=head, shortlist=shortlist, vocab_size=1000, top_k=top_k, softcap=2.0)
    if np.any(out["ids.margin"] == 0):
        return  # a tie: row order legitimately decides
    perm = rng.permutation(vr)
    moved = candidate_topk(
        hidden=hidden, head=head[perm], shortlist=shortlist[perm], vocab_size=1000, top_k=top_k, softcap=2.0
    )
    np.testing.assert_array_equal(moved["ids"], out["ids"])
    np.testing.assert_array_equal(moved["scores"], out["scores"])


# -- cases ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def generated():
    return cases.generate()


@pytest.fixture(scope="module")
def runs(generated):
    """Per case: reference, float32 baseline and the harness's bounds (C2)."""
    out = {}
    for c in generated:
        ref = candidate_topk(**c.kwargs())
        with precision.baseline(cases.SPEC.bf16_intermediates):
            base = candidate_topk(**c.kwargs())
        fin = np.isfinite(ref["ids.margin"])
        margin_err = float(np.abs(base["ids.margin"][fin] - ref["ids.margin"][fin]).max(initial=0.0))
        ulp = 2 * numerics.ulp_error(base["scores"], ref["scores"], "fp32").max() + 1
        out[c.id] = (ref, base, margin_err, ulp)
    return out


def test_generator_deterministic_and_ids_unique(generated):
    again = cases.generate()
    ids = [c.id for c in generated]
    assert len(set(ids)) == len(ids) and ids == [c.id for c in again]
    for c, d in zip(generated, again):
        assert c.params == d.params
        assert c.inputs.keys() == d.inputs.keys()
        for k in c.inputs:
            assert c.inputs[k].dtype == d.inputs[k].dtype and c.inputs[k].tobytes() == d.inputs[k].tobytes()


def test_cases_shape_and_flags(generated):
    assert 10 <= len(generated) <= 60
    pitfalls = {"topk_unstable"}
    for c in generated:
        assert c.op == "candidate_topk"
        assert set(c.inputs) <= set(cases.SPEC.inputs) and set(c.params) == set(cases.SPEC.params)
        assert c.inputs["hidden"].dtype == np.dtype(numerics.BF16.dtype) == c.inputs["head"].dtype
        assert c.inputs.get("shortlist", np.zeros(0, np.int32)).dtype == np.int32
        assert c.inputs["head"].shape[0] <= 512 and c.inputs["head"].shape[1] <= 128
        for f in set(c.flags) & pitfalls:
            assert f in c.id
    flags = {f for c in generated for f in c.flags}
    assert {"topk_unstable", "exact_tie", "bf16_tie", "vocab_padding", "shortlist_remap"} <= flags


def test_budget(generated):
    """Inputs plus outputs (FP32 scores, int32 ids, float64 margins) within 1 MB for this Op."""
    total = 0
    for c in generated:
        total += sum(v.nbytes for v in c.inputs.values())
        total += sum(np.asarray(v).nbytes for v in candidate_topk(**c.kwargs()).values())
    assert total <= 2**20


def test_decisions_clear_or_exact_ties(generated, runs):
    """Every rank is an exact tie (margin 0, flagged) or clear: margin > 100x twice the
    baseline's margin error; the baseline reproduces every exact tie and every id."""
    for c in generated:
        ref, base, margin_err, _ = runs[c.id]
        m = ref["ids.margin"]
        np.testing.assert_array_equal(base["ids"], ref["ids"], err_msg=c.id)
        # nan_scores: ranks among +-inf/NaN scores have no margin (NaN); their order is exact (C4)
        undefined = np.isnan(m) if "nan_scores" in c.flags else np.zeros(m.shape, bool)
        assert np.all((m == 0) | (m > 200 * margin_err) | undefined), c.id
        assert np.all(base["ids.margin"][m == 0] == 0), c.id
        assert np.any(m == 0) == ("exact_tie" in c.flags), c.id


# -- pitfall cases: the buggy variant fails ------------------------------------------------------


def decision_fails(ref_ids, out_ids, ref_margin, margin_err) -> bool:
    """C2: a different decision is ACCEPTABLE only where the margin is within 2x the baseline's
    margin error; an exact tie (margin 0) is decided by C4 and never ambiguous."""
    differ = np.asarray(out_ids) != ref_ids
    return bool(np.any(differ & ((ref_margin == 0) | (ref_margin > 2 * margin_err))))


def buggy_topk(
    hidden, head, vocab_size, top_k, output_multiplier=0.0, softcap=0.0, shortlist=None, *, bug, shuffle_seed=0
):
    """bug: "highest_row" (ties to the higher row), "shuffled" (ties in an arbitrary order, as an
    unstable sort leaves them), "lowest_id" (ties by global id), "bf16_transform" (m and c in BF16
    before selection), "no_mask" (padding rows compete), "rows" (shortlist rows returned as ids)."""
    z = np.asarray(hidden, np.float64) @ np.asarray(head, np.float64).T
    vr = z.shape[-1]
    gid = np.arange(vr) if shortlist is None else np.asarray(shortlist, np.int64)
    elig = (gid >= 0) & (gid < vocab_size) if bug != "no_mask" else np.ones(vr, bool)
    u = z * (output_multiplier if output_multiplier > 0 else 1.0)
    u = softcap * np.tanh(u / softcap) if softcap > 0 else u
    key = to_bf16(u) if bug == "bf16_transform" else z
    second = {"highest_row": -np.arange(vr), "lowest_id": gid}.get(bug, np.arange(vr))
    if bug == "shuffled":
        second = np.random.default_rng(shuffle_seed).permutation(vr)
    order = np.lexsort((np.broadcast_to(second, z.shape), np.where(elig, -key, np.inf)), axis=-1)[..., :top_k]
    ids = order if bug == "rows" else gid[order]
    scores = np.take_along_axis(to_bf16(u) if bug == "bf16_transform" else to_fp32(u), order, axis=-1)
    return {"ids": ids, "scores": scores}


BUGS = {
    "exact_tie": ["highest_row"],
    "shortlist_remap": ["rows"],
    "vocab_padding": ["no_mask"],
    "bf16_tie": ["bf16_transform"],
}


@pytest.mark.parametrize("flag", sorted(BUGS))
def test_flagged_cases_fail_their_bugs(generated, runs, flag):
    targeted = [c for c in generated if flag in c.flags]
    assert targeted
    for c in targeted:
        ref, _, margin_err, ulp = runs[c.id]
        for bug in BUGS[flag]:
            out = buggy_topk(**c.kwargs(), bug=bug)
            assert decision_fails(ref["ids"], out["ids"], ref["ids.margin"], margin_err), (c.id, bug)
        # the machinery is sound: the bug-free variant passes
        ok = buggy_topk(**c.kwargs(), bug="none")
        assert not decision_fails(ref["ids"], ok["ids"], ref["ids.margin"], margin_err), c.id
        assert numerics.ulp_error(ok["scores"], ref["scores"], "fp32").max() <= ulp, c.id


def test_softcap_bf16_cases_also_fail_on_scores(generated, runs):
    """Scores transformed in BF16 sit hundreds of FP32 ulps from the FP32 answer."""
    for c in (c for c in generated if "bf16_tie" in c.flags):
        ref, _, _, ulp = runs[c.id]
        out = buggy_topk(**c.kwargs(), bug="bf16_transform")
        if np.all(to_bf16(ref["scores"]) == ref["scores"]):
            continue  # saturated: every score is exactly c, which BF16 holds too; the ids fail instead
        # compare the scores of ids both return, so only the representation differs
        worst = 0.0
        for pos in np.ndindex(ref["ids"].shape[:-1]):
            mine = dict(zip(out["ids"][pos].tolist(), out["scores"][pos]))
            for rid, score in zip(ref["ids"][pos].tolist(), ref["scores"][pos]):
                if rid in mine:
                    worst = max(worst, float(numerics.ulp_error(mine[rid], score, "fp32")))
        assert worst >= 100 * ulp, c.id


def test_shortlist_tie_case_fails_tie_by_global_id(generated, runs):
    c = next(c for c in generated if "shortlist" in c.inputs and "exact_tie" in c.flags)
    ref, _, margin_err, _ = runs[c.id]
    out = buggy_topk(**c.kwargs(), bug="lowest_id")
    assert decision_fails(ref["ids"], out["ids"], ref["ids.margin"], margin_err)


def test_tie_cases_fail_unstable_orders(generated, runs):
    """An unstable sort leaves ties in some arbitrary order (here: a random row permutation as
    the second key). A case passes such an order only when all its tied rows happen to come out
    in row order: 1/2 for one tied pair, 1/2^8 for eight independent pairs. Over ten orders the
    suite must fail every one, and the per-position and multi-row tie cases nearly every one."""
    tie_cases = [c for c in generated if "exact_tie" in c.flags]
    per_case = {c.id: 0 for c in tie_cases}
    for s in range(10):
        failed = 0
        for c in tie_cases:
            ref, _, margin_err, _ = runs[c.id]
            out = buggy_topk(**c.kwargs(), bug="shuffled", shuffle_seed=s)
            hit = decision_fails(ref["ids"], out["ids"], ref["ids.margin"], margin_err)
            per_case[c.id] += hit
            failed += hit
        assert failed >= 1, s
    for cid, fails in per_case.items():
        if "per_position" in cid or "tie4" in cid or "all_rows" in cid or "inside" in cid:
            assert fails >= 8, (cid, fails)
