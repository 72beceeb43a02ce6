"""Comparison classes and results (CONTRACTS C2), on hand-made arrays."""

from __future__ import annotations

import numpy as np
import pytest

from conformance.compare import Result, _downstream, compare
from conformance.registry import DECISION, EXACT, REPRESENTED, Output

Y = {"y": Output("y", REPRESENTED, "bf16")}
BOUND_Y = {"y": {"bound_ulp": 2.0, "bound_norm": 0.01}}


def _y(got, ref=(1.0, 2.0, 4.0, 8.0), masks=None, bound=None):
    return compare(Y, {"y": np.array(ref)}, {"y": np.array(got)}, masks or {}, bound or BOUND_Y)


def test_worst_result_wins_in_the_contract_order():
    assert max(Result.NOT_IMPLEMENTED, Result.PASS) == Result.PASS
    assert Result.PASS < Result.ACCEPTABLE < Result.FAIL < Result.ERROR
    assert [r.failed for r in Result] == [False, False, False, True, True]


def test_represented_at_the_bound_passes_and_past_it_fails():
    # BF16 spacing at 1.0 is 2**-7: two ulps are allowed, three are not
    at = _y([1.0 + 2 * 2.0**-7, 2.0, 4.0, 8.0])
    assert at.result == Result.PASS and at.numbers["worst_ulp"] == 2.0
    past = _y([1.0 + 3 * 2.0**-7, 2.0, 4.0, 8.0])
    assert past.result == Result.FAIL
    assert past.detail.startswith("y: max 3.0 ulp (bound 2.0) at [0]; normwise")


def test_normwise_bound_fails_on_its_own():
    # one ulp everywhere: within 2 ulps, but 2**-7 relative overall exceeds 0.001
    r = _y([1 + 2.0**-7, 2 + 2.0**-6, 4 + 2.0**-5, 8 + 2.0**-4],
           bound={"y": {"bound_ulp": 2.0, "bound_norm": 0.001}})
    assert r.result == Result.FAIL and r.numbers["worst_ulp"] == 1.0
    assert "normwise 0.0078 (bound 0.001)" in r.detail


def test_nan_where_reference_is_finite_fails_and_matching_inf_passes():
    assert _y([1.0, np.nan, 4.0, 8.0]).result == Result.FAIL
    assert _y([1.0, 2.0, np.inf, 8.0], ref=(1.0, 2.0, np.inf, 8.0)).result == Result.PASS
    assert _y([1.0, 2.0, -np.inf, 8.0], ref=(1.0, 2.0, np.inf, 8.0)).result == Result.FAIL


def test_masked_out_elements_are_not_compared():
    masks = {"y": np.array([True, True, True, False])}
    assert _y([1.0, 2.0, 4.0, np.nan], masks=masks).result == Result.PASS
    assert _y([1.0, 2.0, 4.0, np.nan]).result == Result.FAIL


def test_exact_outputs_must_be_equal():
    outs = {"n": Output("n", EXACT)}
    ok = compare(outs, {"n": np.array([3, 4])}, {"n": np.array([3, 4], np.int32)}, {}, {})
    assert ok.result == Result.PASS
    bad = compare(outs, {"n": np.array([3, 4])}, {"n": np.array([3, 5])}, {}, {})
    assert bad.result == Result.FAIL and bad.detail == "n: 1 of 2 differ, first at [1] (got 5, expected 4)"


D = {"d": Output("d", DECISION)}


def _d(got, margin, margin_err=0.0, scale=None, envelope_k=None):
    ref = {"d": np.array([1, 2]), "d.margin": np.array(margin, float)}
    if scale is not None:
        ref["d.scale"] = np.array(scale, float)
    bound = {"margin_err": margin_err, **({} if envelope_k is None else {"envelope_k": envelope_k})}
    return compare(D, ref, {"d": np.array(got)}, {}, {"d": bound})


def test_decision_divergence_inside_the_tolerance_is_acceptable():
    r = _d([1, 3], [5.0, 1e-3], margin_err=1e-3)
    assert r.result == Result.ACCEPTABLE
    assert "d: ambiguous: 1 acceptable divergence(s), first at [1] (got 3, expected 2; margin 0.001 <= tol 0.002)" \
        in r.detail
    assert r.flags == ("ambiguous",)


def test_decision_divergence_outside_the_tolerance_fails():
    r = _d([1, 3], [5.0, 1e-2], margin_err=1e-3)
    assert r.result == Result.FAIL and "margin 0.01 > tol 0.002" in r.detail


def test_exact_tie_is_decided_by_the_tie_rule_not_acceptable():
    r = _d([1, 3], [5.0, 0.0], margin_err=1.0)
    assert r.result == Result.FAIL and "exact tie" in r.detail


def test_tolerance_floor_is_the_envelope_of_the_scores():
    # margin_err 0: the envelope of the competing scores alone decides (C2 v2):
    # envelope_k * 2**-24 * scale = 8 * 2**-24 * 1024 = 2**-11
    assert _d([1, 3], [5.0, 2.0**-11], scale=[1024.0, 1024.0], envelope_k=8).result == Result.ACCEPTABLE
    assert _d([1, 3], [5.0, 2.0**-10], scale=[1024.0, 1024.0], envelope_k=8).result == Result.FAIL
    # one unit roundoff of the scale when no k is stored: 2**-14
    assert _d([1, 3], [5.0, 2.0**-14], scale=[1024.0, 1024.0]).result == Result.ACCEPTABLE
    assert _d([1, 3], [5.0, 2.0**-13], scale=[1024.0, 1024.0]).result == Result.FAIL
    # without a scale the floor is the spacing at the margin itself: far smaller
    assert _d([1, 3], [5.0, 2.0**-13]).result == Result.FAIL


def test_downstream_by_shape():
    assert _downstream((2, 4), (1, 2), (2, 4, 3), same=False) == (1, slice(3, None))
    assert _downstream((2, 4), (1, 2), (2, 4), same=True) == (1, slice(3, None))
    assert _downstream((2, 4), (1, 2), (2,), same=False) == (1, ...)
    assert _downstream((2, 4), (1, 2), (3, 5), same=False) is None
    assert _downstream((3,), (1,), (3, 7), same=False) == (1, ...)
    assert _downstream((3,), (1,), (3,), same=True) is None
    assert _downstream((), (), (5,), same=False) == (...,)


CHAIN = {"d": Output("d", DECISION), "q": Output("q", REPRESENTED, "fp32"), "n": Output("n", EXACT)}


def _chain_ref():
    return {"d": np.array([[1, 2, 3]]), "d.margin": np.array([[5.0, 1e-6, 5.0]]), "q": np.array([[1.0, 2.0, 4.0]]),
            "n": np.array([6])}


def test_without_force_the_row_after_an_acceptable_divergence_is_not_compared():
    impl = {"d": np.array([[1, 0, 9]]), "q": np.array([[1.0, 2.0, 99.0]]), "n": np.array([10])}
    bnd = {"d": {"margin_err": 1e-6}, "q": {"bound_ulp": 1.0, "bound_norm": 1e-6}}
    r = compare(CHAIN, _chain_ref(), impl, {}, bnd)
    assert r.result == Result.ACCEPTABLE
    assert "not compared downstream of d [0, 1] (the Op has no force)" in r.detail


def test_with_force_everything_is_compared_with_the_forced_reference():
    impl = {"d": np.array([[1, 0, 9]]), "q": np.array([[1.0, 2.0, 99.0]]), "n": np.array([10])}
    bnd = {"d": {"margin_err": 1e-6}, "q": {"bound_ulp": 1.0, "bound_norm": 1e-6}}
    seen = []

    def force(kwargs, outputs):
        seen.append((kwargs, outputs["d"].tolist()))
        return {"d": np.array([[1, 2, 9]]), "d.margin": np.array([[5.0, 1e-6, 5.0]]),
                "q": np.array([[1.0, 2.0, 99.0]]), "n": np.array([10])}

    r = compare(CHAIN, _chain_ref(), impl, {}, bnd, force, lambda: {"k": 1})
    assert seen == [({"k": 1}, [[1, 0, 9]])]
    assert r.result == Result.ACCEPTABLE and "teacher-forced after d [0, 1]" in r.detail
    # a bug after the divergence that the forced reference does not share now fails
    bug = {**impl, "q": np.array([[1.0, 2.0, 98.0]])}
    assert compare(CHAIN, _chain_ref(), bug, {}, bnd, force, dict).result == Result.FAIL


def test_a_force_that_raises_is_an_error():
    impl = {"d": np.array([[1, 0, 3]]), "q": np.array([[1.0, 2.0, 4.0]]), "n": np.array([6])}

    def force(kwargs, outputs):
        raise IndexError("token 0 out of range\nmore")

    r = compare(CHAIN, _chain_ref(), impl, {}, {"d": {"margin_err": 1e-6}, "q": {"bound_ulp": 1, "bound_norm": 1}},
                force, dict)
    assert r.result == Result.ERROR and r.detail == "teacher forcing failed: IndexError: token 0 out of range"


@pytest.mark.parametrize("margin", [np.inf, 3.0])
def test_a_clear_divergence_is_not_followed_by_force(margin):
    ref = {**_chain_ref(), "d.margin": np.array([[5.0, margin, 5.0]])}
    impl = {"d": np.array([[1, 0, 3]]), "q": np.array([[1.0, 2.0, 4.0]]), "n": np.array([6])}

    def force(kwargs, outputs):
        raise AssertionError("only acceptable divergences are followed")

    r = compare(CHAIN, ref, impl, {}, {"d": {"margin_err": 1e-6}, "q": {"bound_ulp": 1, "bound_norm": 1}}, force, dict)
    # judged where it diverged, and nothing downstream is hidden by an unacceptable divergence
    assert r.result == Result.FAIL and r.detail.startswith("d:") and "not compared" not in r.detail
