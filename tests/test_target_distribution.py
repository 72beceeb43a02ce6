"""target_distribution (CONTRACTS C5): hand-derived rows and a brute-force twin."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from conformance.cases.target_distribution import GAP, boundary_distance, generate
from reference import precision
from reference.target_distribution import add_to_history, target_distribution

F32_EPS = 2.0**-24  # unit roundoff of fp32


def one(logits, vocab_size=None, prompt=(), counts=None, T=1.0, top_p=1.0, min_p=0.0, rho=1.0, f=0.0, r=0.0, top_k=0):
    """probs of a single row, built from plain Python values."""
    z = np.asarray([logits], dtype=np.float32)
    v = z.shape[1]
    pm = np.zeros((1, v), np.uint8)
    pm[0, list(prompt)] = 1
    oc = np.zeros((1, v), np.int32) if counts is None else np.asarray([counts], np.int32)

    def f32(x):
        return np.asarray([x], np.float32)

    return target_distribution(
        logits=z,
        prompt_mask=pm,
        output_counts=oc,
        temperature=f32(T),
        top_p=f32(top_p),
        min_p=f32(min_p),
        repetition_penalty=f32(rho),
        frequency_penalty=f32(f),
        presence_penalty=f32(r),
        top_k=np.asarray([top_k], np.int32),
        vocab_size=v if vocab_size is None else vocab_size,
    )["probs"][0]


LN = np.log  # logits as logs of the intended probabilities make the answers readable


def test_padded_rows_are_masked():
    # rows 3, 4 are padding: their huge logits must not take any mass
    p = one([0.0, LN(2), 0.0, 100.0, 100.0], vocab_size=3)
    np.testing.assert_allclose(p, [0.25, 0.5, 0.25, 0, 0], rtol=4 * F32_EPS)


def test_repetition_penalty_divides_positive_multiplies_negative():
    # prompt has id 0 (z 2 -> 1), output has id 1 (z -1 -> -2), id 2 unseen keeps 0
    p = one([2.0, -1.0, 0.0], prompt=[0], counts=[0, 1, 0], rho=2.0)
    e = np.exp([1.0, -2.0, 0.0])
    np.testing.assert_allclose(p, e / e.sum(), rtol=8 * F32_EPS)


def test_frequency_and_presence_read_output_history_only():
    # id 0 is only in the prompt: untouched; id 1 seen twice: 0 - 0.5*2 - 1 = -2
    p = one([0.0, 0.0, 0.0], prompt=[0], counts=[0, 2, 0], f=0.5, r=1.0)
    e = np.exp([0.0, -2.0, 0.0])
    np.testing.assert_allclose(p, e / e.sum(), rtol=8 * F32_EPS)


@pytest.mark.parametrize("T", [0.0, -1.0])
def test_greedy_is_one_hot_lowest_id_on_ties(T):
    np.testing.assert_array_equal(one([1.0, 3.0, 3.0, 2.0], T=T, top_k=1, top_p=0.1), [0, 1, 0, 0])


def test_greedy_decides_after_penalties():
    # repetition penalty 4 turns id 0's 4.0 into 1.0, below id 1's 2.0
    np.testing.assert_array_equal(one([4.0, 2.0], counts=[1, 0], rho=4.0, T=0.0), [0, 1])


def test_temperature_divides():
    p = one([0.0, 2.0], T=2.0)
    np.testing.assert_allclose(p, np.exp([0, 1]) / np.exp([0, 1]).sum(), rtol=8 * F32_EPS)


def test_top_k_ties_keep_the_lower_id():
    p = one([1.0, 2.0, 2.0, 2.0], top_k=2)
    np.testing.assert_allclose(p, [0, 0.5, 0.5, 0], rtol=4 * F32_EPS)


def test_top_p_keeps_shortest_prefix_reaching_mass():
    # probabilities 0.5, 0.3, 0.2: 0.5 < 0.75 <= 0.8, so two tokens stay
    p = one([LN(0.2), LN(0.5), LN(0.3)], top_p=0.75)
    np.testing.assert_allclose(p, [0, 0.625, 0.375], rtol=8 * F32_EPS)
    # a mass below the first token's keeps exactly one token (never none)
    np.testing.assert_array_equal(one([LN(0.2), LN(0.5), LN(0.3)], top_p=0.01), [0, 1, 0])


def test_top_p_measures_mass_after_top_k():
    # 0.4 0.3 0.2 0.1; top-k 2 renormalizes to 4/7, 3/7; 4/7 >= 0.5 keeps one token.
    # Measuring the un-renormalized 0.4 < 0.5 would keep two.
    p = one([LN(0.4), LN(0.3), LN(0.2), LN(0.1)], top_k=2, top_p=0.5)
    np.testing.assert_array_equal(p, [1, 0, 0, 0])


def test_min_p_drops_below_fraction_of_largest():
    # 0.5, 0.3, 0.2 with min_p 0.5: threshold 0.25 drops 0.2
    p = one([LN(0.5), LN(0.3), LN(0.2)], min_p=0.5)
    np.testing.assert_allclose(p, [0.625, 0.375, 0], rtol=8 * F32_EPS)


def test_filters_in_order_together():
    # 0.35 0.25 0.2 0.12 0.08, top-k 4 -> /0.92; top-p 0.7: 0.380, 0.652, 0.870 -> three stay;
    # min-p 0.6 of 0.35 = 0.21 drops 0.2 -> softmax over 0.35, 0.25
    p = one([LN(0.35), LN(0.25), LN(0.2), LN(0.12), LN(0.08)], top_k=4, top_p=0.7, min_p=0.6)
    np.testing.assert_allclose(p, [0.35 / 0.6, 0.25 / 0.6, 0, 0, 0], rtol=8 * F32_EPS)


def test_disabled_filters_give_plain_softmax():
    z = [0.3, -1.2, 2.0, 0.0]
    e = np.exp(z)
    for kw in ({"top_k": 0}, {"top_k": -3}, {"top_p": 1.0}, {"top_p": 1.5}, {"min_p": 0.0}, {"min_p": -1.0}):
        np.testing.assert_allclose(one(z, **kw), e / e.sum(), rtol=8 * F32_EPS, err_msg=str(kw))


def test_output_is_represented_fp32():
    p = one([0.1, 0.2, 0.3])
    np.testing.assert_array_equal(p, p.astype(np.float32).astype(np.float64))


def test_add_to_history_counts_repeats_and_copies():
    c = np.zeros(4, np.int32)
    out = add_to_history(c, [2, 2, 0])
    np.testing.assert_array_equal(out, [1, 0, 2, 0])
    np.testing.assert_array_equal(c, 0)


# --- a brute-force twin: sets defined by counting, not by sorting and cumsum ----------------


def brute(z, vocab, prompt, counts, T, top_k, top_p, min_p, rho, f, r):
    z = [float(x) for x in z]
    v = len(z)
    for i in range(v):
        if i >= vocab:
            z[i] = -math.inf
            continue
        if prompt[i] or counts[i] > 0:
            z[i] = z[i] / rho if z[i] > 0 else z[i] * rho
        z[i] -= f * counts[i] + r * (counts[i] > 0)
    if T <= 0:
        best = max(range(v), key=lambda i: (z[i], -i))
        return [1.0 if i == best else 0.0 for i in range(v)], None
    z = [x / T for x in z]
    # rank of i = how many tokens beat it in the C4 order
    rank = [sum(1 for j in range(v) if z[j] > z[i] or (z[j] == z[i] and j < i)) for i in range(v)]
    kept = [z[i] > -math.inf and (top_k <= 0 or rank[i] < top_k) for i in range(v)]
    near = []  # distances to a filter boundary: the test skips draws too close to call

    def probs(keep):
        m = max(z[i] for i in range(v) if keep[i])
        e = [math.exp(z[i] - m) if keep[i] else 0.0 for i in range(v)]
        s = sum(e)
        return [x / s for x in e]

    if top_p < 1:
        p = probs(kept)
        # i stays iff the mass strictly before it in the order is below top_p
        before = [sum(p[j] for j in range(v) if kept[j] and rank[j] < rank[i]) for i in range(v)]
        near += [abs(before[i] - top_p) for i in range(v) if kept[i]]
        kept = [kept[i] and before[i] < top_p for i in range(v)]
    if min_p > 0:
        p = probs(kept)
        pmax = max(p)
        near += [abs(p[i] - min_p * pmax) for i in range(v) if kept[i]]
        kept = [kept[i] and p[i] >= min_p * pmax for i in range(v)]
    return probs(kept), min(near, default=1.0)


row = st.integers(2, 12).flatmap(
    lambda v: st.tuples(
        st.lists(st.floats(-6, 6, width=32), min_size=v, max_size=v),
        st.integers(1, v),
        st.lists(st.booleans(), min_size=v, max_size=v),
        st.lists(st.integers(0, 3), min_size=v, max_size=v),
    )
)


@settings(max_examples=200, deadline=None)
@given(
    row,
    st.sampled_from([0.0, 0.5, 1.0, 1.7]),
    st.integers(-1, 6),
    st.sampled_from([1.0, 0.3, 0.6, 0.9, 0.99]),
    st.sampled_from([0.0, 0.05, 0.2, 0.5]),
    st.sampled_from([1.0, 1.3, 2.0]),
    st.sampled_from([0.0, 0.4]),
    st.sampled_from([0.0, 0.7]),
)
def test_matches_brute_force(rowdata, T, top_k, top_p, min_p, rho, f, r):
    z, vocab, prompt, counts = rowdata
    T32, top_p32, min_p32, rho32, f32, r32 = (float(np.float32(x)) for x in (T, top_p, min_p, rho, f, r))  # as stored
    want, near = brute(z, vocab, prompt, counts, T32, top_k, top_p32, min_p32, rho32, f32, r32)
    # the twin sums in a different order: decisions within 1e-9 of a boundary could flip
    assume(near is None or near > 1e-9)
    got = one(z, vocab, [i for i, x in enumerate(prompt) if x], counts, T, top_p, min_p, rho, f, r, top_k)
    # float64 pipeline, one fp32 rounding at the end: half an fp32 ulp relative, plus
    # exp/sum error of a few float64 ulps (negligible at this scale); 2 * F32_EPS bounds both
    np.testing.assert_allclose(got, want, rtol=2 * F32_EPS, atol=1e-300)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(-8, 8, width=32), min_size=2, max_size=32), st.sampled_from([0.5, 1.0, 2.0]))
def test_float32_baseline_close_to_float64(z, T):
    ref = one(z, T=T)
    with precision.baseline():
        base = one(z, T=T)
    # fp32 pipeline: z/T rounded (|z/T| <= 16, abs error 16 eps), exp of a difference (abs error ~ 2*16 eps
    # in the exponent -> relative 32 eps), sum of <= 32 terms (32 eps), division (eps), final rounding:
    # relative error <= (32 + 32 + 2) eps; 128 eps leaves a factor 2 for the terms not counted
    np.testing.assert_allclose(base, ref, rtol=128 * F32_EPS, atol=1e-30)


# --- the golden cases ---------------------------------------------------------------------

CASES = generate()


def test_generator_is_deterministic_with_unique_ids():
    again = generate()
    assert [c.id for c in again] == [c.id for c in CASES] and len({c.id for c in CASES}) == len(CASES)
    for a, b in zip(CASES, again):
        assert a.params == b.params
        for k in a.inputs:
            assert a.inputs[k].dtype == b.inputs[k].dtype and a.inputs[k].tobytes() == b.inputs[k].tobytes()
    assert 10 <= len(CASES) <= 60
    assert sum(v.nbytes for c in CASES for v in c.inputs.values()) < 500_000


@pytest.mark.parametrize("case", [c for c in CASES if "exact_tie" not in c.flags], ids=lambda c: c.id)
def test_case_decisions_are_clear_of_boundaries(case):
    # GAP = 1e-3 against fp32 errors of ~1e-6 in these units: no filter decision can flip in the baseline
    n = case.inputs["logits"].shape[0]
    assert min(boundary_distance(case.inputs, case.params, i) for i in range(n)) > GAP


def _buggy(case, bug):
    kw = dict(case.kwargs())
    if bug == "vocab_padding":
        kw["vocab_size"] = kw["logits"].shape[1]
    elif bug == "penalties_missing":
        kw["repetition_penalty"] = np.ones_like(kw["repetition_penalty"])
        kw["frequency_penalty"] = np.zeros_like(kw["frequency_penalty"])
        kw["presence_penalty"] = np.zeros_like(kw["presence_penalty"])
    elif bug == "min_p_missing":
        kw["min_p"] = np.zeros_like(kw["min_p"])
    elif bug == "exact_tie":
        # ties to the higher id: the same pipeline on the reversed vocabulary, reversed back
        for k in ("logits", "prompt_mask", "output_counts"):
            kw[k] = kw[k][:, ::-1].copy()
        return target_distribution(**kw)["probs"][:, ::-1]
    return target_distribution(**kw)["probs"]


@pytest.mark.parametrize(
    "case,bug",
    [
        (c, f)
        for c in CASES
        for f in c.flags
        if f in ("vocab_padding", "penalties_missing", "min_p_missing", "exact_tie")
    ],
    ids=lambda x: x if isinstance(x, str) else x.id,
)
def test_flagged_case_catches_its_bug(case, bug):
    ref = target_distribution(**case.kwargs())["probs"]
    # a difference of far more than the comparison bound (a few fp32 ulps): a whole token's mass moves
    assert np.abs(_buggy(case, bug) - ref).max() > 1e-3
