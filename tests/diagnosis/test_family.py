"""The family hypothesis (conformance/diagnosis/family.py): a bug of a catalogued mechanism that no
variant of the catalog reproduces is named by its family, never as a pitfall; a bug outside every
family gets no family's name; nothing to explain gets no hypothesis."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest

from conformance import mutants
from conformance.compare import Result
from conformance.diagnose import Diagnoser, hypotheses, summary
from conformance.diagnosis import family as fm
from conformance.runner import load_selection, read_entry, run_suite
from tests.diagnosis.engines import ReversedTopk, ScaledAttention
from tests.mutants.test_diagnose import _Garbage

VECTORS = Path(__file__).parents[2] / "vectors"


def _fails(impl, op, diagnose=True):
    results = run_suite(impl, VECTORS, ops_pattern=op, diagnose=diagnose)
    summary(results)
    return [r for r in results if r.result == Result.FAIL]


def _without(key):
    return [m for m in mutants.MUTANTS if m.key != key]


@pytest.mark.parametrize("key,fam", [("window_le_S", "window"), ("rmsnorm_formula-weight_before", "norm")])
def test_a_sibling_is_named_by_its_family(key, fam):
    """With its own entry removed from the catalog, a mutant's FAILs that no sibling matches or is
    closest to are named by the family: as a family hypothesis, never as a pitfall, and never as
    another family."""
    m = next(x for x in mutants.MUTANTS if x.key == key)
    failing = _fails(m, m.op, diagnose=Diagnoser(max_cases=10**9, catalog=_without(key)))
    assert failing
    firsts = [hypotheses(r)[0] for r in failing if hypotheses(r)]
    by_family = [h for h in firsts if h["kind"] == "family"]
    assert by_family, [h["kind"] for h in firsts]
    assert all(h["family"] == fam for h in firsts if h.get("family")), [h.get("family") for h in firsts]
    for h in by_family:
        assert "pitfall" not in h and h["evidence"] and 0 < h["confidence"] <= fm.CONFIDENCE
        assert h["mutant"] != key and f"`{fam}` family" in h["text"]
    r = next(r for r in failing if hypotheses(r) and hypotheses(r)[0]["kind"] == "family")
    assert f"`{fam}` family" in r.diagnosis_note and r.diagnosis == []


@pytest.mark.parametrize("impl,op", [(ScaledAttention(), "draft_attention"), (ReversedTopk(), "candidate_topk"),
                                     (_Garbage(), "context_kv")], ids=["scaled_attention", "reversed_topk", "k_cache_offset"])
def test_a_bug_outside_every_family_gets_no_family(impl, op):
    failing = _fails(impl, op)
    assert failing
    named = [(r.case, hypotheses(r)) for r in failing if any(h.get("family") or h.get("pitfall") for h in hypotheses(r))]
    assert not named


def test_nothing_to_explain_gets_no_hypothesis():
    """The reference's own outputs (and a mutant's outputs on a case where its bug does not show)
    leave nothing over the allowance: no match, no family, no structure."""
    _, entries = load_selection(VECTORS)
    vec = read_entry(VECTORS, next(e for e in entries if e["case"].startswith("draft_attention/")))
    found, hyps = Diagnoser().analyse(vec, {n: np.array(vec.expected[n], copy=True) for n in vec.outputs})
    assert found == [] and hyps == []


def _ev(key, overlap, cosine, n=400):
    return fm.Evidence(key, overlap, cosine, n)


class _M:
    def __init__(self, key, fam):
        self.key, self.fam, self.row = key, fam, ""


def test_rules_of_the_family_hypothesis():
    a, b, c = _M("a1", "A"), _M("a2", "A"), _M("b1", "B")
    fam = lambda m: m.fam  # noqa: E731
    # the same rows, the same direction, clearly closer than the other family: named, once
    hs = fm.hypotheses([(a, _ev("a1", 0.8, 0.7)), (b, _ev("a2", 0.6, 0.6)), (c, _ev("b1", 0.3, 0.2))], fam)
    assert [h["family"] for h in hs] == ["A"] and "a1, a2" in hs[0]["text"]
    assert hs[0]["confidence"] == round(fm.CONFIDENCE * 0.8 * 0.7, 3)
    # another region or an opposite direction: none
    assert fm.hypotheses([(a, _ev("a1", 0.4, 0.9))], fam) == []
    assert fm.hypotheses([(a, _ev("a1", 0.9, -0.9))], fam) == []
    # a cosine within chance for few elements (3 / sqrt(9) = 1): none
    assert fm.hypotheses([(a, _ev("a1", 1.0, 0.9, n=9))], fam) == []
    # two families alike (scores within MARGIN): neither
    assert fm.hypotheses([(a, _ev("a1", 0.8, 0.7)), (c, _ev("b1", 0.7, 0.7))], fam) == []
    # a complete value transform of the reference (a scale): no family
    assert fm.hypotheses([(a, _ev("a1", 0.8, 0.7))], fam, [{"signature": "constant scale"}]) == []


def test_evidence_of_a_variant_against_itself_and_its_opposite():
    """A variant's own outputs against itself: overlap 1, cosine 1; the reference moved the other
    way (2 r - m): the same rows, cosine -1."""
    m = next(x for x in mutants.MUTANTS if x.key == "window_dropped")
    d = Diagnoser()
    _, entries = load_selection(VECTORS)
    for e in entries:
        if not e["case"].startswith("draft_attention/"):
            continue
        vec = read_entry(VECTORS, e)
        kw = {**{k: np.array(v, copy=True) for k, v in vec.inputs.items()}, **copy.deepcopy(dict(vec.params))}
        out = {k: np.asarray(v) for k, v in m.draft_attention(**kw).items()}
        maps = d.analyse(vec, out) and d._maps
        if maps and any((x > 2).any() for x in maps.values()):
            break
    diff = {n: x > fm.PREDICTED for n, x in maps.items()}  # the variant's own threshold: the same rows
    ref_m = {**vec.expected, **out}
    same = fm.evidence(vec, fm.signed(vec, maps, out, vec.expected), diff, m.key, ref_m)
    assert same.overlap == 1.0 and same.cosine > 1 - 1e-9
    flipped = {n: -fm.signed(vec, maps, out, vec.expected)[n] for n in vec.outputs}
    opp = fm.evidence(vec, flipped, diff, m.key, ref_m)
    assert opp.overlap == 1.0 and opp.cosine < -1 + 1e-9
