"""The family hypothesis (conformance/diagnosis/family.py): a bug of a catalogued mechanism that no
variant of the catalog reproduces is named by its family, never as a pitfall; a bug outside every
family gets no family's name; nothing to explain gets no hypothesis."""

from __future__ import annotations

import copy
import re
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
        assert "pitfall" not in h and h["evidence"] and f"`{fam}` family" in h["text"]
        if "reading" in h:  # a structural signature that is the family's mechanism (diagnosis.mechanism)
            assert "mutant" not in h and 0 < h["confidence"] <= 0.85
        else:  # the variants' evidence (diagnosis.family)
            assert 0 < h["confidence"] <= fm.CONFIDENCE and h["mutant"] != key
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


def _ev(key, overlap, cosine, n=400, d=0, p=0, k=0, total=0):
    return fm.Evidence(key, overlap, cosine, n, d, p, k, total)


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


def test_chance_is_the_hypergeometric_tail():
    """chance(N, p, d, k) = P(X >= k), X ~ Hypergeometric(N, p, d), summed exactly here."""
    from math import comb

    for total, p, d, k in ((20, 1, 1, 1), (144, 7, 7, 7), (30, 6, 5, 3), (40, 10, 12, 6), (12, 3, 3, 1)):
        exact = sum(comb(p, i) * comb(total - p, d - i) for i in range(k, min(p, d) + 1)) / comb(total, d)
        got = fm.chance(total, p, d, k)
        assert got == pytest.approx(exact, rel=1e-9) or (got == 1.0 and k <= p * d / total), (total, p, d, k)
    assert fm.chance(20, 1, 1, 1) == pytest.approx(0.05) and fm.chance(50, 5, 5, 0) == 1.0


def test_rules_of_the_support_paths():
    a, c = _M("a1", "A"), _M("b1", "B")
    fam = lambda m: m.fam  # noqa: E731
    # three decisions differ out of 500 compared, exactly those the variant changes: the cosine of
    # three elements is within the sign test's chance (3 / sqrt(3) > 1), the support is not
    few = dict(n=3, d=3, p=3, k=3)
    assert [h["family"] for h in fm.hypotheses([(a, _ev("a1", 1.0, 1.0, **few, total=500))], fam)] == ["A"]
    # the same three out of six compared: chance (1 / 20) names nothing
    assert fm.hypotheses([(a, _ev("a1", 1.0, 1.0, **few, total=6))], fam) == []
    # the same elements with unrelated values (cosine 0.1): named on its support, the values said to differ
    sup = dict(n=300, d=200, p=220, k=180, total=2000)
    hs = fm.hypotheses([(a, _ev("a1", 1.0, 0.1, **sup)), (c, _ev("b1", 1.0, 0.1, d=200, p=900, k=90, total=2000))], fam)
    assert [h["family"] for h in hs] == ["A"] and "same elements" in hs[0]["evidence"]
    assert 0 < hs[0]["confidence"] <= fm.CONFIDENCE
    # ... but not where another family's variant moves the same elements (support within MARGIN)
    assert fm.hypotheses([(a, _ev("a1", 1.0, 0.1, **sup)), (c, _ev("b1", 1.0, 0.1, **sup))], fam) == []
    # ... nor where the difference covers nearly every compared element (a scale, an offset)
    assert fm.hypotheses([(a, _ev("a1", 1.0, 0.1, n=2000, d=1950, p=1950, k=1950, total=2000))], fam) == []
    # the two paths naming different families: none
    assert fm.hypotheses([(a, _ev("a1", 1.0, 0.1, **sup)), (c, _ev("b1", 0.9, 0.9, n=400))], fam) == []


_SMALL_COSINE = re.compile(r"cosine (-?[0-9.]+) of the signed deviations over ([0-9]+) elements")


def _new_path(h) -> bool:
    """A family hypothesis only the support evidence gives: the same elements (values unrelated),
    or the same direction over too few elements for the sign test alone."""
    if "changes the same elements" in h["evidence"]:
        return True
    m = _SMALL_COSINE.search(h["evidence"])
    return bool(m) and float(m.group(1)) < fm.SIGMAS / np.sqrt(int(m.group(2)))


@pytest.mark.parametrize("key,fam", [("selector_first_step-no_pair", "selector_first"),
                                     ("selector_first_step-pred_top1", "selector_first")])
def test_leave_one_out_named_on_the_support(key, fam):
    """Leave-one-out (docs/reports/diagnosis.md, section (a)) where the family is named through the
    support: the selector's first step scored without its pair term, or taking the predecessor's top-1, whose
    siblings change the same few path entries (no reading covers either). Named first on several FAILs,
    never another family."""
    m = next(x for x in mutants.MUTANTS if x.key == key)
    failing = _fails(m, m.op, diagnose=Diagnoser(max_cases=10**9, catalog=_without(key)))
    firsts = [hypotheses(r)[0] for r in failing if hypotheses(r)]
    assert all(h["family"] == fam for h in firsts if h.get("family")), [h.get("family") for h in firsts]
    # the variants' support (diagnosis.family), not a reading of a signature (diagnosis.mechanism)
    new = [h for h in firsts if h["kind"] == "family" and "reading" not in h and _new_path(h)]
    assert len(new) >= 3, [h["evidence"] for h in firsts if h["kind"] == "family"]


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
