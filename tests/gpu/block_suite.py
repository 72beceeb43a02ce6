"""The masked_block and draft_layer vectors through a fresh fast backend, shared by the GPU tests that force one
kernel of the block wherever it takes a shape (fast_gemv)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path


def block_suite_clean(options=None) -> None:
    """Run the block's 40 vectors on a fresh FastCudaBackend with ``options`` (None: the defaults) and assert that
    every one ran and none is FAIL, ERROR or NOT_IMPLEMENTED."""
    from conformance.compare import Result
    from conformance.runner import run_suite
    from kernels_cu.fast import FastCudaBackend

    root = Path(__file__).resolve().parents[2]
    backend = FastCudaBackend() if options is None else FastCudaBackend(options=options)
    results = run_suite(backend, root / "vectors", ops_pattern="masked_block,draft_layer")
    counts = Counter(r.result.name for r in results)
    bad = [r for r in results if r.result in (Result.FAIL, Result.ERROR, Result.NOT_IMPLEMENTED)]
    assert len(results) == 40 and not bad, f"{counts}: " + "; ".join(
        f"{r.op}/{r.case} {r.result.name}: {r.detail}" for r in bad[:20])
