"""diagnose: for every mutant of the catalog, on every case where the suite FAILs it, the
runner's diagnosis names that mutant first (alone, or tied first with mutants whose outputs are
the same there), and a FAIL that no catalog bug explains says so and names its first divergence."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from conformance import mutants
from conformance.baseline import Float32Baseline
from conformance.compare import Result
from conformance.diagnose import Diagnoser, hypotheses, summary
from conformance.runner import run_suite

VECTORS = Path(__file__).parents[2] / "vectors"
_SHARED = Diagnoser(max_cases=10**9)  # caches each mutant's outputs per case across the runs below


@pytest.mark.parametrize("mutant", [m for m in mutants.MUTANTS if m.expect == "fail"], ids=lambda m: m.key)
def test_diagnose_names_the_mutant_first(mutant):
    results = run_suite(mutant, VECTORS, ops_pattern=mutant.op, diagnose=_SHARED)
    failing = [r for r in results if r.result == Result.FAIL]
    assert failing, f"{mutant.name} FAILs nothing"
    wrong = []
    for r in failing:
        d = r.diagnosis
        top = [x for x in d if d and _rank(x) == _rank(d[0])]
        if mutant.key not in [x["mutant"] for x in top]:
            wrong.append(f"  {r.case}: {r.diagnosis_note} {[x['mutant'] for x in d[:3]]}")
    assert not wrong, f"diagnose does not name {mutant.key} first:\n" + "\n".join(wrong)
    assert summary(failing)[0][1] >= 1


def _rank(x):
    return x["exact"], x["explained"], x["spurious"], x["reduction"], x["frac"]


class _Garbage(Float32Baseline):
    """An implementation no catalog bug explains: context_kv's K cache shifted by a constant."""

    def context_kv(self, **kw):
        out = Float32Baseline().context_kv(**kw)
        k = np.asarray(out["k_cache"], np.float64) + 0.5
        from reference import numerics

        return {**out, "k_cache": numerics.storage(k, "bf16")}


def test_unexplained_fail_names_the_first_divergence():
    results = run_suite(_Garbage(), VECTORS, ops_pattern="context_kv", diagnose=True)
    failing = [r for r in results if r.result == Result.FAIL]
    assert failing
    for r in failing:
        assert r.diagnosis == [] and "matches no catalog pitfall" in r.diagnosis_note
        assert "first divergence: k_cache[" in r.diagnosis_note
        # no pitfall named, not even as the closest: only structure, with its evidence
        assert all(h["kind"] == "structure" and h["evidence"] for h in hypotheses(r)), hypotheses(r)
    # the structure of the error, where the BF16 rounding of the offset lets it show: a constant offset
    offsets = [r for r in failing if hypotheses(r) and hypotheses(r)[0]["signature"] == "constant offset"]
    assert len(offsets) >= 0.75 * len(failing)
    assert "error structure: k_cache is the reference plus 0.5" in offsets[0].diagnosis_note


def test_no_diagnosis_without_a_fail():
    results = run_suite(Float32Baseline(), VECTORS, ops_pattern="preview_commit", diagnose=True)
    assert all(r.diagnosis == [] and r.diagnosis_note == "" for r in results)
