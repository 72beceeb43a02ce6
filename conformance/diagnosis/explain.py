"""How much of an observed difference a mutant explains, element by element.

Every compared element of every output gets an error in units of what the suite allows there:
a represented output's |x - r| / (u s) over the componentwise envelope k (the ULP error over the
tight bound where the Op has no envelope); a decision or exact output 0 where equal, ``WRONG``
where not. The elements over 1 are the *difference* D of the implementation from the reference.
A mutant M *reproduces* an element of D when the implementation is within the (doubled: both
round) allowance of M there; it *predicts* an element when M itself is over 1 against the
reference there. From those: the fraction of D reproduced, the fraction of the predicted
elements that did not happen (spurious), and how much the error norm falls when M replaces the
reference (reduction). A mutant that explains a difference reproduces most of D, predicts little
else, and leaves a much smaller error.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from conformance import compare, registry
from conformance.registry import REPRESENTED
from reference import numerics

WRONG = 1e6  # the error of a wrong decision, a non-finite mismatch (capped so that norms stay finite)


def error_map(o, bound: Mapping, x, r, mask, scale=None) -> np.ndarray:
    """Per element: the error as a multiple of what the suite allows there (0 outside the mask)."""
    x, r = np.asarray(x), np.asarray(r)
    if o.cls != REPRESENTED:
        return np.where(mask & (x != r), WRONG, 0.0)
    x64, r64 = x.astype(np.float64), r.astype(np.float64)
    same = (x64 == r64) | (np.isnan(x64) & np.isnan(r64))
    env = bound.get("envelope")
    with np.errstate(all="ignore"):
        # inside the tight bound, or inside the componentwise envelope: the suite's two allowances
        bu = float(bound.get("bound_ulp", 0.0))
        u_err = numerics.ulp_error(x64, r64, o.fmt)
        e = u_err / bu if bu > 0 else np.where(u_err > 0, WRONG, 0.0)
        if env is not None and scale is not None:
            u = compare.unit(o.value_fmt)
            s = np.asarray(scale, np.float64) + registry.FTZ_FLOOR / u
            e = np.fmin(e, np.abs(x64 - r64) / (u * s) / float(env["k"]))
        # a value outside the format its values follow (V not a BF16 value) is wrong whatever its size
        if o.value_fmt != o.fmt:
            fin = np.isfinite(x64)
            held = np.where(fin, numerics.storage(np.where(fin, x64, 0.0), o.value_fmt).astype(np.float64), x64)
            e = np.where(fin & (held != x64), WRONG, e)
    e = np.where(np.isfinite(e), e, WRONG)
    return np.where(mask & ~same, np.minimum(e, WRONG), 0.0)


def error_maps(vec, impl: Mapping, ref: Mapping, scales: Mapping | None = None) -> dict[str, np.ndarray]:
    masks = compare.full_masks(vec.outputs, vec.expected, vec.masks)
    scales = scales if scales is not None else vec.expected
    out = {}
    for name, o in vec.outputs.items():
        if np.shape(impl[name]) != np.shape(ref[name]):
            out[name] = np.full(np.shape(vec.expected[name]), WRONG)
            continue
        out[name] = error_map(o, vec.bounds.get(name, {}), impl[name], ref[name], masks[name],
                              scales.get(f"{name}.scale"))
    return out


def difference(maps: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The elements that differ beyond what the suite allows; where none does (a normwise or a bias
    FAIL), the largest errors (at least half of the largest)."""
    d = {n: e > 1.0 for n, e in maps.items()}
    if any(m.any() for m in d.values()):
        return d
    top = max((float(e.max()) for e in maps.values() if e.size), default=0.0)
    if top <= 0:
        return d
    return {n: e >= 0.5 * top for n, e in maps.items()}


def nan_rows(vec, x: Mapping, r: Mapping) -> set:
    """(output, row) where ``x`` holds a NaN the reference does not (a row: all axes but the last)."""
    found = set()
    for name, o in vec.outputs.items():
        if o.cls != REPRESENTED:
            continue
        a, b = np.asarray(x[name], np.float64), np.asarray(r[name], np.float64)
        if a.shape != b.shape or a.ndim == 0:
            continue
        new = np.isnan(a) & ~np.isnan(b)
        found |= {(name, tuple(int(i) for i in idx)) for idx in np.argwhere(new.any(axis=-1))}
    return found


@dataclass
class Explanation:
    mutant: str
    explained: float  # fraction of the difference reproduced
    spurious: float  # fraction of the mutant's predicted difference that did not happen
    reduction: float  # 1 - |impl - mutant| / |impl - reference| (norms of the allowance multiples)
    differing: int  # elements in the difference
    reproduced: int
    nan_rows_same: bool  # both put NaN in exactly the same rows, where the reference has none

    @property
    def score(self) -> float:
        return self.explained * (1.0 - self.spurious) * max(self.reduction, 0.0)

    def record(self) -> dict:
        return {"explained": round(self.explained, 4), "spurious": round(self.spurious, 4),
                "reduction": round(self.reduction, 4), "differing": self.differing, "reproduced": self.reproduced}


def explain(vec, impl: Mapping, maps_ref: Mapping, diff: Mapping, mutant_key: str, out: Mapping,
            impl_nan_rows: set, ref_m: Mapping | None = None) -> Explanation:
    """``maps_ref``: error_maps of impl vs the reference; ``diff``: difference(maps_ref); ``ref_m``:
    the mutant's outputs with their magnitudes (``match.reference_for``; default the reference's)."""
    if ref_m is None:
        ref_m = {**vec.expected, **{n: out[n] for n in vec.outputs}}
    to_m = error_maps(vec, impl, ref_m, ref_m)  # the mutant's magnitudes where it has its own
    pred = error_maps(vec, ref_m, vec.expected)
    n_d = sum(int(d.sum()) for d in diff.values())
    rep = sum(int((diff[n] & (to_m[n] <= 2.0)).sum()) for n in diff)
    spur = sum(int(((pred[n] > 2.0) & ~diff[n]).sum()) for n in diff)
    n_p = sum(int((pred[n] > 2.0).sum()) for n in diff)
    norm_r = np.sqrt(sum(float(np.sum(np.minimum(e, WRONG) ** 2)) for e in maps_ref.values()))
    norm_m = np.sqrt(sum(float(np.sum(np.minimum(e, WRONG) ** 2)) for e in to_m.values()))
    reduction = 1.0 - norm_m / norm_r if norm_r > 0 else 0.0
    nans = impl_nan_rows and nan_rows(vec, out, vec.expected) == impl_nan_rows
    return Explanation(mutant_key, rep / n_d if n_d else 0.0, spur / max(n_p, 1) if n_p else 0.0, float(reduction),
                       n_d, rep, bool(nans))
