"""Captured runs (issue 11 item 3): the example engine's capture folder passes check-capture; the
same engine with one planted bug in one Op's output fails it and names that Op first."""

from __future__ import annotations

import numpy as np
import pytest

from conformance import capture
from conformance.compare import Result
from examples.capture_engine import run

CASES = "proposal_round/dflash_B3*,proposal_round/dflash2_sampled_B4*"


def test_clean_capture_folder_passes(tmp_path):
    assert run(tmp_path, cases=CASES) == 2
    judged = capture.check(tmp_path)
    assert len(judged) > 10 and {j.op for j in judged} >= {"feature_capture", "context_kv", "masked_block",
                                                           "proposal_head", "candidate_topk", "candidate_selector",
                                                           "proposal_round"}
    assert all(j.result == Result.PASS for j in judged), capture.report(judged)[0]
    assert capture.main(tmp_path) == 0


def test_planted_bug_is_named_first(tmp_path, capsys):
    run(tmp_path, bug="context_kv", cases="proposal_round/dflash_B3*")
    judged = capture.check(tmp_path)
    rounds = [j for j in judged if j.op == "proposal_round"]
    assert rounds and all(r.result == Result.FAIL for r in rounds)
    assert all(r.first_bad is not None and r.first_bad.op == "context_kv" for r in rounds)
    assert all(j.result == Result.PASS for j in judged if j.op not in ("context_kv", "proposal_round"))
    assert capture.main(tmp_path) == 1
    assert "first Op outside its envelope in round r000: context_kv" in capsys.readouterr().out


STEP_CASES = "speculative_step/dflash_greedy_B4*,speculative_step/dflash2_sampled_B3*"


def test_whole_steps_capture_and_pass(tmp_path):
    """A speculative_step file per step, its Op calls (the round's six, accept, commit) with it."""
    assert run(tmp_path, cases=STEP_CASES) == 2
    judged = capture.check(tmp_path)
    assert {j.op for j in judged} >= {"context_kv", "masked_block", "speculative_accept", "preview_commit",
                                      "speculative_step"}
    assert all(j.result == Result.PASS for j in judged), capture.report(judged)[0]
    steps = [j for j in judged if j.op == "speculative_step"]
    assert len(steps) == 2 and all(len(s.calls) >= 5 for s in steps)


def test_planted_bug_in_a_step_is_named_first(tmp_path):
    run(tmp_path, bug="masked_block", cases=STEP_CASES)
    judged = capture.check(tmp_path)
    steps = [j for j in judged if j.op == "speculative_step"]
    assert steps and all(s.first_bad is not None and s.first_bad.op == "masked_block" for s in steps)
    assert any(s.result == Result.FAIL for s in steps)
    lines, failed = capture.report(judged)
    assert failed and any("first Op outside its envelope" in line and "masked_block" in line for line in lines)


def test_write_accepts_dlpack_and_keeps_scalars(tmp_path):
    class Tensor:  # a DLPack-only producer (no __array__)
        def __init__(self, a):
            self.a = a

        def __dlpack__(self, stream=None):
            return self.a.__dlpack__()

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    p = capture.write(tmp_path, "toy", {"x": Tensor(np.arange(3.0))}, {"y": np.int64(4)}, {"k": 1}, round="a", seq=2)
    op, params, inputs, outputs, masks, meta = capture.read(p)
    assert op == "toy" and params == {"k": 1} and meta["round"] == "a" and meta["seq"] == "2"
    assert inputs["x"].tolist() == [0.0, 1.0, 2.0] and outputs["y"].shape == ()


def test_torch_tensors_by_bit_pattern(tmp_path):
    torch = pytest.importorskip("torch", reason="torch is not installed here; the NumPy path is tested above")
    t = torch.tensor([1.0078125, -3.5], dtype=torch.bfloat16)
    p = capture.write(tmp_path, "toy", {"x": t}, {}, {})
    assert capture.read(p)[2]["x"].astype(np.float64).tolist() == [1.0078125, -3.5]


def test_unreadable_and_unknown_files_are_errors(tmp_path):
    (tmp_path / "junk.safetensors").write_bytes(b"nope")
    capture.write(tmp_path, "no_such_op", {}, {}, {})
    judged = capture.check(tmp_path)
    assert [j.result for j in judged] == [Result.ERROR, Result.ERROR]


def test_cli_check_capture_exit_codes(tmp_path):
    from conformance.cli import main

    run(tmp_path / "good", cases="proposal_round/dflash_B1*")
    run(tmp_path / "bad", bug="context_kv", cases="proposal_round/dflash_B1*")
    assert main(["check-capture", str(tmp_path / "good")]) == 0
    assert main(["check-capture", str(tmp_path / "bad")]) == 1
    assert main(["check-capture", str(tmp_path / "none")]) == 2


def _j(op, result, seq=0, detail="d"):
    from pathlib import Path

    return capture.Judged(Path(f"r0-{seq}-{op}.safetensors"), op, result, detail, "r0", seq)


@pytest.mark.parametrize("call_results, expect", [
    ((Result.PASS, Result.ACCEPTABLE), "the first that is only ACCEPTABLE: masked_block"),
    ((Result.PASS, Result.PASS), "the fault lies between them"),
    ((Result.FAIL, Result.ACCEPTABLE), "first Op outside its envelope in round r0: context_kv"),
    ((), "no per-Op captures"),
])
def test_a_failing_round_says_what_its_calls_show(call_results, expect):
    rnd = _j("proposal_round", Result.FAIL, 9)
    rnd.calls = [_j(op, r, i) for i, (op, r) in enumerate(zip(("context_kv", "masked_block"), call_results))]
    rnd.first_bad = next((c for c in rnd.calls if c.result.failed), None)
    lines, failed = capture.report([rnd])
    assert failed and expect in "\n".join(lines)


def test_an_acceptable_round_blames_nothing():
    rnd = _j("speculative_step", Result.ACCEPTABLE, 9)
    rnd.calls = [_j("context_kv", Result.ACCEPTABLE, 0)]
    lines, failed = capture.report([rnd])
    assert not failed and len(lines) == 2 and "fault" not in lines[0]
