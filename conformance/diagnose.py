"""Diagnosis of a FAIL: which known bug reproduces the implementation's output?

For a failing case, every one-bug variant of the reference in the catalog (``conformance.mutants``,
the mutants, one per docs/pitfalls.md row or case flag) that belongs to the case's Op is run on the
case's inputs. A mutant *matches* when the implementation's outputs are inside that mutant's
outputs' tight bound or accuracy envelope: ``conformance.compare.compare`` with the mutant's
outputs as the reference (the vector's bounds, masks, magnitudes and margins), so the verdict
classes are exactly those of the suite. Matches rank best first: bit-for-bit agreement on every
compared element, then the smaller fraction of the envelope (or of the tight bound) used.

Where nothing matches, the diagnosis says so and names the first diverging element of the first
output that differs from the reference.

Cost: nothing when nothing fails; per failing case one call of each mutant of its Op (cached per
case and mutant), and at most ``max_cases`` failing cases per run (later ones say "not diagnosed").
Mutants are trusted reference code and run in the harness process.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from conformance import compare
from conformance.compare import Result
from conformance.registry import REPRESENTED

MAX_CASES = 200


@dataclass
class Match:
    pitfall: str
    mutant: str  # the catalog key
    row: str  # the docs/pitfalls.md row it stands for
    exact: bool  # every compared element equal to the mutant's output
    frac: float  # worst fraction of the mutant's envelope (tight bound where no envelope) used
    result: str  # PASS or ACCEPTABLE against the mutant

    def record(self) -> dict:
        return {"pitfall": self.pitfall, "mutant": self.mutant, "row": self.row, "exact": self.exact,
                "frac": None if not np.isfinite(self.frac) else round(float(self.frac), 4), "result": self.result}


def _fresh(vec) -> dict:
    return {**{k: np.array(v, copy=True) for k, v in vec.inputs.items()}, **dict(vec.params)}


def _equal(vec, impl: Mapping, ref: Mapping) -> bool:
    masks = compare.full_masks(vec.outputs, vec.expected, vec.masks)
    for name in vec.outputs:
        a, b = np.asarray(impl[name]), np.asarray(ref[name])
        if a.shape != b.shape:
            return False
        m = masks[name]
        if vec.outputs[name].cls == REPRESENTED:
            a, b = a.astype(np.float64), b.astype(np.float64)
            same = (a == b) | (np.isnan(a) & np.isnan(b))
        else:
            same = a == b
        if not np.all(same | ~m):
            return False
    return True


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


class Diagnoser:
    """Diagnoses failing cases of one run; caches each mutant's outputs per case."""

    def __init__(self, max_cases: int = MAX_CASES):
        self.max_cases = max_cases
        self.done = 0
        self._cache: dict = {}

    def mutant_outputs(self, vec, mutant):
        key = (vec.case, mutant.key)
        if key not in self._cache:
            try:
                with np.errstate(all="ignore"):
                    self._cache[key] = dict(getattr(mutant, vec.op)(**_fresh(vec)))
            except Exception:  # noqa: BLE001 - a mutant that cannot run this case matches nothing
                self._cache[key] = None
        return self._cache[key]

    def changes_case(self, vec, mutant, out) -> bool:
        """Whether the mutant's bug shows on this case at all (its outputs FAIL against the
        reference): one that changes nothing here (a GQA mapping bug with Hq = Hk) explains no FAIL."""
        from conformance import invoke, registry

        key = (vec.case, mutant.key, "changes")
        if key not in self._cache:
            try:
                arrays = {n: np.asarray(out[n]) for n in vec.outputs}
                checked, bad = invoke.check_outputs(vec, arrays, list(arrays))
                if bad:  # values outside the storage format (context V not BF16 values): the runner FAILs it
                    self._cache[key] = True
                    return True
                with np.errstate(all="ignore"):
                    v = compare.compare(vec.outputs, vec.expected, checked, vec.masks, vec.bounds, None,
                                        lambda: _fresh(vec), spec=registry.ops().get(vec.op))
                self._cache[key] = v.result.failed
            except Exception:  # noqa: BLE001 - undecidable: keep the mutant as a candidate
                self._cache[key] = True
        return self._cache[key]

    def matches(self, vec, impl: Mapping) -> list[Match]:
        from conformance import mutants

        found = []
        for m in mutants.for_op(vec.op):
            out = self.mutant_outputs(vec, m)
            if out is None or any(n not in out for n in vec.outputs) or not self.changes_case(vec, m, out):
                continue
            ref = {**vec.expected, **{n: np.asarray(out[n]) for n in vec.outputs}}
            try:
                with np.errstate(all="ignore"):
                    v = compare.compare(vec.outputs, ref, impl, vec.masks, vec.bounds, None, lambda: _fresh(vec))
            except Exception:  # noqa: BLE001, S112 - a comparison that cannot use the mutant's outputs: no match
                continue
            if v.result not in (Result.PASS, Result.ACCEPTABLE):
                continue
            exact = _equal(vec, impl, ref)
            frac = v.numbers.get("envelope_frac")
            if frac is None:
                frac = v.numbers.get("tight_frac", 0.0) or 0.0
            found.append(Match(m.pitfall, m.key, m.row, exact, 0.0 if exact else float(frac), v.result.name))
        found.sort(key=lambda x: (not x.exact, x.frac, x.mutant))
        return found

    def __call__(self, vec, impl: Mapping) -> dict:
        """``{"matches": [...], "note": "..."}`` for one failing case."""
        if self.done >= self.max_cases:
            return {"matches": [], "note": f"not diagnosed (more than {self.max_cases} failing cases in this run)"}
        self.done += 1
        try:
            found = self.matches(vec, impl)
        except Exception as exc:  # noqa: BLE001 - diagnosis never changes a verdict
            return {"matches": [], "note": f"diagnosis failed: {type(exc).__name__}: {exc}"}
        if found:
            best = found[0]
            return {"matches": [x.record() for x in found],
                    "note": f"matches pitfall `{best.pitfall}` (docs/pitfalls.md: {best.row})"
                            + (f"; also {', '.join(f'`{x.pitfall}`' for x in found[1:4])}" if len(found) > 1 else "")}
        return {"matches": [], "note": f"matches no catalog pitfall; first divergence: {first_divergence(vec, impl)}"}


def summary(results) -> list[tuple[str, int]]:
    """Pitfalls ranked by how many failing cases name them first."""
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
    return "\n".join(lines)
