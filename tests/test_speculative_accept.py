"""speculative_accept (C3, C5, C6): scans forced by computed uniforms, an independent
scan (with planted bugs) over every golden case, batch-row and composition properties,
teacher forcing, and the generator."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.cases.speculative_accept import SAMPLING, accept_inputs, force, generate
from reference.rng import Purpose
from reference.speculative_accept import speculative_accept
from reference.target_distribution import target_distribution
from tests.casetools import U, race

F32_EPS = 2.0**-24
PITFALLS = ("rng_batch_row", "accept_p_q_swapped", "history_not_updated", "bonus_from_wrong_row", "residual_no_clamp")


def run(inputs, params, **kw):
    return speculative_accept(**inputs, **params, **kw)



def logits_of(p):
    """fp32 logits whose softmax is p (zeros become -1e4: exp underflows to exactly 0)."""
    p = np.asarray(p, dtype=np.float64)
    return np.where(p > 0, np.log(np.where(p > 0, p, 1)), -1e4).astype(np.float32)


def softmax32(z):
    z = np.asarray(z, dtype=np.float64)  # the stored fp32 logits, exactly
    e = np.exp(z - z.max())
    return e / e.sum()



# --- hand-derived scans --------------------------------------------------------------------


def test_greedy_mid_reject_tokens_and_margins():
    z = np.zeros((4, 5), np.float32)
    z[0, [2, 3]] = 3.0, 1.0  # argmax 2, lead 2
    z[1, 4] = 5.0  # argmax 4, lead 5
    z[2, [1, 3]] = 2.0, 0.5  # argmax 1; d = 3 trails it by 1.5
    z[3, 0] = 9.0  # never read
    out = run(*accept_inputs(z[None], [[2, 4, 3]], 3, 10, 1, temperature=0.0))
    assert out["accepted"].tolist() == [2] and out["num_out"].tolist() == [3]
    assert out["tokens"].tolist() == [[2, 4, 1, -1]]
    np.testing.assert_array_equal(out["tokens.margin"], [[2.0, 5.0, 1.5, np.inf]])
    np.testing.assert_array_equal(out["accepted.margin"], [1.5])


def test_greedy_bonus_from_row_P_not_K():
    z = np.zeros((4, 5), np.float32)
    z[0, 1] = z[1, 2] = 1.0
    z[2, 3] = 2.0  # row P = 2: the bonus
    z[3, 4] = 5.0  # row K = 3: outside the live extent
    out = run(*accept_inputs(z[None], [[1, 2, 0]], 2, 10, 1, temperature=0.0))
    assert out["tokens"].tolist() == [[1, 2, 3, -1]] and out["accepted"].tolist() == [2]


def test_greedy_history_grows_during_scan():
    # both rows prefer id 0 (4.0 vs 2.0); after accepting d_1 = 0 the repetition penalty 4
    # makes row 1's id 0 worth 1.0, so d_2 = 0 is rejected and corrected to id 1
    z = np.array([[4.0, 2.0, 0.0], [4.0, 2.0, 0.0]], np.float32)
    out = run(*accept_inputs(z[None], [[0]], 1, 10, 1, temperature=0.0, repetition_penalty=4.0))
    assert out["tokens"].tolist() == [[0, 1]]  # P = 1: the bonus from row 1 already sees d_1
    z3 = np.concatenate([z, z[:1]])
    out = run(*accept_inputs(z3[None], [[0, 0]], 2, 10, 1, temperature=0.0, repetition_penalty=4.0))
    assert out["tokens"].tolist() == [[0, 1, -1]] and out["accepted"].tolist() == [1]


def test_greedy_P0_is_argmax_of_row_0():
    z = np.array([[0.0, 3.0, 1.0], [9.0, 0.0, 0.0]], np.float32)
    out = run(*accept_inputs(z[None], [[0]], 0, 10, 1, temperature=-1.0))
    assert out["tokens"].tolist() == [[1, -1]] and out["num_out"].tolist() == [1]
    np.testing.assert_array_equal(out["accepted.margin"], [np.inf])


def test_sampled_one_hot_q_scan_forced_by_uniforms():
    seed, F = 12345, 1000
    u1, u2 = U(seed, F + 1, Purpose.ACCEPT), U(seed, F + 2, Purpose.ACCEPT)
    # step 0: p(d_1 = 1) halfway between U and 1 (accept); step 1: p(d_2 = 2) = U / 2 (reject)
    a, r = u1 + (1 - u1) / 2, u2 / 2
    rows = [[(1 - a) / 3, a, (1 - a) / 3, (1 - a) / 3], [(1 - r) / 3, (1 - r) / 3, r, (1 - r) / 3]]
    z = np.stack([logits_of(rows[0]), logits_of(rows[1]), logits_of([0.25] * 4)])
    out = run(*accept_inputs(z[None], [[1, 2]], 2, F, seed))
    p0, p1 = softmax32(z[0]), softmax32(z[1])
    # one-hot q: the residual is p_1 without d_2, so the correction is the race over ids 0, 1, 3
    want = race([p1[0], p1[1], 0.0, p1[3]], seed, F + 2, Purpose.CORRECTION)
    assert out["tokens"].tolist() == [[1, want, -1]] and out["accepted"].tolist() == [1]
    np.testing.assert_allclose(out["tokens.margin"][0, 0], p0[1] - u1, rtol=1e-12)
    np.testing.assert_allclose(out["accepted.margin"], [min(p0[1] - u1, u2 - p1[2])], rtol=1e-12)
    # the race margin is the log-ratio of the two best r / E scores
    scores = sorted((p1[v] / -math.log(U(seed, F + 2, Purpose.CORRECTION, v)) for v in (0, 1, 3)), reverse=True)
    np.testing.assert_allclose(out["tokens.margin"][0, 1], math.log(scores[0] / scores[1]), rtol=1e-9)


def test_sampled_retained_q_reject_uses_p_over_q_and_clamped_residual():
    seed, F = 99, 2**32 - 2  # the step sits at position 2^32 - 1, the bonus would be at 2^32
    u = U(seed, F + 1, Purpose.ACCEPT)
    # q over ids (0, 1, 2) = (0.6, 0.3, 0.1); p(0) = u * 0.6 / 2 rejects (p/q = u/2 < u);
    # p(1) = 0.35 > q(1), p(3) = rest: the clamped residual lives on ids 1 and 3 only
    p0 = u * 0.6 / 2
    p = [p0, 0.35, 0.05, 0.6 - p0]
    z = np.stack([logits_of(p), logits_of([0.25] * 4)])
    q = np.array([[[0.6, 0.3, 0.1]]], np.float32)
    out = run(*accept_inputs(z[None], [[0]], 1, F, seed, q=q, q_ids=[[[0, 1, 2]]]))
    ps = softmax32(z[0])
    qv = np.array([0.6, 0.3, 0.1, 0.0], np.float32).astype(np.float64)
    want = race(np.maximum(ps - qv, 0), seed, F + 1, Purpose.CORRECTION)
    assert want in (1, 3)
    assert out["tokens"].tolist() == [[want, -1]] and out["accepted"].tolist() == [0]
    np.testing.assert_allclose(out["accepted.margin"], [u * qv[0] - ps[0]], rtol=1e-9)


def test_sampled_accept_when_p_exceeds_q_whatever_U():
    # p(d) >= q(d): U < 1 always accepts; the bonus then comes from row 1 at F + 2 (BONUS)
    seed, F = 5, 40
    z = np.stack([logits_of([0.1, 0.7, 0.2]), logits_of([0.5, 0.25, 0.25])])
    q = np.array([[[0.6, 0.4]]], np.float32)
    out = run(*accept_inputs(z[None], [[1]], 1, F, seed, q=q, q_ids=[[[1, 2]]]))
    want = race(softmax32(z[1]), seed, F + 2, Purpose.BONUS)
    assert out["tokens"].tolist() == [[1, want]] and out["accepted"].tolist() == [1]


def test_residual_without_mass_draws_from_p():
    # q (unnormalized) covers p everywhere: q(0) = 0.9 >= p(0) = 0.5, q(1) = 0.6 >= p(1) = 0.5.
    # Search a seed whose accept U rejects clearly (U q(0) > p(0) + 0.05), then the correction
    # is the race over p itself, which may return d = 0 again.
    z = np.stack([logits_of([0.5, 0.5, 0.0]), logits_of([1 / 3] * 3)])
    q = np.array([[[0.9, 0.6, 0.0]]], np.float32)
    F = 70
    seed = next(s for s in range(1000) if U(s, F + 1, Purpose.ACCEPT) * 0.9 > 0.55)
    out = run(*accept_inputs(z[None], [[0]], 1, F, seed, q=q, q_ids=[[[0, 1, 2]]]))
    assert out["accepted"].tolist() == [0]
    assert out["tokens"].tolist() == [[race([0.5, 0.5, 0.0], seed, F + 1, Purpose.CORRECTION), -1]]


def test_exact_tie_rejects_with_margin_zero():
    # q(d) = 0 = p(d): U * 0 < 0 is false
    z = np.stack([logits_of([0.0, 0.5, 0.5]), logits_of([1 / 3] * 3)])
    q = np.array([[[1.0, 0.0]]], np.float32)
    out = run(*accept_inputs(z[None], [[0]], 1, 3, 3, q=q, q_ids=[[[1, 0]]]))
    assert out["accepted"].tolist() == [0] and out["accepted.margin"].tolist() == [0.0]
    assert out["tokens"][0, 0] == 2  # residual max(p - q, 0) = (0, 0, 0.5)


def test_P0_sampled_bonus_at_F_plus_1():
    seed, F = 2**64 - 1, 2**32 - 1
    z = np.stack([logits_of([0.2, 0.3, 0.5]), logits_of([1.0, 0, 0])])
    out = run(*accept_inputs(z[None], [[0]], 0, F, seed))
    assert out["tokens"].tolist() == [[race(softmax32(z[0]), seed, F + 1, Purpose.BONUS), -1]]


def test_q_without_q_ids_is_refused():
    inputs, params = accept_inputs(np.zeros((1, 2, 3)), [[0]], 1, 0, 0, q=np.ones((1, 1, 1)), q_ids=[[[0]]])
    del inputs["q_ids"]
    with pytest.raises(ValueError, match="q and q_ids"):
        run(inputs, params)


# --- an independent scan, with the planted bugs ---------------------------------------------


def _p_of(inputs, params, b, row, counts):
    one = {k: inputs[k][b : b + 1] for k in (*SAMPLING, "top_k")}
    return target_distribution(
        logits=inputs["logits"][b, row][None],
        prompt_mask=inputs["prompt_mask"][b][None],
        output_counts=counts[None],
        vocab_size=params["vocab_size"],
        **one,
    )["probs"][0]


def _mini_row(inputs, params, b, bug):
    W, V = inputs["logits"].shape[1:]
    seed = np.uint64(inputs["seed"][b])
    if bug == "rng_batch_row":
        seed = seed ^ np.uint64(b)
    if bug == "seed_32bit":
        seed = seed & np.uint64(0xFFFFFFFF)
    F, P = int(inputs["frontier"][b]), int(inputs["live_proposals"][b])
    pos = [(F + 1 + i) % 2**32 if bug == "positions_32bit" else F + 1 + i for i in range(P + 1)]
    counts = inputs["output_counts"][b].astype(np.int64).copy()
    greedy = inputs["temperature"][b] <= 0
    out = []
    for i in range(P):
        p, d = _p_of(inputs, params, b, i, counts), int(inputs["proposals"][b, i])
        qv = np.zeros(V)
        if "q" in inputs:
            np.add.at(qv, inputs["q_ids"][b, i], inputs["q"][b, i].astype(np.float64))
        else:
            qv[d] = 1.0
        if greedy:
            ok = int(np.argmax(p)) == d
        else:
            u = U(seed, pos[i], Purpose.ACCEPT)
            ok = u * p[d] < qv[d] if bug == "accept_p_q_swapped" else u * qv[d] < p[d]
        if ok:
            out.append(d)
            if bug != "history_not_updated":
                counts[d] += 1
            continue
        if greedy:
            return i, out + [int(np.argmax(p))]
        r = np.maximum(p - qv, 0)
        if bug == "residual_no_clamp":
            # C6's zero-mass test applied to the unclamped sum(p - q), which is 0 for normalized p, q
            empty = abs((p - qv).sum()) < 1e-6
        else:
            empty = r.sum() == 0
        return i, out + [race(p if empty else r, seed, pos[i], Purpose.CORRECTION)]
    p = _p_of(inputs, params, b, (W - 1) if bug == "bonus_from_wrong_row" else P, counts)
    return P, out + [int(np.argmax(p)) if greedy else race(p, seed, pos[P], Purpose.BONUS)]


def mini_scan(inputs, params, bug=None):
    """The spec's scan written out again: p_i from the target_distribution Op with the
    history counted here, uniforms and races from C3 as written. ``bug`` plants a pitfall."""
    B, W = inputs["logits"].shape[:2]
    tokens = np.full((B, W), -1)
    accepted = np.zeros(B, int)
    for b in range(B):
        accepted[b], out = _mini_row(inputs, params, b, bug)
        tokens[b, : len(out)] = out
    return accepted, tokens


CASES = generate()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_reference_agrees_with_independent_scan(case):
    out = speculative_accept(**case.kwargs())
    acc, tok = mini_scan(case.inputs, case.params)
    np.testing.assert_array_equal(out["accepted"], acc)
    np.testing.assert_array_equal(out["tokens"], tok)
    np.testing.assert_array_equal(out["num_out"], acc + 1)


def _bugs_of(case):
    bugs = [f for f in case.flags if f in PITFALLS]
    if "positions_2p32" in case.flags:
        bugs.append("positions_32bit")
    if "rng_key" in case.flags and np.any(case.inputs["seed"] >= np.uint64(2**32)):
        bugs.append("seed_32bit")
    return bugs


@pytest.mark.parametrize(
    "case,bug", [(c, b) for c in CASES for b in _bugs_of(c)], ids=lambda x: x if isinstance(x, str) else x.id
)
def test_pitfall_case_catches_its_bug(case, bug):
    out = speculative_accept(**case.kwargs())
    acc, tok = mini_scan(case.inputs, case.params, bug=bug)
    assert not (np.array_equal(out["accepted"], acc) and np.array_equal(out["tokens"], tok)), (
        f"{case.id}: the {bug} variant passes this case"
    )


def test_every_pitfall_has_a_case():
    flagged = {f for c in CASES for f in c.flags}
    assert set(PITFALLS) <= flagged
    for p in PITFALLS:
        assert any(p in c.id for c in CASES if p in c.flags), p


def test_generator_is_deterministic_with_unique_ids():
    again = generate()
    assert [c.id for c in again] == [c.id for c in CASES]
    assert len({c.id for c in CASES}) == len(CASES)
    for a, b in zip(CASES, again):
        assert a.inputs.keys() == b.inputs.keys() and a.params == b.params
        for k in a.inputs:
            assert a.inputs[k].dtype == b.inputs[k].dtype and a.inputs[k].tobytes() == b.inputs[k].tobytes()
    assert sum(v.nbytes for c in CASES for v in c.inputs.values()) < 1_500_000


def test_case_storage_dtypes():
    want = {"logits": np.float32, "proposals": np.int32, "live_proposals": np.int32, "q": np.float32,
            "q_ids": np.int32, "frontier": np.int64, "seed": np.uint64, "prompt_mask": np.uint8,
            "output_counts": np.int32, "top_k": np.int32, **{k: np.float32 for k in SAMPLING}}  # fmt: skip
    for c in CASES:
        for k, v in c.inputs.items():
            assert v.dtype == want[k], (c.id, k)


# --- properties ----------------------------------------------------------------------------


def _random_batch(rng, B, K, V, retained):
    logits = rng.standard_normal((B, K + 1, V)) * 2
    proposals = rng.integers(0, V, (B, K))
    # bias rows towards the proposals so scans run past step 0
    np.put_along_axis(logits[:, :K], proposals[..., None], 3.0, axis=-1)
    q = q_ids = None
    if retained:
        k = min(4, V)
        q_ids = np.stack([[rng.permutation(V)[:k] for _ in range(K)] for _ in range(B)])
        q_ids[..., 0] = proposals
        e = rng.random((B, K, k)) + 0.1
        q = e / e.sum(-1, keepdims=True)
    return accept_inputs(
        logits,
        proposals,
        rng.integers(0, K + 1, B),
        rng.integers(0, 2**33, B),
        rng.integers(0, 2**64, B, dtype=np.uint64),
        q=q,
        q_ids=q_ids,
        output_counts=rng.integers(0, 2, (B, V)),
        temperature=rng.choice([0.0, 0.7, 1.0], B),
        repetition_penalty=1.5,
        presence_penalty=0.5,
        top_k=rng.choice([0, 3], B),
    )


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(2, 5), st.booleans())
def test_permuting_rows_permutes_results(s, B, retained):
    rng = np.random.default_rng(s)
    inputs, params = _random_batch(rng, B, 3, 6, retained)
    perm = rng.permutation(B)
    out = run(inputs, params)
    pout = run({k: v[perm] for k, v in inputs.items()}, params)
    for k in ("accepted", "tokens", "num_out", "accepted.margin", "tokens.margin"):
        np.testing.assert_array_equal(pout[k], out[k][perm])


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32 - 1), st.booleans())
def test_scan_is_a_chain_of_single_steps(s, retained):
    """Step i of a P-proposal scan equals a 1-proposal scan on rows (i, i+1) at frontier F+i
    with d_1..d_i added to the history: positions, history and the bonus row line up."""
    rng = np.random.default_rng(s)
    inputs, params = _random_batch(rng, 1, 4, 6, retained)
    out = run(inputs, params)
    A, P = int(out["accepted"][0]), int(inputs["live_proposals"][0])
    for i in range(min(A + 1, P + 1)):
        step = dict(inputs)
        step["logits"] = inputs["logits"][:, i : i + 2] if i < P else inputs["logits"][:, i : i + 1]
        step["proposals"] = inputs["proposals"][:, i : i + 1]
        step["live_proposals"] = np.array([1 if i < P else 0], np.int32)
        step["frontier"] = inputs["frontier"] + i
        counts = inputs["output_counts"].copy()
        np.add.at(counts[0], inputs["proposals"][0, :i], 1)
        step["output_counts"] = counts
        if retained:
            step["q"], step["q_ids"] = inputs["q"][:, i : i + 1], inputs["q_ids"][:, i : i + 1]
        one = run(step, params)
        assert one["tokens"][0, 0] == out["tokens"][0, i]
        assert (int(one["accepted"][0]) == 1) == (i < A)


# --- teacher forcing -----------------------------------------------------------------------


def test_forcing_with_own_tokens_changes_nothing():
    for case in CASES:
        out = speculative_accept(**case.kwargs())
        forced = force(case.kwargs(), out)
        for k in out:
            np.testing.assert_array_equal(forced[k], out[k], err_msg=f"{case.id} {k}")


def _forcing_scene():
    # greedy: rows 0..2 prefer the proposal at steps 0 and 2, not at step 1
    z = np.zeros((4, 6), np.float32)
    z[0, 1] = 2.0
    z[1, [2, 4]] = 0.5, 0.6  # d_2 = 2 trails id 4 by 0.1: the reference rejects
    z[2, 3] = 2.0
    z[3, 5] = 2.0
    return accept_inputs(z[None], [[1, 2, 3]], 3, 50, 1, temperature=0.0)


def test_forcing_follows_an_extra_accept():
    inputs, params = _forcing_scene()
    assert run(inputs, params)["tokens"].tolist() == [[1, 4, -1, -1]]
    # the implementation accepted d_2 as well and rejected d_3 (correcting to 5)
    forced = run(inputs, params, forced_tokens=np.array([[1, 2, 5, -1]]))
    assert forced["num_out"].tolist() == [3]
    assert forced["accepted"].tolist() == [1]  # the reference's own first rejection
    # step 1 reports the own correction with its small margin; step 2 (history has 1, 2) its own accept of d_3
    assert forced["tokens"].tolist() == [[1, 4, 3, -1]]
    np.testing.assert_allclose(forced["tokens.margin"][0, 1], 0.1, rtol=1e-6)


def test_forcing_follows_an_early_stop():
    inputs, params = _forcing_scene()
    forced = run(inputs, params, forced_tokens=np.array([[0, -1, -1, -1]]))  # the implementation rejected d_1
    assert forced["num_out"].tolist() == [1]
    assert forced["tokens"].tolist() == [[1, -1, -1, -1]]  # own choice at step 0: accept d_1
    assert forced["accepted"].tolist() == [1]  # one past the path: the reference would have gone on
