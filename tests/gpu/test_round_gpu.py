"""kernels_cu/round.py on a GPU: CudaRound, the CUDA backend with proposal_round
composed from its Op kernels.

- over the committed proposal_round and speculative_step vectors it gives no FAIL and no ERROR
  (CONTRACTS C10; the step adds the backend's accept and commit kernels after the round);
  ROUND_SUITE_REPORT=<path> writes the per-case results there as JSON;
- greedy speculative decoding with its proposals (conformance/round_e2e.py) publishes exactly plain
  greedy decoding of the toy target for a few prompts at K = 1, 4, 15, both drafter kinds, with
  proposals accepted and rarely (near-ties only) different from the float64 round's.
The full sweep (200 prompts, K 1..15) is `python -m conformance.round_e2e --impl cuda`.
Marked ``gpu`` by tests/gpu/conftest.py; skipped with the
reason where no GPU answers.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cuda_round(cupy):
    from kernels_cu.exact.round import CudaRound

    return CudaRound()


def test_round_vectors_have_no_fail_or_error(cuda_round):
    from conformance.compare import Result
    from conformance.runner import run_suite

    results = run_suite(cuda_round, ROOT / "vectors", "proposal_round,speculative_step")
    assert {r.op for r in results} == {"proposal_round", "speculative_step"}
    counts = Counter(r.result.name for r in results)
    path = os.environ.get("ROUND_SUITE_REPORT")
    if path:
        Path(path).write_text(json.dumps({
            "counts": dict(counts),
            "cases": [{"op": r.op, "case": r.case, "result": r.result.name, "detail": r.detail} for r in results],
        }, indent=1))
    bad = [r for r in results if r.result in (Result.FAIL, Result.ERROR, Result.NOT_IMPLEMENTED)]
    assert results and not bad, f"{counts}: " + "; ".join(f"{r.case} {r.result.name}: {r.detail}" for r in bad[:10])


def test_greedy_loop_equals_plain_decoding(cuda_round):
    from conformance import round_e2e as e2e

    ks = (1, 4, 15)
    cells, _ = e2e.sweep(cuda_round.proposal_round, prompts=4, ks=ks, check=True)
    for c in cells:
        assert (c.prompts, c.differ, c.errors) == (4, 0, 0), (c.kind, c.K, c.first_error, c.first_diff)
    assert all(sum(c.tally.accepted for c in cells if c.kind == kind) > 0 for kind in e2e.KINDS)
    compared = sum(c.tally.compared for c in cells)
    assert compared > 0 and sum(c.tally.disagree for c in cells) <= 0.02 * compared
