"""The full-width geometry check, run here at --reduced size (same structure, small widths)."""

import json

import pytest

from conformance import geometry
from conformance.baseline import Float32Baseline
from conformance.cli import main
from conformance.compare import Result
from conformance.mutants import AnchorAsMask


def test_reduced_geometry_runs_every_op_of_both_paths():
    results = geometry.run(Float32Baseline(), batches=(2,), widths=(4,), reduce=True, log=lambda line: None)
    ops = {r.op for r in results}
    assert ops == {"context_kv", "masked_block", "proposal_head", "candidate_topk", "candidate_selector"}
    assert not [r for r in results if r.result.failed], [r.detail for r in results if r.result.failed]


def test_a_wrong_implementation_fails_at_geometry_scale():
    results = geometry.run(AnchorAsMask(), names=("dflash2-27b",), batches=(1,), widths=(4,), reduce=True,
                           log=lambda line: None, ops=("masked_block",))
    block = [r for r in results if r.op == "masked_block"]
    assert block and all(r.result == Result.FAIL for r in block)


def test_bad_geometry_arguments_are_one_line_errors(capsys):
    assert main(["geometry", "--geometry", "nope"]) == 2
    assert main(["geometry", "--batch", "9"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and err[0].startswith("error: --geometry") and err[1].startswith("error: --batch")


# --- geometry --jobs (conformance/geometry_jobs.py) ---------------------------------------------------


def _ids(results):
    return [r.case for r in results]


@pytest.mark.parametrize("ops,batches,widths,per_geometry", [
    (None, (1, 2), (4,), False), (("context_kv",), (1,), (4,), False),
    (("masked_block", "candidate_topk"), (2,), (3, 4), False), (None, (1, 2), (3, 4), True)])
def test_parts_run_exactly_the_single_runs_cases_in_order(ops, batches, widths, per_geometry):
    """geometry.parts against geometry.run itself: the parts, each run on its own, give the single
    run's case ids in its order (context_kv once per geometry, with the first part); per geometry, one
    part a geometry."""
    kw = {"reduce": True, "log": lambda line: None}
    whole = geometry.run(Float32Baseline(), batches=batches, widths=widths, ops=ops, **kw)
    split = []
    parts = geometry.parts(batches=batches, widths=widths, ops=ops, per_geometry=per_geometry)
    for part in parts:
        split += geometry.run(Float32Baseline(), names=(part["geometry"],), batches=part["batches"] or batches,
                              widths=part["widths"] or widths, ops=part["ops"], **kw)
    assert _ids(split) == _ids(whole) and len(set(_ids(whole))) == len(whole)
    if per_geometry:
        assert [p["geometry"] for p in parts] == list(geometry.GEOMETRIES)


def test_a_case_record_reads_back_as_the_same_result():
    from conformance.compare import CaseResult
    from conformance.report import case_record, record_result

    rs = [CaseResult("masked_block", "masked_block/x", Result.ACCEPTABLE, "hidden: ...", ("full_geometry",), 5.0,
                     3.0, float("inf"), 0.5, 1.25, ("precision",), 1.7, float("nan")),
          CaseResult("context_kv", "context_kv/y", Result.PASS)]
    for r in rs:
        back = record_result(case_record(r))
        for f in ("op", "case", "result", "detail", "flags", "worst_ulp", "ulp_bound", "worst_norm", "norm_bound",
                  "seconds", "acceptable_flags", "tight_frac"):
            assert getattr(back, f) == getattr(r, f), f
        assert (back.envelope_frac is None) == (r.envelope_frac is None)


def _cli_json(tmp_path, name, *argv):
    out = tmp_path / f"{name}.json"
    rc = main(["geometry", "--reduced", "--batch", "1", "2", "--width", "4", *argv, "--json", str(out)])
    return rc, json.loads(out.read_text())


def test_jobs_give_the_single_processes_cases_and_verdicts(tmp_path, capsys):
    rc1, one = _cli_json(tmp_path, "one")
    rc3, three = _cli_json(tmp_path, "three", "--jobs", "3")
    capsys.readouterr()
    key = [(r["case"], r["result"]) for r in one["results"]]
    assert rc1 == rc3 == 0 and key and [(r["case"], r["result"]) for r in three["results"]] == key
    assert three["summary"]["PASS"] == one["summary"]["PASS"] and three["complete"]
    assert three["environment"]["jobs"] == 3 and len(three["environment"]["geometry_parts"]) == 4


def test_jobs_keep_a_mutants_fail(tmp_path, capsys):
    argv = ("--geometry", "dflash2-27b", "--ops", "masked_block", "--impl", "conformance.mutants:AnchorAsMask")
    rc1, one = _cli_json(tmp_path, "mutant1", *argv)
    rc2, two = _cli_json(tmp_path, "mutant2", *argv, "--jobs", "2")
    capsys.readouterr()
    key = [(r["case"], r["result"]) for r in one["results"]]
    assert rc1 == rc2 == 1 and "FAIL" in {v for _, v in key} and [(r["case"], r["result"]) for r in two["results"]] == key


def test_a_part_that_dies_is_an_error_never_a_pass(tmp_path, capsys):
    rc, rep = _cli_json(tmp_path, "dead", "--geometry", "dflash2-27b", "--jobs", "2", "--impl", "no_such_module:Impl")
    out = capsys.readouterr().out
    assert rc == 1 and len(rep["results"]) == 2 and {r["result"] for r in rep["results"]} == {"ERROR"}
    assert "exited with status 2" in rep["results"][0]["detail"] and "no_such_module" in out


def test_jobs_below_one_is_a_one_line_error(capsys):
    assert main(["geometry", "--reduced", "--jobs", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --jobs")
