"""The diagnosis of engines written outside the catalog (tests/diagnosis/engines.py): a catalogued
bug in an engine that rounds its own way is still named; a bug outside every family gets an error
structure or nothing, never a pitfall's name."""

from __future__ import annotations

from pathlib import Path

from conformance import mutants
from conformance.compare import Result
from conformance.diagnose import Diagnoser, hypotheses, summary
from conformance.runner import run_suite
from tests.diagnosis.engines import ReversedTopk, ScaledAttention, TorchSortTopk, WindowLeS

VECTORS = Path(__file__).parents[2] / "vectors"


def _fails(impl, op, diagnose=True):
    results = run_suite(impl, VECTORS, ops_pattern=op, diagnose=diagnose)
    summary(results)  # the run is over: run-level ranking and symptoms
    return [r for r in results if r.result == Result.FAIL]


def test_nan_first_torch_topk_is_named():
    """torch.sort(descending) ranks NaN first, +inf included: on both NaN cases the first hypothesis
    is a match with the NaN-ordering family's variant that orders NaN that way, with its evidence."""
    failing = _fails(TorchSortTopk(), "candidate_topk")
    assert sorted(r.case for r in failing) == ["candidate_topk/nan_order__nan_rows_below_inf_rows_Vr48_K2",
                                              "candidate_topk/nan_scores__inf_hidden_times_zero_head_Vr32_K2"]
    nan_family = {m.pitfall for m in mutants.MUTANTS if m.family == "nan_order"}
    for r in failing:
        top = hypotheses(r)[0]
        assert top["pitfall"] in nan_family and top["kind"] == "match", hypotheses(r)
        assert top["mutant"] == "nan_order-greatest", top
        assert top["evidence"] and 0 < top["confidence"] <= 1
        assert top["pitfall"] in r.diagnosis_note


def test_window_le_s_engine_is_named_first_on_every_fail():
    """An off-by-one window in an independent engine: named window_le_S first on every FAIL. On
    tail_extent..._live1 the dropped window gives the same outputs; the run decides between them."""
    failing = _fails(WindowLeS(), "draft_attention")
    assert len(failing) >= 30
    wrong = [f"{r.case}: {r.diagnosis_note}" for r in failing if r.diagnosis[0]["pitfall"] != "window_le_S"]
    assert not wrong, "\n".join(wrong)
    assert all(hypotheses(r)[0]["pitfall"] == "window_le_S" for r in failing)


def test_a_tie_on_one_case_goes_to_the_mutant_that_explains_the_run():
    """With window_dropped listed before window_le_S (a catalog order that named window_dropped on
    the tied case before), the run-level ranking still names window_le_S first there."""
    order = sorted(mutants.for_op("draft_attention"), key=lambda m: m.key != "window_dropped")
    failing = _fails(WindowLeS(), "draft_attention", diagnose=Diagnoser(catalog=order))
    tied = [r for r in failing if r.case.endswith("tail_extent__local_S8_F30_W16_live1")]
    assert tied and {x["mutant"] for x in tied[0].diagnosis if x["tie"]} >= {"window_le_S", "window_dropped"}
    assert all(r.diagnosis[0]["mutant"] == "window_le_S" for r in failing), \
        [(r.case, r.diagnosis_note) for r in failing if r.diagnosis[0]["mutant"] != "window_le_S"]


def test_bugs_outside_every_family_get_structure_not_a_pitfall():
    for impl, op, signature in ((ScaledAttention(), "draft_attention", "constant scale"),
                                (ReversedTopk(), "candidate_topk", "mirrored")):
        failing = _fails(impl, op)
        assert failing
        named = [r.case for r in failing if r.diagnosis or any(h.get("pitfall") or h.get("family") for h in hypotheses(r))]
        assert not named, f"{type(impl).__name__}: a pitfall named for a bug outside every family: {named}"
        shown = [r for r in failing if hypotheses(r) and hypotheses(r)[0].get("signature") == signature]
        assert len(shown) >= 0.9 * len(failing), [(r.case, hypotheses(r)[:1]) for r in failing]
        assert all("matches no catalog pitfall" in r.diagnosis_note for r in failing)
