"""A top-k that ranks NaN first, as torch.sort(descending=True) and torch.topk do, is named: the
diagnosis's first hypothesis is a match with the nan_order pitfall, also where the engine's
scores round differently from the mutant's (inside the envelope, outside the tight bound)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from conformance.compare import Result, _envelope_frac, _represented
from conformance.diagnose import hypotheses, summary
from conformance.registry import REPRESENTED, Output
from conformance.runner import run_suite
from tests.diagnosis.engines import TorchSortTopk

VECTORS = Path(__file__).parents[2] / "vectors"
NAN_CASES = ["candidate_topk/nan_order__nan_rows_below_inf_rows_Vr48_K2",
             "candidate_topk/nan_scores__inf_hidden_times_zero_head_Vr32_K2"]
# 3 ulp either way: past the suite's tight bound for FP32 scores (2 ulp), far inside the envelope;
# alternating signs, so the bias check sees no direction. The test checks both claims on the
# vectors: every case without NaN comes out ACCEPTABLE (not PASS, not FAIL) against the reference.
OFFSET_ULP = 3


class TorchSortTopkOwnRounding(TorchSortTopk):
    """The NaN-first top-k with scores off the float32 engine's by +-3 ulp (another accumulation order)."""

    def candidate_topk(self, **kw):
        out = super().candidate_topk(**kw)
        s = np.asarray(out["scores"], np.float32)
        sign = np.where(np.arange(s.shape[-1]) % 2 == 0, 1, -1).astype(np.float32)
        with np.errstate(all="ignore"):
            moved = (s + sign * np.float32(OFFSET_ULP) * np.spacing(np.abs(s))).astype(np.float32)
        return {**out, "scores": np.where(np.isfinite(s), moved, s)}


def _run(impl):
    results = run_suite(impl, VECTORS, ops_pattern="candidate_topk", diagnose=True)
    summary(results)  # the run is over: run-level ranking and symptoms
    return results


def _assert_named(results):
    failing = [r for r in results if r.result == Result.FAIL]
    assert sorted(r.case for r in failing) == NAN_CASES
    for r in failing:
        top = hypotheses(r)[0]
        assert top["kind"] == "match", hypotheses(r)
        assert top["pitfall"] == "nan_order" and top["family"] == "nan_order", top
        assert top["mutant"] == "nan_order-greatest", top
        assert r.diagnosis_note.startswith("matches pitfall `nan_order`"), r.diagnosis_note


def test_nan_first_topk_with_its_own_rounding_is_a_nan_order_match():
    results = _run(TorchSortTopkOwnRounding())
    others = {r.case: r.result for r in results if r.case not in NAN_CASES}
    assert others and all(v == Result.ACCEPTABLE for v in others.values()), others  # the rounding is legitimate
    _assert_named(results)


def test_nan_first_torch_topk_is_a_nan_order_match():
    pytest.importorskip("torch", reason="torch is not installed: examples/torch_engine needs it")
    from examples.torch_engine.planted import PLANTED

    _assert_named(_run(PLANTED["nan_order"]()))


def test_matching_nans_add_no_error_to_the_envelope():
    """NaN where the reference has NaN is equal (as the non-finite check has it): it must not make
    the envelope fraction infinite and turn a rounding outside the tight bound into a FAIL."""
    o = Output("scores", REPRESENTED, "fp32")
    r = np.array([[np.nan, 1.0, 2.0, -1.0]])
    x = r.copy()
    x[0, 1:] += np.array([3, -3, 3]) * np.spacing(np.abs(r[0, 1:]).astype(np.float32)).astype(np.float64)
    mask = np.ones(r.shape, bool)
    scale = np.full(r.shape, 4.0)
    env = {"k": 4.0, "n": 4.0}
    frac = _envelope_frac(x, r, mask, scale, env, o)[0]
    assert np.isfinite(frac) and frac < 1.0, frac
    v = _represented(o, r, x, mask, {"bound_ulp": 2.0, "bound_norm": 2.0**-24, "envelope": env}, scale)
    assert v.result == Result.ACCEPTABLE, v
