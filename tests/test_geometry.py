"""The full-width geometry check, run here at --reduced size (same structure, small widths)."""

from conformance import geometry
from conformance.baseline import Float32Baseline
from conformance.cli import main
from conformance.compare import Result
from tests.mutants.mutants import AnchorAsMask


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
