"""Captured runs of a PyTorch engine (issue 11): the capture folder written by
examples/torch_capture_engine.py over every proposal_round vector passes check-capture; the same
engine with one planted bug in one Op's output (context_kv, masked_block) fails it, and every
round that does not pass names the planted Op first, through the API and the CLI."""

from __future__ import annotations

from collections import Counter

import pytest

from conformance import capture
from conformance.compare import Result

pytest.importorskip("torch", reason="torch is not installed: examples/torch_capture_engine needs it")

from examples import torch_capture_engine  # after the importorskip

ROUND_OPS = {"feature_capture", "context_kv", "masked_block", "proposal_head", "candidate_topk",
             "candidate_selector", "proposal_round"}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Every proposal_round vector (19 rounds, about 3 s on a CPU per folder): clean and each bug."""
    out = {}
    for bug in (None, "context_kv", "masked_block"):
        d = tmp_path_factory.mktemp(f"torch_capture_{bug or 'clean'}")
        assert torch_capture_engine.main([str(d)] + (["--bug", bug] if bug else [])) == 0
        out[bug] = d
    return out


def _rounds(judged):
    return [j for j in judged if j.op == "proposal_round"]


def test_clean_torch_folder_passes(folders):
    judged = capture.check(folders[None])
    counts = Counter(j.result for j in judged)
    assert {j.op for j in judged} == ROUND_OPS
    assert len(_rounds(judged)) == 19 and {r.round for r in _rounds(judged)} == {f"r{i:03d}" for i in range(19)}
    assert counts[Result.FAIL] == counts[Result.ERROR] == 0, capture.report(judged)[0]
    assert set(counts) <= {Result.PASS, Result.ACCEPTABLE}
    # a BF16 engine: some outputs outside the tight bound but inside the envelope (18 of 207 here)
    assert counts[Result.PASS] > 150 and counts[Result.PASS] + counts[Result.ACCEPTABLE] == len(judged)


@pytest.mark.parametrize("bug,output", [("context_kv", "k_cache"), ("masked_block", "hidden")])
def test_planted_bug_is_named_first(folders, bug, output):
    judged = capture.check(folders[bug])
    calls = [j for j in judged if j.op == bug]
    assert calls and all(j.result == Result.FAIL and output in j.detail for j in calls)
    # nothing else leaves its envelope: the engine's own rounding stays PASS / ACCEPTABLE
    assert all(not j.result.failed for j in judged if j.op not in (bug, "proposal_round"))
    rounds = _rounds(judged)
    failing = [r for r in rounds if r.result != Result.PASS]
    assert sum(r.result == Result.FAIL for r in rounds) >= 17  # masked_block: 2 rounds only ACCEPTABLE
    assert len(failing) == len(rounds) == 19
    assert all(r.first_bad is not None and r.first_bad.op == bug for r in failing), \
        [(r.round, r.first_bad and r.first_bad.op) for r in failing]
    # named first: the calls before it in its round conform
    for r in failing:
        assert all(not c.result.failed for c in r.calls if c.seq < r.first_bad.seq)


@pytest.mark.parametrize("bug", [None, "context_kv", "masked_block"])
def test_cli_check_capture(folders, bug, capsys):
    from conformance.cli import main

    assert main(["check-capture", str(folders[bug])]) == (1 if bug else 0)
    out = capsys.readouterr().out
    assert out.rstrip().splitlines()[-1].startswith("207 capture file(s): ")
    named = [line.split(": ")[1].split()[0] for line in out.splitlines() if "first Op outside its envelope" in line]
    if bug is None:
        assert named == [] and "FAIL" not in out and "ERROR" not in out
    else:
        assert len(named) == 19 and set(named) == {bug}
        assert f"first Op outside its envelope in round r000: {bug}" in out


def test_bug_choices_and_device_flag(tmp_path, capsys):
    with pytest.raises(SystemExit):
        torch_capture_engine.main([str(tmp_path), "--bug", "no_such_op"])
    with pytest.raises(SystemExit):
        torch_capture_engine.main([str(tmp_path), "--device", "tpu"])
    capsys.readouterr()
    assert torch_capture_engine.run(tmp_path, cases="proposal_round/dflash_B1*", device="cpu") == 1
