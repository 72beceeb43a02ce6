"""Issue 9: the PyTorch example in examples/ passes its two Ops (skipped without torch)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conformance.compare import Result
from conformance.runner import run_suite

VECTORS = Path(__file__).resolve().parents[1] / "vectors"


def test_the_torch_example_passes_its_two_ops():
    pytest.importorskip("torch", reason="torch is not installed: examples/torch_engine needs it")
    from examples.torch_engine.dflash_torch import TorchEngine

    res = run_suite(TorchEngine("cpu"), VECTORS, "feature_capture,candidate_topk")
    assert len(res) > 30 and {r.op for r in res} == {"feature_capture", "candidate_topk"}
    bad = [f"{r.case}: {r.result.name} {r.detail}" for r in res if r.result not in (Result.PASS, Result.ACCEPTABLE)]
    assert bad == []
