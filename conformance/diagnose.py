"""Diagnosis of a FAIL: which known bug explains the implementation's output?

For a failing case, every one-bug variant of the reference in the catalog (``conformance.mutants``)
that belongs to the case's Op is run on the case's inputs. A mutant *matches* when the
implementation would be PASS or ACCEPTABLE judged against that mutant with the suite's own
machinery (``conformance.diagnosis.match``: the mutant's envelope and magnitudes, its own decision
margins, teacher forcing where the mutant is the reference on changed inputs), so a real engine,
which never rounds like the mutant, is still named. A mutant that changes nothing beyond the
allowance on this case explains no FAIL and is skipped.

Matches rank by how much of the observed difference they explain (``diagnosis.explain``): bit
equality first, then the larger fraction of the differing elements reproduced, then the fewer
differences predicted that did not happen, then the smaller part of the envelope used. Ranking by
the envelope fraction alone named a mutant that changes much more than the implementation does
(a dropped window for an off-by-one window) whenever its outputs happened to lie close.

Every FAIL also gets ranked *hypotheses* (at most ``TOP``), each with its evidence and a
confidence: the matches; where nothing matches, the nearest mutants that explain most of the
difference (worded as "closest", never as a match); where neither, a family whose variants change
the same region in the same direction (``diagnosis.family``, worded as "a bug of the family",
never as a pitfall); structural signatures of the difference
(``diagnosis.structure``, never worded as a catalogued pitfall), each preceded by its family where the
signature is on its own that family's mechanism (``diagnosis.mechanism``: a window edge moved by one,
the uniforms' position off by one, a proposal column read from its neighbour); and, once the run is over
(``finalize``), the case flags over-represented among the Op's failing cases
(``diagnosis.symptoms``). "None" is an honest answer: no hypothesis is made without evidence.

Cost: nothing when nothing fails; per failing case one float32 call and one float64 twin of each
mutant of its Op (cached per case and mutant), one comparison each, and a few reference calls for
the input-offset signatures; at most ``max_cases`` failing cases per run (later ones say "not
diagnosed"). Mutants are trusted reference code and run in the harness process.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from conformance import compare
from conformance.compare import Result
from conformance.diagnosis import explain as ex
from conformance.diagnosis import match as mt
from conformance.diagnosis import family as fm
from conformance.diagnosis import mechanism, picture, structure, symptoms
from conformance.registry import REPRESENTED

MAX_CASES = 200
MAX_PICTURES = 20  # FAILs per run whose error grid is kept for a picture
TOP = 3
# a mutant nearest without a match: what it must explain to be named as the closest pitfall
NEAR_EXPLAINED = 0.6
NEAR_REDUCTION = 0.5
NEAR_SPURIOUS = 0.25
# a mutant the implementation conforms to: how much of the error it must take away
MATCH_REDUCTION = 0.5
MATCH_SPURIOUS = 0.5


def family(m) -> str:
    return getattr(m, "family", "") or m.pitfall


@dataclass
class Match:
    pitfall: str
    mutant: str  # the catalog key
    row: str  # the docs/pitfalls.md row it stands for
    exact: bool  # every compared element equal to the mutant's output
    frac: float  # worst fraction of the mutant's envelope (tight bound where no envelope) used
    result: str  # PASS or ACCEPTABLE against the mutant
    family: str = ""
    how: str = ""  # which form of the mutant it matched
    explained: float = 0.0  # fraction of the differing elements reproduced
    spurious: float = 0.0  # fraction of the mutant's own difference not seen in the implementation
    reduction: float = 0.0  # how much of the error norm the mutant takes away

    def record(self) -> dict:
        return {"pitfall": self.pitfall, "mutant": self.mutant, "row": self.row, "exact": self.exact,
                "frac": None if not np.isfinite(self.frac) else round(float(self.frac), 4), "result": self.result,
                "family": self.family, "how": self.how, "explained": round(self.explained, 4),
                "spurious": round(self.spurious, 4), "reduction": round(self.reduction, 4)}

    @property
    def rank(self) -> tuple:
        return (not self.exact, -round(self.explained, 3), round(self.spurious, 3), -round(self.reduction, 3),
                self.frac)


class Diagnosis(list):
    """The matches, best first (a list, as before), with ``hypotheses``: the top ranked hypotheses
    (dicts: kind, text, evidence, confidence; pitfall and mutant where a mutant stands behind it)."""

    hypotheses: list
    op: str = ""
    flags: tuple = ()
    grids: dict | None = None  # output -> picture.grid(...), for the first FAILs of a run

    def __init__(self, matches=(), hypotheses=(), op="", flags=()):
        super().__init__(matches)
        self.hypotheses = list(hypotheses)
        self.grids = None
        self.op = op
        self.flags = tuple(flags)


def _fresh(vec) -> dict:
    return mt.fresh(vec)


def first_divergence(vec, impl: Mapping) -> str:
    """The first element (in output order, then index order) where ``impl`` leaves the reference."""
    masks = compare.full_masks(vec.outputs, vec.expected, vec.masks)
    for name, o in vec.outputs.items():
        a, b = np.asarray(impl[name]), np.asarray(vec.expected[name])
        if a.shape != b.shape:
            return f"{name}: shape {list(a.shape)}, expected {list(b.shape)}"
        if o.cls == REPRESENTED:
            a64, b64 = a.astype(np.float64), b.astype(np.float64)
            diff = ~((a64 == b64) | (np.isnan(a64) & np.isnan(b64))) & masks[name]
        else:
            diff = (a != b) & masks[name]
        if diff.any():
            at = tuple(int(i) for i in np.argwhere(diff)[0])
            return (f"{name}[{', '.join(map(str, at))}] (got {a[at].item()!r}, expected {b[at].item()!r}; "
                    f"{int(diff.sum())} of {int(masks[name].sum())} compared elements differ)")
    return "no element differs from the reference"


def _match_hypothesis(m: Match) -> dict:
    conf = 1.0 if m.exact else round(0.95 * max(m.explained, 0.0) * (1.0 - m.spurious), 3)
    ev = ("bit-identical to the mutant's outputs" if m.exact else
          f"{m.result} against mutant {m.mutant} ({m.how}; {m.frac:.2g} of its envelope), reproducing "
          f"{m.explained:.0%} of the differing elements")
    return {"kind": "match", "pitfall": m.pitfall, "mutant": m.mutant, "family": m.family, "row": m.row,
            "text": f"pitfall `{m.pitfall}` (docs/pitfalls.md: {m.row})", "evidence": ev, "confidence": conf}


def _near_hypothesis(m, e: ex.Explanation) -> dict | None:
    if e.explained >= NEAR_EXPLAINED and e.reduction >= NEAR_REDUCTION and e.spurious <= NEAR_SPURIOUS:
        ev = (f"mutant {m.key} reproduces {e.reproduced} of {e.differing} differing elements, predicts "
              f"{e.spurious:.0%} that did not happen, error norm down {e.reduction:.0%}; not a match")
        conf = round(0.7 * e.score, 3)
    elif e.nan_rows_same and e.reproduced > 0 and e.spurious <= NEAR_SPURIOUS:
        ev = (f"mutant {m.key} puts NaN in exactly the rows where the implementation has NaN and the reference "
              f"has none; it reproduces {e.reproduced} of {e.differing} differing elements; not a match")
        conf = round(0.5 * (1.0 - e.spurious), 3)
    else:
        return None
    return {"kind": "nearest", "pitfall": m.pitfall, "mutant": m.key, "family": family(m), "row": m.row,
            "text": f"closest catalogued pitfall `{m.pitfall}` (docs/pitfalls.md: {m.row})", "evidence": ev,
            "confidence": conf}


class Diagnoser:
    """Diagnoses failing cases of one run; caches each mutant's outputs per case.

    ``catalog`` (default: the whole mutant catalog) is what is searched: a leave-one-out
    measurement passes the catalog without one entry."""

    def __init__(self, max_cases: int = MAX_CASES, catalog=None, structure: bool = True,
                 pictures: int = MAX_PICTURES):
        self.max_cases = max_cases
        self.pictures = pictures
        self._maps = None
        self.done = 0
        self.catalog = catalog
        self.structure = structure
        self._cache: dict = {}

    def _mutants(self, op: str) -> list:
        if self.catalog is None:
            from conformance import mutants

            return mutants.for_op(op)
        return [m for m in self.catalog if m.op == op]

    def mutant_outputs(self, vec, mutant):
        key = (vec.case, mutant.key)
        if key not in self._cache:
            try:
                with np.errstate(all="ignore"):
                    out = dict(getattr(mutant, vec.op)(**_fresh(vec)))
                ok = all(n in out and np.shape(out[n]) == np.shape(vec.expected[n]) for n in vec.outputs)
                self._cache[key] = out if ok else None
            except Exception:  # noqa: BLE001 - a mutant that cannot run this case matches nothing
                self._cache[key] = None
        return self._cache[key]

    def twin_outputs(self, vec, mutant):
        key = (vec.case, mutant.key, "twin")
        if key not in self._cache:
            self._cache[key] = mt.twin(vec, mutant)
        return self._cache[key]

    def _with_scales(self, vec, spec, mutant, out) -> dict:
        key = (vec.case, mutant.key, "scaled")
        if key not in self._cache:
            kw = (lambda: mutant.change(_fresh(vec))) if mt.pure_args(mutant) else (lambda: _fresh(vec))
            self._cache[key] = mt.reference_for(vec, spec, out, kw)
        return self._cache[key]

    def _shows(self, vec, mutant, out) -> str | None:
        """Why the mutant FAILs against the reference (``why_fail``), None where it does not."""
        key = (vec.case, mutant.key, "shows")
        if key not in self._cache:
            try:
                self._cache[key] = why_fail(vec, out)
            except Exception:  # noqa: BLE001 - undecidable: no evidence
                self._cache[key] = None
        return self._cache[key]

    def analyse(self, vec, impl: Mapping) -> tuple[list[Match], list[dict]]:
        from conformance import registry

        spec = registry.ops().get(vec.op)
        sref = suite_reference(vec, spec, impl)
        maps = ex.error_maps(vec, impl, sref, sref)
        self._maps = maps
        diff = ex.difference(maps)
        impl_nans = ex.nan_rows(vec, impl, vec.expected)
        beyond = any(bool((e > 1.0).any()) for e in maps.values())
        reason = None if beyond else why_fail(vec, impl, spec)
        if not beyond and reason is None:  # inside every allowance and no FAIL: nothing to explain
            return [], []
        found, near, rest = [], [], []
        for m in self._mutants(vec.op):
            out = self.mutant_outputs(vec, m)
            if out is None:
                continue
            e = ex.explain(vec, impl, maps, diff, m.key, out, impl_nans, self._with_scales(vec, spec, m, out))
            # a mutant explains the FAIL only where it leaves a much smaller error than the reference
            # does and predicts little that did not happen; one whose bug does not show here (a GQA
            # mapping bug with Hq = Hk) leaves the error as it was
            explains = e.explained >= 0.5 and e.reduction >= MATCH_REDUCTION and e.spurious <= MATCH_SPURIOUS
            if not beyond:  # a bias, normwise or storage FAIL, every element inside its allowance
                # (truncation): the element errors say nothing; a mutant that FAILs for the same
                # reason may explain it, and the comparison against it (its bias test included) decides
                explains = reason is not None and self._shows(vec, m, out) == reason
            if explains:
                j = mt.judge(vec, spec, m, impl, out, self.twin_outputs(vec, m))
            else:  # bit-identical to a mutant: the FAIL is the mutant's own
                j = mt.Judged(Result.PASS, 0.0, True, "bit-identical to the mutant") if mt.equal(vec, impl, out) \
                    else None
            if j is not None and (j.exact or explains):
                found.append(Match(m.pitfall, m.key, m.row, j.exact, 0.0 if j.exact else j.frac, j.result.name,
                                   family(m), j.how, 1.0 if j.exact else e.explained, 0.0 if j.exact else e.spurious,
                                   1.0 if j.exact else e.reduction))
            else:
                h = _near_hypothesis(m, e)
                if h is not None:
                    near.append(h)
                else:
                    rest.append(m)
        found.sort(key=lambda x: x.rank)
        hyps = [_match_hypothesis(x) for x in found]
        near.sort(key=lambda h: -h["confidence"])
        shapes = []
        if self.structure and len(hyps) < TOP:
            try:
                shapes = structure.signatures(vec, spec, impl, maps, diff, reruns=not found)
            except Exception:  # noqa: BLE001 - a signature search that breaks adds nothing
                pass
        # a signature that is on its own a family's mechanism names that family (diagnosis.mechanism); it
        # describes the whole difference, so it goes before the variants' weaker evidence, which then stays out
        shapes = mechanism.readings(vec, impl, shapes)
        read = any(h.get("kind") == "family" for h in shapes)
        if not found:
            # a reading explains the whole difference (the output conforms to the mechanism), a nearest
            # mutant part of it: the readings go first, then the nearest mutants, then the other signatures
            hyps += [h for h in shapes if h.get("kind") == "family"] + near
            shapes = [h for h in shapes if h.get("kind") != "family"]
        if not found and not near and rest and not read:  # a sibling bug (diagnosis.family)
            signed = fm.signed(vec, maps, impl, sref)
            masks = compare.full_masks(vec.outputs, vec.expected, vec.masks)
            ev = [(m, fm.evidence(vec, signed, diff, m.key,
                                  self._with_scales(vec, spec, m, self.mutant_outputs(vec, m)), masks))
                  for m in rest if (vec.op, family(m)) not in mechanism.DECISIVE]
            hyps += fm.hypotheses(ev, family, shapes)
        return found, (hyps + shapes)[:TOP]

    def matches(self, vec, impl: Mapping) -> list[Match]:
        return self.analyse(vec, impl)[0]

    def __call__(self, vec, impl: Mapping) -> dict:
        """``{"matches": Diagnosis([...]), "note": "..."}`` for one failing case."""
        if self.done >= self.max_cases:
            return {"matches": Diagnosis(op=vec.op, flags=vec.flags),
                    "note": f"not diagnosed (more than {self.max_cases} failing cases in this run)"}
        self.done += 1
        try:
            found, hyps = self.analyse(vec, impl)
        except Exception as exc:  # noqa: BLE001 - diagnosis never changes a verdict
            return {"matches": Diagnosis(op=vec.op, flags=vec.flags),
                    "note": f"diagnosis failed: {type(exc).__name__}: {exc}"}
        recs = [x.record() for x in found]
        for x, rec in zip(found, recs):
            rec["tie"] = x.rank == found[0].rank
        d = Diagnosis(recs, hyps, vec.op, vec.flags)
        if self.pictures > 0 and self._maps is not None:  # the error's picture (HTML report), a few per run
            self.pictures -= 1
            try:
                d.grids = picture.grids(self._maps, compare.full_masks(vec.outputs, vec.expected, vec.masks))
            except Exception:  # noqa: BLE001, S110 - no picture is no verdict change
                pass
        return {"matches": d, "note": note(recs, hyps, vec, impl)}


def suite_reference(vec, spec, impl) -> dict:
    """The reference each output is judged against, as ``compare`` builds it: where the Op follows
    an implementation's intermediate (the conv's finish delta), the outputs after it recomputed from
    the implementation's value, with their magnitudes."""
    ref = dict(vec.expected)
    if spec is None or spec.follow is None:
        return ref
    try:
        with np.errstate(all="ignore"):
            fresh = compare._with_scales(spec, lambda: _fresh(vec), spec.follow(_fresh(vec), impl))
    except Exception:  # noqa: BLE001 - the suite reports that failure itself: judge against the stored one
        return ref
    ref.update({k: v for k, v in fresh.items() if k.split(".")[0] in vec.outputs
                and k.split(".")[0] not in spec.followed})
    return ref


def why_fail(vec, out, spec=None) -> str | None:
    """Why ``out`` FAILs against the reference: "storage" (values outside their format), "bias",
    "envelope" (outside it), "other"; None where it does not FAIL."""
    from conformance import invoke, registry

    arrays = {n: np.asarray(out[n]) for n in vec.outputs}
    checked, bad = invoke.check_outputs(vec, arrays, list(arrays))
    if bad:
        return "storage"
    spec = spec if spec is not None else registry.ops().get(vec.op)
    with np.errstate(all="ignore"):
        v = compare.compare(vec.outputs, vec.expected, checked, vec.masks, vec.bounds, None,
                            lambda: _fresh(vec), spec=spec)
    if not v.result.failed:
        return None
    if "systematic bias" in v.detail:
        return "bias"
    return "envelope" if "outside the envelope" in v.detail else "other"


def note(found: list[dict], hyps: list[dict], vec, impl) -> str:
    if found:
        best = found[0]
        tied = [x for x in found[1:] if x.get("tie")]
        rest = [x for x in found[1:] if not x.get("tie")]
        text = f"matches pitfall `{best['pitfall']}` (docs/pitfalls.md: {best['row']})"
        if tied:  # the case cannot tell them apart; the run may (``finalize``)
            text += "; equally " + ", ".join(f"`{x['pitfall']}`" for x in tied[:3]) + " (the same on this case)"
        if rest:
            text += "; also " + ", ".join(f"`{x['pitfall']}`" for x in rest[:3])
        return text
    text = f"matches no catalog pitfall; first divergence: {first_divergence(vec, impl)}"
    near = [h for h in hyps if h["kind"] == "nearest"]
    if near:
        text += f"; {near[0]['text']}: {near[0]['evidence']}"
    fams = [h for h in hyps if h["kind"] == "family"]
    if fams:
        text += f"; {fams[0]['text']}: {fams[0]['evidence']}"
    shapes = [h for h in hyps if h["kind"] == "structure"]
    if shapes:
        text += f"; error structure: {shapes[0]['text']}"
    return text


def hypotheses(r) -> list[dict]:
    """The ranked hypotheses of a result (empty where it was not diagnosed)."""
    return list(getattr(getattr(r, "diagnosis", None), "hypotheses", []) or [])


def finalize(results) -> None:
    """Once a run is over: the run-level symptoms (flags over-represented among an Op's failing
    cases) join each FAIL's hypotheses where the case carries the flag, after the stronger ones.
    Idempotent."""
    found = symptoms.flag_symptoms(results)
    # mutants tied first on a case (the same outputs there) go by how many of the Op's FAILs in
    # the run each one matches: an off-by-one window and a dropped one agree where few keys are live,
    # not over the run
    counts = Counter((r.op, x["mutant"]) for r in results if r.result == Result.FAIL
                     for x in (getattr(r, "diagnosis", None) or []))
    for r in results:
        d = getattr(r, "diagnosis", None)
        if r.result != Result.FAIL or not isinstance(d, Diagnosis):
            continue
        tied = [x for x in d if x.get("tie")]
        if len(tied) > 1:
            tied.sort(key=lambda x: -counts[(r.op, x["mutant"])])  # stable: catalog order among equals
            d[:len(tied)] = tied
            order = {x["mutant"]: i for i, x in enumerate(tied)}
            m = [h for h in d.hypotheses if h["kind"] == "match" and h["mutant"] in order]
            m.sort(key=lambda h: order[h["mutant"]])
            others = [h for h in d.hypotheses if not (h["kind"] == "match" and h["mutant"] in order)]
            d.hypotheses = m + others
            if getattr(r, "diagnosis_note", "").startswith("matches pitfall"):
                r.diagnosis_note = note(list(d), d.hypotheses, None, None)
        d.hypotheses = [h for h in d.hypotheses if h["kind"] != "symptom"]
        for s in found.get(r.op, []):
            if s["flag"] in r.flags and len(d.hypotheses) < TOP:
                d.hypotheses.append(symptoms.hypothesis(s))


def named(r) -> str | None:
    """The pitfall a result's diagnosis names first (a match or a closest mutant), or None."""
    hs = hypotheses(r)
    if hs:  # the first hypothesis, when it is a structure or a symptom, names none
        return hs[0].get("pitfall")
    d = getattr(r, "diagnosis", None) or []
    return d[0]["pitfall"] if d else None


def summary(results) -> list[tuple[str, int]]:
    """Pitfalls ranked by how many failing cases name them first (after ``finalize``)."""
    finalize(results)
    c = Counter()
    for r in results:
        d = getattr(r, "diagnosis", None) or []
        if d:
            c[d[0]["pitfall"]] += 1
    return c.most_common()


def summary_text(results) -> str:
    ranked = summary(results)
    fails = sum(1 for r in results if r.result == Result.FAIL)
    if not fails:
        return ""
    explained = sum(n for _, n in ranked)
    lines = [f"diagnosis: {explained} of {fails} FAIL(s) reproduced by a catalog pitfall"]
    lines += [f"  {n:4d}  {p}" for p, n in ranked]
    near = Counter(h["pitfall"] for r in results if r.result == Result.FAIL and not getattr(r, "diagnosis", None)
                   for h in hypotheses(r)[:1] if h["kind"] == "nearest")
    if near:
        lines.append("  closest catalogued pitfall where none matches:")
        lines += [f"  {n:4d}  {p} (closest, not a match)" for p, n in near.most_common()]
    for op, ss in sorted(symptoms.flag_symptoms(results).items()):
        s = ss[0]
        lines.append(f"  symptom {op}: {s['failing_with']} of {s['with']} cases flagged `{s['flag']}` FAIL, "
                     f"{s['failing_without']} of {s['without']} without it")
    return "\n".join(lines)
