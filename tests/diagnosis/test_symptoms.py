"""Run-level symptoms: a flag carried by the failing cases of an Op far more often than by its
passing ones becomes a hypothesis (with both counts as evidence); a flag that says nothing does not."""

from __future__ import annotations

from conformance.compare import Result
from conformance.diagnose import Diagnosis, finalize, hypotheses
from conformance.diagnosis.symptoms import flag_symptoms
from conformance.runner import RunResult


def _r(case, result, flags):
    r = RunResult("op", case, result, flags=flags)
    if result == Result.FAIL:
        r.diagnosis, r.diagnosis_note = Diagnosis([], [], "op", flags), "matches no catalog pitfall"
    return r


def test_an_over_represented_flag_is_a_symptom_with_its_counts():
    results = ([_r(f"edge{i}", Result.FAIL, ("window_edge", "common")) for i in range(4)]
               + [_r(f"mid{i}", Result.PASS, ("common",)) for i in range(6)]
               + [_r("edge_pass", Result.PASS, ("window_edge",))])
    found = flag_symptoms(results)["op"]
    assert [s["flag"] for s in found] == ["window_edge"]  # "common" is on passing cases as often
    assert (found[0]["failing_with"], found[0]["with"], found[0]["failing_without"]) == (4, 5, 0)
    finalize(results)
    h = hypotheses(results[0])
    assert h[-1]["kind"] == "symptom" and "4 of 5 cases flagged `window_edge` FAIL" in h[-1]["evidence"]
    assert "pitfall" not in h[-1]  # a symptom names a flag, not a pitfall
    finalize(results)  # idempotent
    assert len(hypotheses(results[0])) == 1


def test_no_symptom_when_every_case_fails_or_a_flag_is_rare():
    assert flag_symptoms([_r(f"c{i}", Result.FAIL, ("x",)) for i in range(3)]) == {}
    rs = [_r("a", Result.FAIL, ("rare",))] + [_r(f"p{i}", Result.PASS, ()) for i in range(5)]
    assert flag_symptoms(rs) == {}
