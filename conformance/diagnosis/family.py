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
- ``MARGIN = 1.5``: the family's best score (overlap x cosine) must be half again the best score
  of every other family's variants, passing or not. A family hypothesis claims "this mechanism
  rather than another"; where two mechanisms move the same rows the same way (an RNG key and a
  tie rule both reshuffle the same draws) the evidence does not say which, and no family is named;
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

The confidence is ``CONFIDENCE x overlap x cosine``, at most 0.45: always below a match (0.95 x
explained) and below a closest mutant of the same evidence (0.7 x score), since a family
hypothesis says "this mechanism", not "this bug". The evidence names the closest variants, the
overlap and the cosine. Cost: the variants' outputs are those the diagnosis computed already;
two error maps per variant, nothing when a match or a closest mutant is found.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from conformance.diagnosis.explain import error_maps
from conformance.registry import REPRESENTED

REGION = 0.5
AGREE = 0.5
SIGMAS = 3.0
MARGIN = 1.5
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


def _rows(mask: np.ndarray) -> np.ndarray:
    return mask.reshape(-1) if mask.ndim <= 1 else mask.any(axis=-1).reshape(-1)


@dataclass
class Evidence:
    mutant: str
    overlap: float  # Jaccard index of the rows differing and the rows predicted
    cosine: float  # of the compressed signed deviations over D | P
    n: int  # elements in D | P

    @property
    def passes(self) -> bool:
        return self.overlap >= REGION and self.cosine >= max(AGREE, SIGMAS / np.sqrt(max(self.n, 1)))

    @property
    def score(self) -> float:
        return self.overlap * max(self.cosine, 0.0)


def evidence(vec, impl_signed: Mapping, diff: Mapping, mutant_key: str, ref_m: Mapping) -> Evidence:
    """``impl_signed``: ``signed`` of the implementation against the reference; ``diff``: its
    difference; ``ref_m``: the variant's outputs with their magnitudes (``match.reference_for``)."""
    pm = error_maps(vec, ref_m, vec.expected)
    mut = signed(vec, pm, ref_m, vec.expected)
    rows_both = rows_any = 0
    dot = ni = nm = 0.0
    n = 0
    for name in vec.outputs:
        d, p = diff[name], np.abs(mut[name]) > PREDICTED
        if d.shape != p.shape:
            continue
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
    return Evidence(mutant_key, float(overlap), float(cosine), n)


def hypotheses(found: list[tuple[object, Evidence]], family_of, shapes=()) -> list[dict]:
    """At most one family hypothesis: ``found`` pairs a mutant with its evidence; ``family_of(mutant)``
    is its family; ``shapes``: the structural signatures found (a complete value transform of the
    reference, ``COMPLETE``, rules every family out)."""
    if any(h.get("signature") in COMPLETE for h in shapes):
        return []
    by: dict[str, list] = {}
    best: dict[str, float] = {}
    for m, e in found:
        f = family_of(m)
        best[f] = max(best.get(f, 0.0), e.score)
        if e.passes:
            by.setdefault(f, []).append((m, e))
    out = []
    for fam, items in by.items():
        rival = max((s for f, s in best.items() if f != fam), default=0.0)
        if max(e.score for _, e in items) < MARGIN * rival:  # not clearly closer than another family
            continue
        items.sort(key=lambda t: -t[1].score)
        m, e = items[0]
        closest = ", ".join(f"{x.key}" for x, _ in items[:3])
        out.append({"kind": "family", "family": fam, "mutant": m.key, "row": m.row,
                    "text": f"a bug of the `{fam}` family (docs/pitfalls.md); closest variants: {closest}",
                    "evidence": (f"variant {m.key} changes the same rows ({e.overlap:.0%} overlap of the rows "
                                 f"differing and predicted) in the same direction (cosine {e.cosine:.2f} of the "
                                 f"signed deviations over {e.n} elements, allowance units); not a match"),
                    "confidence": round(CONFIDENCE * e.score, 3)})
    out.sort(key=lambda h: -h["confidence"])
    return out
