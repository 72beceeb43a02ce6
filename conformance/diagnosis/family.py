"""The family hypothesis: a bug of a catalogued family that no variant of the catalog reproduces.

A family (``Mutant.family``) is one mechanism written several ways: a window off by one in the
reader or in the writer, epsilon inside or outside the square root. A real engine with a bug of
that mechanism usually is none of the written variants; it changes the *same elements* in the
*same direction* as one of them, with other values. So where no mutant matches and none is the
closest (``conformance.diagnose``), each variant is compared with the implementation on two
properties of the difference rather than on its values:

- *where*: the region. D is the set of elements over the allowance (implementation against the
  reference), P the set the variant predicts (the variant over twice the allowance against the
  reference, the threshold ``explain`` uses: both round). Both are coarsened to rows (an output
  and every index but the last: a token, a head, a slot), since a sibling bug moves the same rows
  but not always the same columns of them. The overlap is the Jaccard index |R_D & R_P| / |R_D | R_P|.
- *how*: the signed deviations. Per element of D | P the deviation from the reference in units of
  the allowance, signed, compressed as sign(d) log2(1 + |d|) (a wrong decision or a non-finite
  value, capped at ``explain.WRONG``, weighs about 20, a borderline rounding 1: the log keeps one
  huge element from deciding alone); for a decision or exact output the sign is +1, so there the
  cosine is the overlap of the changed positions (Ochiai). The agreement is the cosine of the
  implementation's vector and the variant's.

Thresholds, from what the two numbers mean rather than fitted to the catalog:

- ``REGION = 0.5``: at least half of the rows either touches are touched by both: the two
  differences are mostly the same region. A bug of another mechanism that touches everything
  (a constant scale of the output) overlaps a variant that touches everything, so the region
  alone never names a family;
- ``AGREE = 0.5`` and at least ``SIGMAS / sqrt(n)``: the deviations are within 60 degrees of each
  other, and beyond what chance gives. Two unrelated difference vectors of n elements with
  independent signs have a cosine of mean 0 and standard deviation about 1/sqrt(n), so
  ``SIGMAS = 3`` standard deviations is the bar for small n; for large n the 60-degree bar
  decides. A constant scale or offset (a bug outside every family) has deviations of one sign
  pattern (the reference's sign, or +1): a variant that moves the same elements by a
  data-dependent amount (a window, a rotation, a head mapping) is near orthogonal to it;
- ``MARGIN``: the family's best score (overlap x cosine) must be twice the best score of every
  other family's variants, passing or not. A family hypothesis claims "this mechanism
  rather than another"; where two mechanisms move the same rows the same way (an RNG key and a
  tie rule both reshuffle the same draws) the evidence does not say which, and no family is named;
- where the differences are decisions or a few elements (n small), the sign test above cannot
  reach 3 standard deviations (n = 1: never), yet a variant that changes *exactly* the few tokens
  that differ out of hundreds compared is no coincidence. The chance of that is the hypergeometric
  tail (``chance``): a variant changing p of the N compared elements at random hits at least k of
  the d differing ones with probability P(X >= k), X ~ Hypergeometric(N, p, d). ``ALPHA`` is the
  one-sided tail of ``SIGMAS`` standard deviations (0.00135): the same bar, counted on the support
  instead of on the signs. The cosine (at least ``AGREE``) is still required on this path;
- the *support* path: mechanisms that mix many inputs into every output (a ring slot off by one,
  a tap layout, a selector row) move the same elements as their siblings with signs that depend
  on the data, so the cosine says nothing; the elements they move are the evidence. A variant
  passes on its support when its element-level Jaccard index |D & P| / |D | P| is at least
  ``SUPPORT = 0.5`` (most of what either changes, both change: ``REGION`` at element level), the
  overlap is not chance (``ALPHA``), and the difference does not cover nearly every compared
  element (at most ``COVER = 0.9`` of them): a difference everywhere (a scale, an offset of a
  whole cache) overlaps every variant that changes everything, and its support says nothing;
- each path compares a family only with its own measure (overlap x cosine, or the support index)
  and names it only at ``MARGIN = 2`` times every other family's best on that measure; where the
  two paths would name different families, none is named. (At 1.5 the leave-one-out measurement,
  docs/reports/diagnosis.md, named another family first more often than at 2: a wrong name is
  worse than none);
- a structural signature that accounts for every compared element by a transform of the
  reference's own values (``COMPLETE``: a constant scale, a constant offset, a mirrored order) is
  a full description of the difference, and no family of the catalog is such a transform: no
  family is named then (a 2% scale of the attention output otherwise looks, in sign pattern, like
  a ring read one slot off, which also moves every row).

What this reaches, and what it does not (docs/reports/diagnosis.md measures it): the two
properties are *necessary* for a sibling, not sufficient to single its family out. Mechanisms
that mix many inputs into every output (attention windows, head maps, RoPE, rounding) move the
same rows with weakly correlated signs, so many siblings' cosines stay under the bar and the
hypothesis is honestly absent; and a variant of one family can move the same rows the same way
as another family's (capture vs the norm on feature_capture), which the margin catches only in part.

The confidence is ``CONFIDENCE x overlap x cosine`` (``x support`` on the support path), at most
0.45: always below a match (0.95 x explained) and below a closest mutant of the same evidence
(0.7 x score), since a family hypothesis says "this mechanism", not "this bug". The evidence
names the closest variants and the numbers of its path (overlap and cosine; or the elements
shared, the Jaccard index and the chance). Cost: the variants' outputs are those the diagnosis computed already;
two error maps per variant, nothing when a match or a closest mutant is found.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from conformance.diagnosis.explain import error_maps
from conformance.registry import REPRESENTED

REGION = 0.5
AGREE = 0.5
SIGMAS = 3.0
MARGIN = 2.0
ALPHA = 0.00135  # one-sided normal tail at SIGMAS = 3
SUPPORT = 0.5
COVER = 0.9
# structural signatures that account for every compared element by a transform of the reference's own
# values: no family's mechanism is one of these (module doc)
COMPLETE = ("constant scale", "constant offset", "mirrored")
CONFIDENCE = 0.45
PREDICTED = 2.0  # a variant's element is predicted to differ over twice the allowance (as ``explain``)


def signed(vec, maps: Mapping, x: Mapping, r: Mapping) -> dict[str, np.ndarray]:
    """The error maps (multiples of the allowance) with the sign of x - r; +1 for decisions and
    non-finite values."""
    out = {}
    for name, o in vec.outputs.items():
        e = np.asarray(maps[name], np.float64)
        if o.cls == REPRESENTED and np.shape(x[name]) == np.shape(r[name]):
            with np.errstate(all="ignore"):
                d = np.asarray(x[name]).astype(np.float64) - np.asarray(r[name]).astype(np.float64)
            s = np.where(np.isfinite(d), np.sign(d), 1.0)
            out[name] = np.where(s == 0, 1.0, s) * e
        else:
            out[name] = e
    return out


def chance(total: int, p: int, d: int, k: int) -> float:
    """P(X >= k), X ~ Hypergeometric(total, p, d): a variant changing p of ``total`` elements at
    random hits at least k of the d differing ones."""
    if k <= 0:
        return 1.0
    if k > min(p, d) or total <= 0:
        return 0.0
    if k <= p * d / total:  # at or below the mean: no evidence
        return 1.0

    def log_binom(a, b):
        return math.lgamma(a + 1) - math.lgamma(b + 1) - math.lgamma(a - b + 1)

    norm = log_binom(total, d)
    out = 0.0
    for i in range(k, min(p, d) + 1):  # terms fall beyond the mean: stop once negligible
        if d - i > total - p:
            continue
        t = math.exp(log_binom(p, i) + log_binom(total - p, d - i) - norm)
        out += t
        if t < 1e-12 * out:
            break
    return min(out, 1.0)


def _rows(mask: np.ndarray) -> np.ndarray:
    return mask.reshape(-1) if mask.ndim <= 1 else mask.any(axis=-1).reshape(-1)


@dataclass
class Evidence:
    mutant: str
    overlap: float  # Jaccard index of the rows differing and the rows predicted
    cosine: float  # of the compressed signed deviations over D | P
    n: int  # elements in D | P
    d: int = 0  # elements differing (D)
    p: int = 0  # elements predicted (P)
    k: int = 0  # elements in both
    total: int = 0  # elements compared

    @property
    def chance(self) -> float:
        return chance(self.total, self.p, self.d, self.k)

    @property
    def support(self) -> float:
        """Element-level Jaccard index of the elements differing and predicted."""
        u = self.d + self.p - self.k
        return self.k / u if u > 0 else 0.0

    @property
    def agrees(self) -> bool:
        """The same rows, the same direction, beyond chance (signs or support)."""
        return self.overlap >= REGION and self.cosine >= AGREE and (
            self.cosine >= SIGMAS / np.sqrt(max(self.n, 1)) or self.chance <= ALPHA)

    @property
    def covers(self) -> bool:
        """The same elements, beyond chance, where the difference is not everywhere."""
        return (self.overlap >= REGION and self.support >= SUPPORT and self.d <= COVER * self.total
                and self.chance <= ALPHA)

    @property
    def passes(self) -> bool:
        return self.agrees or self.covers

    @property
    def score(self) -> float:
        return self.overlap * max(self.cosine, 0.0)


def evidence(vec, impl_signed: Mapping, diff: Mapping, mutant_key: str, ref_m: Mapping,
             masks: Mapping | None = None) -> Evidence:
    """``impl_signed``: ``signed`` of the implementation against the reference; ``diff``: its
    difference; ``ref_m``: the variant's outputs with their magnitudes (``match.reference_for``)."""
    pm = error_maps(vec, ref_m, vec.expected)
    mut = signed(vec, pm, ref_m, vec.expected)
    rows_both = rows_any = 0
    dot = ni = nm = 0.0
    n = nd = np_ = nk = total = 0
    for name in vec.outputs:
        d, p = diff[name], np.abs(mut[name]) > PREDICTED
        if d.shape != p.shape:
            continue
        nd, np_, nk = nd + int(d.sum()), np_ + int(p.sum()), nk + int((d & p).sum())
        total += int(masks[name].sum()) if masks is not None and np.shape(masks[name]) == d.shape else d.size
        rd, rp = _rows(d), _rows(p)
        rows_both += int((rd & rp).sum())
        rows_any += int((rd | rp).sum())
        u = d | p
        n += int(u.sum())
        if not u.any():
            continue
        a, b = impl_signed[name][u], mut[name][u]
        a = np.sign(a) * np.log2(1.0 + np.abs(a))
        b = np.sign(b) * np.log2(1.0 + np.abs(b))
        dot += float(a @ b)
        ni += float(a @ a)
        nm += float(b @ b)
    overlap = rows_both / rows_any if rows_any else 0.0
    cosine = dot / np.sqrt(ni * nm) if ni > 0 and nm > 0 else 0.0
    return Evidence(mutant_key, float(overlap), float(cosine), n, nd, np_, nk, total)


def hypotheses(found: list[tuple[object, Evidence]], family_of, shapes=()) -> list[dict]:
    """At most one family hypothesis: ``found`` pairs a mutant with its evidence; ``family_of(mutant)``
    is its family; ``shapes``: the structural signatures found (a complete value transform of the
    reference, ``COMPLETE``, rules every family out)."""
    if any(h.get("signature") in COMPLETE for h in shapes):
        return []
    named: dict[str, tuple] = {}  # family -> (path, its best evidence, closest variants)
    for path, ok, measure in (("direction", lambda e: e.agrees, lambda e: e.score),
                              ("support", lambda e: e.covers, lambda e: e.support)):
        by: dict[str, list] = {}
        best: dict[str, float] = {}
        for m, e in found:
            f = family_of(m)
            best[f] = max(best.get(f, 0.0), measure(e))
            if ok(e):
                by.setdefault(f, []).append((m, e))
        for fam, items in by.items():
            rival = max((s for f, s in best.items() if f != fam), default=0.0)
            top = max(measure(e) for _, e in items)
            if top <= 0 or top < MARGIN * rival:  # not clearly closer than another family
                continue
            items.sort(key=lambda t: -measure(t[1]))
            if fam not in named:
                named[fam] = (path, items)
    if len(named) != 1:  # none, or the two paths disagree: no family is named
        return []
    fam, (path, items) = next(iter(named.items()))
    m, e = items[0]
    closest = ", ".join(f"{x.key}" for x, _ in items[:3])
    if path == "direction":
        ev = (f"variant {m.key} changes the same rows ({e.overlap:.0%} overlap of the rows differing and "
              f"predicted) in the same direction (cosine {e.cosine:.2f} of the signed deviations over {e.n} "
              "elements, allowance units); not a match")
        conf = CONFIDENCE * e.score
    else:
        ev = (f"variant {m.key} changes the same elements: {e.k} of the {e.d} differing and of its {e.p} "
              f"predicted, out of {e.total} compared (Jaccard {e.support:.2f}; chance {e.chance:.1g}); the "
              "values differ; not a match")
        conf = CONFIDENCE * e.overlap * e.support
    return [{"kind": "family", "family": fam, "mutant": m.key, "row": m.row,
             "text": f"a bug of the `{fam}` family (docs/pitfalls.md); closest variants: {closest}",
             "evidence": ev, "confidence": round(conf, 3)}]
