"""An engine whose top-k and top-p are thresholds on the probability value (FlashInfer's
``top_k_renorm_probs`` and ``top_p_renorm_probs``; tests/diagnosis/engines.py) FAILs exactly the two
cases that plant ties at a filter's boundary, and the diagnosis names the catalog's threshold mutant
first on each: the engine rounds its own way (float32 softmax at the temperature, renormalization by
division), so the match is the envelope's, not bit equality. Every other case of the Op passes: the
engine leaves C5 only at ties."""

from __future__ import annotations

from pathlib import Path

from conformance.compare import Result
from conformance.diagnose import hypotheses, summary
from conformance.runner import run_suite
from tests.diagnosis.engines import ThresholdFilters

VECTORS = Path(__file__).parents[2] / "vectors"
NAMED = {"target_distribution/top_k_exact_ties_at_boundary": "top_k_keeps_ties",
         "target_distribution/filter_boundary__top_p_reached_exactly_min_p_at_threshold":
             "filter_boundary-top_p_keeps_ties"}


def test_threshold_filters_are_named_first():
    results = run_suite(ThresholdFilters(), VECTORS, ops_pattern="target_distribution", diagnose=True)
    summary(results)
    failing = {r.case: r for r in results if r.result == Result.FAIL}
    assert set(failing) == set(NAMED), {c: r.detail for c, r in failing.items()}
    for case, key in NAMED.items():
        r = failing[case]
        assert r.diagnosis and r.diagnosis[0]["mutant"] == key, (case, r.diagnosis_note)
        assert hypotheses(r)[0]["mutant"] == key and hypotheses(r)[0]["kind"] == "match", hypotheses(r)
        assert f"pitfall `{key.split('-')[0]}`" in r.diagnosis_note, r.diagnosis_note
    # top-p's case is named through the envelope: the engine's probabilities are not the mutant's bits (on the
    # top-k case every kept token is one of 8 equal maxima, p = 1/8 exactly, whoever computes it)
    top_p = failing["target_distribution/filter_boundary__top_p_reached_exactly_min_p_at_threshold"].diagnosis[0]
    assert not top_p["exact"] and top_p["frac"] > 0, top_p
