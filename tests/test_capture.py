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
