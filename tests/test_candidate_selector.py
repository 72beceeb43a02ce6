"""candidate_selector: a hand walk, the race on hand-made uniforms, brute-force E
matrices, batch-row independence, q normalisation, the cases and their pitfalls."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.cases import candidate_selector as cases
from reference import numerics, precision
from reference.candidate_selector import candidate_selector
from reference.numerics import storage
from reference.rng import Purpose, uniform
from tests.casetools import U32, philox_py


def bf(x):
    return storage(np.asarray(x, dtype=np.float64), "bf16")


def f64(x):
    return np.asarray(x, dtype=np.float64)


# -- an independent Philox4x32-10 in plain Python ints ---------------------------------------------


def uniform_py(seed, position, index):
    """C3: counter (pos lo, pos hi, DFLASH2_PROPOSAL = 1, index), key (seed lo, seed hi), word 0."""
    x0 = philox_py([position & U32, position >> 32, 1, index], [seed & U32, seed >> 32])[0]
    return ((x0 >> 8) | 1) / 2.0**24


def test_philox_py_known_answers():
    """Random123's known-answer lines (CONTRACTS C3), so the hand uniforms below are trusted."""
    assert philox_py([0, 0, 0, 0], [0, 0]) == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    assert philox_py([U32] * 4, [U32] * 2) == [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]
    ctr = [0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344]
    assert philox_py(ctr, [0xA4093822, 0x299F31D0]) == [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]


# -- hand-derived ---------------------------------------------------------------------------------


def hand_walk(**over):
    """R = H = 2, W_hidden = I, h_i = (1, 1), so g_i = (1, 1); k = 2, K = 3, anchor 7.
    C_0 = [1, 2], C_1 = [3, 4], C_2 = [5, 6]; u_0 = [1, 0.5], u_1 = [1, 0], u_2 = [0, 0.25].
    W_pred: 7 -> (1, 0), 2 -> (0, 2), 4 -> (-1, 1), others 0.
    W_succ: 2 -> (1, 0), 4 -> (0, 1), 5 -> (0, 1), 6 -> (1, 0), others 0."""
    w_pred, w_succ = np.zeros((8, 2)), np.zeros((8, 2))
    w_pred[7], w_pred[2], w_pred[4] = (1, 0), (0, 2), (-1, 1)
    w_succ[2], w_succ[4], w_succ[5], w_succ[6] = (1, 0), (0, 1), (0, 1), (1, 0)
    kw = {
        "hidden": bf(np.ones((1, 3, 2))),
        "scores": storage([[[1.0, 0.5], [1.0, 0.0], [0.0, 0.25]]], "fp32"),
        "ids": np.array([[[1, 2], [3, 4], [5, 6]]], np.int32),
        "anchor": np.array([7], np.int32),
        "w_hidden": bf(np.eye(2)),
        "w_pred": bf(w_pred),
        "w_succ": bf(w_succ),
        "temperature": np.zeros(1, np.float32),
        "seed": np.zeros(1, np.uint64),
        "frontier": np.zeros(1, np.int64),
    }
    return {**kw, **over}


def test_hand_walk_planted_path():
    """E_0 = u_0 + (1,0).(1,1).W_succ[C_0] = [1 + 0, 0.5 + 1] = [1, 1.5]      -> j_0 = 1 (token 2), margin 0.5
    E_1 = u_1 + (0,2).(1,1).W_succ[C_1] = [1 + 0, 0 + 2]   = [1, 2]          -> j_1 = 1 (token 4), margin 1
    E_2 = u_2 + (-1,1).(1,1).W_succ[C_2] = [0 + 1, 0.25 - 1] = [1, -0.75]   -> j_2 = 0 (token 5), margin 1.75
    The unary argmax (0, 0, 1) is not the walk: from token 1 (W_pred row 0) E_1 would be [1, 0]."""
    out = candidate_selector(**hand_walk())
    np.testing.assert_array_equal(out["g"], [[[1.0, 1.0]] * 3])
    np.testing.assert_array_equal(out["path"], [[1, 1, 0]])
    np.testing.assert_array_equal(out["tokens"], [[2, 4, 5]])
    np.testing.assert_array_equal(out["path.margin"], [[0.5, 1.0, 1.75]])
    np.testing.assert_array_equal(out["tokens.margin"], out["path.margin"])
    np.testing.assert_array_equal(out["q"], [[[0, 1], [0, 1], [1, 0]]])
    assert out["path"].dtype == np.int32 and out["tokens"].dtype == np.int32


def test_hand_forced_path():
    """forced_path (0, 0, 0): step 1 reads token C_0[0] = 1 (W_pred row 0): E_1 = [1, 0] -> own choice 0,
    margin 1; step 2 reads C_1[0] = 3 (row 0): E_2 = u_2 = [0, 0.25] -> own choice 1, margin 0.25.
    Step 0 has no predecessor to force and stays j_0 = 1."""
    out = candidate_selector(**hand_walk(), forced_path=np.zeros((1, 3), np.int32))
    np.testing.assert_array_equal(out["path"], [[1, 0, 1]])
    np.testing.assert_array_equal(out["tokens"], [[2, 3, 6]])
    np.testing.assert_array_equal(out["path.margin"], [[0.5, 1.0, 0.25]])


def test_hand_g_rounds_once_from_float64():
    """g = W_hidden h with W row (1, 2^-8) and h = (1, 1 + 2^-7): 1 + 2^-8 + 2^-15, just above the
    half-way point between 1 and 1 + 2^-7, so BF16 RNE gives 1.0078125 (not 1.0)."""
    kw = hand_walk(
        hidden=bf(np.tile([1.0, 1 + 2.0**-7], (1, 3, 1))),
        w_hidden=bf([[1.0, 2.0**-8], [0.0, 1.0]]),
    )
    assert candidate_selector(**kw)["g"][0, 0, 0] == 1.0078125


def test_hand_race_on_philox_uniforms():
    """T = 1, no pair terms (W_pred of the anchor is 0), k = 4. Step 0: u = 0 -> q = 1/4 each, exactly,
    so the race picks the largest U. Step 1: u = (1, 0, 0, -200) -> q = (e, 1, 1, 0) / (e + 2): e^-200
    underflows FP32 and rank 3 leaves the support. U_v = U(seed, F + i, 1, v) from the plain-Python
    Philox; winner = argmax q_v / E_v with E_v = -ln U_v; margin = log-ratio of the best two."""
    seed, front = 2**32 + 5, 2**32 - 1  # the step-1 position carries into the high word
    kw = hand_walk(
        hidden=bf(np.ones((1, 2, 2))),
        scores=storage([[[0, 0, 0, 0], [1, 0, 0, -200]]], "fp32"),
        ids=np.array([[[1, 2, 3, 4], [5, 6, 3, 4]]], np.int32),
        w_pred=bf(np.zeros((8, 2))),
        temperature=np.ones(1, np.float32),
        seed=np.array([seed], np.uint64),
        frontier=np.array([front], np.int64),
    )
    out = candidate_selector(**kw)
    e = math.e
    for i, q in enumerate([[0.25] * 4, [e / (e + 2), 1 / (e + 2), 1 / (e + 2)]]):
        score = [math.log(qv) - math.log(-math.log(uniform_py(seed, front + i, v))) for v, qv in enumerate(q)]
        best = max(range(len(q)), key=lambda v: score[v])
        runner = max(s for v, s in enumerate(score) if v != best)
        assert out["path"][0, i] == best
        # q is FP32 in the reference (relative error <= 2^-24): the log-ratio moves by <= 2 * 2^-24
        assert abs(out["path.margin"][0, i] - (score[best] - runner)) <= 2 * 2.0**-24 + 1e-12
    np.testing.assert_array_equal(out["q"][0, 0], [0.25] * 4)
    assert out["q"][0, 1, 3] == 0.0


# -- brute force and properties -------------------------------------------------------------------


def e_matrices(kw):
    """Every E_i[p, c] by explicit loops (all predecessor rows, not only the walked one)."""
    hidden, w_hidden = f64(kw["hidden"]), f64(kw["w_hidden"])
    w_pred, w_succ, u = f64(kw["w_pred"]), f64(kw["w_succ"]), f64(kw["scores"])
    ids, anchor = kw["ids"], kw["anchor"]
    nb, nk, top = ids.shape
    r = w_hidden.shape[0]
    g = numerics.to_bf16(
        [
            [
                [sum(w_hidden[a, c] * hidden[b, i, c] for c in range(hidden.shape[2])) for a in range(r)]
                for i in range(nk)
            ]
            for b in range(nb)
        ]
    )
    e = np.zeros((nb, nk, top, top))
    for b in range(nb):
        for i in range(nk):
            for p in range(top):
                pred = anchor[b] if i == 0 else ids[b, i - 1, p]
                for c in range(top):
                    pair = sum(w_pred[pred, a] * g[b, i, a] * w_succ[ids[b, i, c], a] for a in range(r))
                    e[b, i, p, c] = u[b, i, c] + pair
    return e


def random_kw(seed, b=2, k=3, h=8, r=4, vr=32, top=5, temperature=0.0):
    rng = np.random.default_rng(seed)
    return {
        "hidden": bf(rng.standard_normal((b, k, h))),
        "scores": storage(rng.standard_normal((b, k, top)), "fp32"),
        "ids": np.stack([rng.choice(vr, top, replace=False) for _ in range(b * k)]).reshape(b, k, top).astype(np.int32),
        "anchor": rng.integers(0, vr, b).astype(np.int32),
        "w_hidden": bf(rng.standard_normal((r, h)) / np.sqrt(h)),
        "w_pred": bf(rng.standard_normal((vr, r))),
        "w_succ": bf(rng.standard_normal((vr, r))),
        "temperature": np.broadcast_to(np.asarray(temperature, np.float32), (b,)).copy(),
        "seed": rng.integers(0, 2**64 - 1, b, dtype=np.uint64, endpoint=True),
        "frontier": rng.integers(0, 2**40, b).astype(np.int64),
    }


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_greedy_walk_equals_brute_force(seed):
    """Walk the explicit E matrices row j_(i-1) by row: same path, same margins (the sums are
    of BF16 products with few terms: float64 errors ~1e-15, far below the clear margins kept)."""
    kw = random_kw(seed)
    out = candidate_selector(**kw)
    e = e_matrices(kw)
    for b in range(e.shape[0]):
        row = 0  # for i = 0 every row is the anchor's
        for i in range(e.shape[1]):
            vals = e[b, i, row]
            j = int(np.flatnonzero(vals == vals.max())[0])
            second = np.max(np.delete(vals, j))
            assert out["path"][b, i] == j
            assert abs(out["path.margin"][b, i] - (vals[j] - second)) <= 1e-12 * (1 + abs(vals).max())
            assert out["tokens"][b, i] == kw["ids"][b, i, j]
            row = j


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([0.05, 1.0, 50.0]))
def test_sampled_q_is_softmax_of_walked_row(seed, t):
    """q_i = FP32(softmax(E_i[j_(i-1), :] / T)) with E from the explicit matrices: one FP32 rounding of
    a float64 value that carries ~1e-15 relative error, so they agree within one FP32 ulp."""
    kw = random_kw(seed, temperature=t)
    out = candidate_selector(**kw)
    e = e_matrices(kw)
    t = float(np.float32(t))  # the stored temperature is FP32: 0.05 is 0.0500000007...
    for b in range(e.shape[0]):
        row = 0
        for i in range(e.shape[1]):
            x = e[b, i, row] / t
            p = np.exp(x - x.max())
            p /= p.sum()
            np.testing.assert_allclose(out["q"][b, i], p, rtol=2.0**-23, atol=2.0**-149)
            row = int(out["path"][b, i])


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1), st.permutations(range(4)))
def test_permuting_batch_rows_permutes_results(seed, perm):
    """The key is (seed, F + i, purpose, rank): the batch row never enters, so a permuted batch
    gives the permuted results bit for bit (mixed greedy and sampled rows)."""
    kw = random_kw(seed, b=4, k=4, temperature=[0.0, 0.05, 1.0, 50.0])
    shared = ("w_hidden", "w_pred", "w_succ")
    moved = {k: (v if k in shared else v[list(perm)]) for k, v in kw.items()}
    out, out_moved = candidate_selector(**kw), candidate_selector(**moved)
    for name, v in out.items():
        np.testing.assert_array_equal(out_moved[name], v[list(perm)], err_msg=name)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([0.05, 1.0, 50.0]))
def test_q_rows_sum_to_one(seed, t):
    """Reference: each q_c is the float64 softmax (relative error ~k 2^-53) rounded once to FP32
    (relative 2^-24, or 2^-150 absolute below the normal range): |sum - 1| <= 2^-24 + 2^-40.
    Baseline (FP32 softmax): exp within ~1 ulp, a 16-term FP32 sum within 16 ulps, a division within
    half an ulp, then an exact represent: |sum - 1| <= 20 * 2^-24."""
    kw = random_kw(seed, b=2, k=4, top=16, temperature=t)
    q = candidate_selector(**kw)["q"]
    assert np.all(np.abs(q.sum(-1) - 1) <= 2.0**-24 + 2.0**-40)
    with precision.baseline():
        qb = candidate_selector(**kw)["q"]
    assert np.all(np.abs(f64(qb).sum(-1) - 1) <= 20 * 2.0**-24)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_tiny_temperature_samples_the_argmax(seed):
    """With E gaps >= 40 T on the walked rows, the argmax wins every race: log q_best - log q_other
    >= 40, while log E ranges over [log(-ln(1 - 2^-24)), log(-ln 2^-24)] = [-16.6, 2.8], at most 19.4
    apart. Sampling then walks the greedy path, with q one-hot up to FP32 underflow."""
    kw = random_kw(seed)
    greedy = candidate_selector(**kw)
    t = float(greedy["path.margin"].min()) / 40
    sampled = candidate_selector(**{**kw, "temperature": np.full(2, t, np.float32)})
    np.testing.assert_array_equal(sampled["path"], greedy["path"])
    assert np.all(sampled["path.margin"] > 40 - 19.4 - 1e-6)


# -- cases ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def generated():
    return cases.generate()


def bounds(case):
    """C2 bounds from the float32 baseline: 2x max ULP + 1 per represented output; 2x the
    largest margin error for decisions."""
    ref = candidate_selector(**case.kwargs())
    with precision.baseline(cases.SPEC.bf16_intermediates):
        base = candidate_selector(**case.kwargs())
    b = {
        o.name: 2 * numerics.ulp_error(base[o.name], ref[o.name], o.fmt).max() + 1 for o in cases.SPEC.outputs if o.fmt
    }
    m = ref["path.margin"]
    fin = np.isfinite(m)
    b["margin"] = 2 * float(np.abs(base["path.margin"][fin] - m[fin]).max(initial=0.0))
    return ref, b


@pytest.fixture(scope="module")
def refs(generated):
    return {c.id: bounds(c) for c in generated}


def test_generator_deterministic_and_ids_unique(generated):
    again = cases.generate()
    ids = [c.id for c in generated]
    assert len(set(ids)) == len(ids) and ids == [c.id for c in again]
    for c, d in zip(generated, again):
        for k in c.inputs:
            assert c.inputs[k].dtype == d.inputs[k].dtype and c.inputs[k].tobytes() == d.inputs[k].tobytes()


def test_cases_sweep_and_dtypes(generated):
    assert 10 <= len(generated) <= 60
    dtypes = {
        "hidden": "bfloat16",
        "w_hidden": "bfloat16",
        "w_pred": "bfloat16",
        "w_succ": "bfloat16",
        "scores": "float32",
        "temperature": "float32",
        "ids": "int32",
        "anchor": "int32",
        "seed": "uint64",
        "frontier": "int64",
    }
    temps, seeds, fronts = set(), set(), []
    for c in generated:
        assert set(c.inputs) == set(cases.SPEC.inputs)
        assert {k: str(v.dtype) for k, v in c.inputs.items()} == dtypes
        assert c.inputs["w_pred"].shape[0] <= 512 and c.inputs["w_pred"].shape[1] <= 64
        assert c.inputs["hidden"].shape[2] <= 128
        for pit in {"rng_batch_row", "selector_predecessor_row"} & set(c.flags):
            assert pit in c.id
        temps |= set(c.inputs["temperature"].tolist())
        seeds |= {int(s) for s in c.inputs["seed"]}
        k = c.inputs["ids"].shape[1]
        fronts += [(int(f), k) for f in c.inputs["frontier"]]
    assert any(t <= 0 for t in temps) and {float(np.float32(0.05)), 1.0, 50.0} <= temps
    assert {0, 2**32 - 1, 2**32, 2**64 - 1} <= seeds
    assert (2**32 - 2, 4) in fronts
    flags = {f for c in generated for f in c.flags}
    assert {"rng_key", "positions_2p32", "exact_tie", "rng_batch_row", "selector_predecessor_row"} <= flags


def test_budget(generated):
    total = 0
    for c in generated:
        total += sum(v.nbytes for v in c.inputs.values())
        total += sum(np.asarray(v).nbytes for v in candidate_selector(**c.kwargs()).values())
    assert total <= 3 * 2**19  # 1.5 MB of the 4 MB shared by this owner's three Ops


def test_decisions_clear_or_exact_ties(generated, refs):
    for c in generated:
        ref, b = refs[c.id]
        m = ref["path.margin"]
        assert np.all((m == 0) | (m > 50 * b["margin"])), c.id
        assert np.all((m == 0) | (m >= 1e-3)), c.id
        assert np.any(m == 0) == ("exact_tie" in c.flags), c.id


def test_planted_path_case(generated):
    c = next(c for c in generated if "planted_path" in c.id)
    out = candidate_selector(**c.kwargs())
    np.testing.assert_array_equal(out["path"], [[5, 11, 2]])
    assert np.all(out["path.margin"] > 1.0)
    # the unary argmax path is (0, 0, 0), and from the unary predecessor the walk would not follow
    u = c.inputs["scores"].astype(np.float64)
    assert np.all(np.argmax(u, -1) == 0)
    forced = candidate_selector(**c.kwargs(), forced_path=np.zeros((1, 3), np.int32))
    assert forced["path"][0, 1] != 11


def test_shared_request_rows_agree_and_permuted_case_matches(generated):
    by_id = {c.id: c for c in generated}
    base = by_id["candidate_selector/rng_batch_row__rows_0_2_one_request"]
    perm = by_id["candidate_selector/rng_batch_row__permuted"]
    out, out_p = candidate_selector(**base.kwargs()), candidate_selector(**perm.kwargs())
    for name, v in out.items():
        np.testing.assert_array_equal(v[0], v[2], err_msg=name)
        np.testing.assert_array_equal(out_p[name], v[[3, 2, 0, 1]], err_msg=name)
    assert not np.array_equal(out["path"][0], out["path"][1])  # same seed, different inputs


# -- pitfall cases: buggy variants fail ----------------------------------------------------------


def variant(kw, *, key="ok", pred="sampled", tie="lowest_rank"):
    """The walk re-implemented from the explicit E matrices, with one bug switched on.
    key: "ok"; "row" (seed + batch row); "stream" (one generator for the batch: row 0's seed, a
    running draw counter); "seed32" / "pos32" (seed or position truncated to 32 bits).
    pred: "sampled" or "argmax" (next row from the argmax, not the sample).
    tie: "lowest_rank", "highest_rank" or "lowest_id" for greedy ties."""
    e = e_matrices(kw)
    ids = kw["ids"]
    nb, nk, top = ids.shape
    path, q = np.zeros((nb, nk), np.int64), np.zeros((nb, nk, top))
    draws = 0
    for b in range(nb):
        t = float(kw["temperature"][b])
        row = 0
        for i in range(nk):
            vals = e[b, i, row]
            best = np.flatnonzero(vals == vals.max())
            arg = {"lowest_rank": best[0], "highest_rank": best[-1], "lowest_id": best[np.argmin(ids[b, i, best])]}[tie]
            if t <= 0:
                j = int(arg)
                q[b, i, j] = 1
            else:
                x = vals / t
                p = numerics.to_fp32(np.exp(x - x.max()) / np.exp(x - x.max()).sum())
                seed, pos = int(kw["seed"][b]), int(kw["frontier"][b]) + i
                if key == "row":
                    seed += b
                elif key == "seed32":
                    seed &= U32
                elif key == "pos32":
                    pos &= U32
                elif key == "stream":
                    seed, pos = int(kw["seed"][0]), draws
                    draws += 1
                u = uniform(np.uint64(seed), pos, Purpose.DFLASH2_PROPOSAL, np.arange(top))
                with np.errstate(divide="ignore"):
                    j = int(np.argmax(np.where(p > 0, np.log(p) - np.log(-np.log(u)), -np.inf)))
                q[b, i] = p
            path[b, i] = j
            row = int(arg) if pred == "argmax" else j
    return {"path": path, "q": q, "tokens": np.take_along_axis(ids, path[..., None], -1)[..., 0]}


def fails(case, out, refs) -> bool:
    """The harness's view (C2) with teacher forcing: compare against the reference walked along the
    implementation's path; a decision differing with margin 0 (C4 decides) or margin > the bound
    fails, and so does q beyond its ULP bound."""
    _, b = refs[case.id]
    forced = candidate_selector(**case.kwargs(), forced_path=np.asarray(out["path"]))
    m = forced["path.margin"]
    differ = out["path"] != forced["path"]
    if np.any(differ & ((m == 0) | (m > b["margin"]))):
        return True
    return bool(numerics.ulp_error(out["q"], forced["q"], "fp32").max() > b["q"])


def test_variant_without_bug_passes_every_case(generated, refs):
    """The re-implementation itself is a twin of the reference: it passes every case."""
    for c in generated:
        assert not fails(c, variant(c.kwargs()), refs), c.id


@pytest.mark.parametrize(
    ("flag", "bug"),
    [
        ("rng_batch_row", {"key": "row"}),
        ("rng_batch_row", {"key": "stream"}),
        ("rng_key", {"key": "seed32"}),
        ("positions_2p32", {"key": "pos32"}),
        ("selector_predecessor_row", {"pred": "argmax"}),
        ("exact_tie", {"tie": "highest_rank"}),
        ("exact_tie", {"tie": "lowest_id"}),
    ],
)
def test_pitfall_cases_fail_their_bug(generated, refs, flag, bug):
    """Every case with the flag fails, except that a 32-bit seed or position only shows where the
    high word is nonzero: there the case must fail."""
    targeted = [c for c in generated if flag in c.flags]
    assert targeted
    for c in targeted:
        kw = c.kwargs()
        if bug.get("key") == "seed32" and all(int(s) <= U32 for s in kw["seed"]):
            continue
        if bug.get("key") == "pos32" and all(int(f) + kw["ids"].shape[1] <= 2**32 for f in kw["frontier"]):
            continue
        assert fails(c, variant(kw, **bug), refs), (c.id, bug)


def test_predecessor_bug_fails_on_q_beyond_bound(generated, refs):
    """The argmax-row walk keeps the sampled tokens until it reads a different row; its q there sits
    orders of magnitude beyond the ULP bound (a different softmax row, not a rounding)."""
    c = next(c for c in generated if "selector_predecessor_row" in c.flags)
    out = variant(c.kwargs(), pred="argmax")
    ref, b = refs[c.id]
    agree = np.cumprod(out["path"] == ref["path"], axis=1).astype(bool)
    same_before = np.concatenate([np.ones_like(agree[:, :1]), agree[:, :-1]], axis=1)  # steps < i agree
    worst = numerics.ulp_error(out["q"], ref["q"], "fp32").max(axis=-1)[same_before].max()
    assert worst > 1000 * b["q"]
