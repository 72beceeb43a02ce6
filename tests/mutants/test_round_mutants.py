"""Mutation testing at the round level: every round-only mutant FAILs on a
proposal_round or speculative_step case (its Op's) whose id names its pitfall, the float32 baseline fails none, and each
mutant with its bug switched off conforms (so the FAIL is the bug's)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest

from conformance.baseline import Float32Baseline
from conformance.compare import Result
from conformance.mutants import ROUND_MUTANTS
from conformance.runner import run_suite

VECTORS = Path(__file__).parents[2] / "vectors"
ROUND_PITFALLS = {"context_role_weights", "layer_id_origin", "capture_before_layer", "draft_temperature",
                  "first_draft_unverified", "rng_zero_proposal"}
ROUND_OPS = "proposal_round,speculative_step"


@cache
def _results(impl):
    return tuple(run_suite(impl, VECTORS, ops_pattern=ROUND_OPS))


def _table(results) -> str:
    return "\n".join(f"  {r.result.name:<14} {r.case}: {r.detail}" for r in results)


def test_every_round_pitfall_has_a_mutant():
    assert {m.pitfall for m in ROUND_MUTANTS} == ROUND_PITFALLS
    assert len({m.key for m in ROUND_MUTANTS}) == len(ROUND_MUTANTS)


def test_the_float32_baseline_passes_every_round_case():
    results = _results(Float32Baseline())
    assert len(results) >= 25
    bad = [r for r in results if r.result.failed]
    assert not bad, _table(bad)


@pytest.mark.parametrize("mutant", ROUND_MUTANTS, ids=lambda m: m.key)
def test_round_mutant_fails_on_its_pitfall_case(mutant):
    results = _results(mutant)
    named = [r for r in results if mutant.pitfall in r.case and r.case.startswith(mutant.op + "/")]
    assert named, f"no {mutant.op} case id names {mutant.pitfall}"
    failing = [r.case for r in named if r.result == Result.FAIL]
    assert failing, f"{mutant.name} passes every case naming its pitfall:\n{_table(named)}"
    print(f"{mutant.key} -> {mutant.op}: FAIL on {', '.join(failing)}")


@pytest.mark.parametrize("mutant", ROUND_MUTANTS, ids=lambda m: m.key)
def test_round_mutant_without_its_bug_conforms(mutant):
    bad = [r for r in _results(mutant.control()) if r.result.failed]
    assert not bad, f"{mutant.name} without its bug still fails:\n{_table(bad)}"
