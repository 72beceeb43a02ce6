"""CPU benchmarks (pytest-benchmark): the float32 baseline over the committed vectors, the case
generation of one Op, and the verification of a few vector files.

Not collected by the default ``pytest -q`` (testpaths = tests). Run with
``pytest benchmarks/test_cpu_bench.py --benchmark-only`` (pytest-benchmark installed, part of
the ``test`` extra). Each benchmark runs a few rounds only: these are seconds-long workloads.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pytest_benchmark")

from conformance import generate, registry  # noqa: E402
from conformance.baseline import Float32Baseline  # noqa: E402
from conformance.compare import Result  # noqa: E402
from conformance.runner import run_suite  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
VECTORS = ROOT / "vectors"
GEN_OP = "candidate_topk"  # a mid-sized generator (24 cases)
VERIFY_PATTERN = "proposal_head/*"  # 13 files


def _rounds(benchmark, fn, rounds=3):
    return benchmark.pedantic(fn, rounds=rounds, iterations=1, warmup_rounds=0)


@pytest.mark.benchmark(group="suite")
def test_suite_float32_baseline(benchmark):
    """The whole suite with the float32 baseline as the implementation (the CLI's CPU fallback)."""
    results = _rounds(benchmark, lambda: run_suite(Float32Baseline(), VECTORS), rounds=1)
    assert results and all(r.result not in (Result.FAIL, Result.ERROR) for r in results)


@pytest.mark.benchmark(group="generate")
def test_generate_one_op(benchmark):
    """Reference + baseline + bounds for every case of one Op, in memory (no files written)."""
    spec = registry.ops()[GEN_OP]

    def run():
        return [generate.case_bytes(spec, case) for case in generate.cases_of(spec)]

    out = _rounds(benchmark, run)
    assert out


@pytest.mark.benchmark(group="verify")
def test_verify_a_few_files(benchmark):
    """Regenerate and compare a few committed files against the manifest."""
    problems = _rounds(benchmark, lambda: generate.verify(VECTORS, registry.ops(), VERIFY_PATTERN))
    assert isinstance(problems, list)
