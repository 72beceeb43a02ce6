"""Comparison classes and results (CONTRACTS C2).

Per output, against the float64 reference stored in the vector, over its mask:

- represented: FAIL if the largest ULP error (in the output's format, at the
  reference value) exceeds ``bound_ulp`` or the normwise error exceeds
  ``bound_norm``; a NaN or inf where the reference is finite is an infinite error.
- exact: equal, element for element.
- decision: where the implementation chose differently, the divergence is
  ACCEPTABLE when the reference margin is positive and within the tolerance
  ``2 * margin_err + floor`` (floor: the FP32 spacing at ``<name>.scale`` when the
  reference returns it, else at the margin itself), FAIL otherwise. A margin of 0
  is an exact tie of representable values, decided by the tie rule (C4), so a
  divergence there FAILs.

After a divergence the reference's later steps no longer describe the
implementation's run. With an acceptable divergence and ``spec.force``, every
output is compared with the teacher-forced reference ``force(kwargs, impl)``:
the reference rerun so that each decision's downstream effect (the next step's
state, counts, gathered values) follows the implementation's decision, while
each decision output and its margin stay the reference's own choice given that
history. Without ``force`` (or when every divergence FAILs anyway), elements
downstream of the first divergence of each row are not compared; see
``_downstream`` for what "downstream" means by shape.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np

from conformance import registry
from conformance.registry import DECISION, EXACT, REPRESENTED, Output
from reference import backend, numerics


class Result(IntEnum):
    """Ordered so that max() is the worst (C2: worst result wins)."""

    NOT_IMPLEMENTED = 0
    PASS = 1
    ACCEPTABLE = 2
    FAIL = 3
    ERROR = 4

    @property
    def failed(self) -> bool:
        return self >= Result.FAIL


@dataclass
class CaseResult:
    op: str
    case: str
    result: Result
    detail: str = ""
    flags: tuple = ()
    worst_ulp: float | None = None  # largest ULP error over represented outputs, with that output's bound
    ulp_bound: float | None = None
    worst_norm: float | None = None  # largest normwise error over represented outputs, with its bound
    norm_bound: float | None = None
    seconds: float = 0.0
    # C2 v2: why an ACCEPTABLE is acceptable ("precision": outside the tight bound, inside the
    # accuracy envelope; "ambiguous": a near-tied decision followed by teacher forcing)
    acceptable_flags: tuple = ()
    # worst error over represented outputs as a fraction of the tight bound (1.0 = at the bound)
    tight_frac: float | None = None
    # worst scaled error over represented outputs as a fraction of the accuracy envelope
    envelope_frac: float | None = None


@dataclass
class _Verdict:
    result: Result = Result.PASS
    detail: str = ""
    numbers: dict = field(default_factory=dict)
    flags: tuple = ()


def _at(index) -> str:
    return "[" + ", ".join(str(int(i)) for i in index) + "]"


def full_masks(outputs: Mapping[str, Output], ref: Mapping, masks: Mapping) -> dict[str, np.ndarray]:
    """One writable boolean mask per output, of the output's shape (absent: all compared)."""
    out = {}
    for name in outputs:
        shape = np.shape(ref[name])
        m = masks.get(name)
        out[name] = np.ones(shape, bool) if m is None else np.broadcast_to(np.asarray(m, bool), shape).copy()
    return out


def tolerance(name: str, bound: Mapping, ref: Mapping) -> np.ndarray:
    """The ambiguity band of a decision: twice the float32 baseline's margin error plus, where
    the reference gives the magnitude of the competing scores (``<name>.scale``, FP32 units),
    the envelope of those scores (C2 v2: ``decision_k`` * 2^-24 * scale); else one FP32
    spacing at the margin."""
    scale = ref.get(f"{name}.scale")
    if scale is None:
        floor = numerics.quantum(np.abs(np.asarray(ref[f"{name}.margin"], np.float64)), "fp32")
    else:
        k = float(bound.get("envelope_k", 1.0))
        floor = k * 2.0**-24 * np.abs(np.asarray(scale, np.float64))
    return 2.0 * float(bound["margin_err"]) + floor


def first_divergences(outputs, ref, impl, masks) -> list[tuple[str, tuple]]:
    """(decision output, index) of the first divergence in each row (last axis = steps)."""
    found = []
    for name, o in outputs.items():
        if o.cls != DECISION:
            continue
        diff = (np.asarray(impl[name]) != np.asarray(ref[name])) & masks[name]
        if diff.ndim < 2:
            found += [(name, tuple(i)) for i in np.argwhere(diff)]
            continue
        rows = np.argwhere(diff.any(axis=-1))
        found += [(name, (*r, int(np.argmax(diff[tuple(r)])))) for r in rows]
    return found


def _downstream(dshape: tuple, idx: tuple, oshape: tuple, same: bool):
    """The part of an output (shape ``oshape``) that a decision at ``idx`` (of a
    decision output shaped ``dshape``) may change, judged by shape alone:

    - decision [..rows.., steps]: outputs shaped [..rows.., steps, ...] after the step
      in that row; outputs shaped [..rows.., ...] (per-row totals) that whole row;
    - decision [B]: other outputs' row b;  decision []: every other output.
    Returns an index expression, or None when the output is untouched.
    """
    n = len(dshape)
    if n == 0:
        return None if same else (...,)
    if n == 1:
        return None if same or oshape[:1] != dshape else (idx[0], ...)
    if oshape[:n] == dshape:
        return (*idx[:-1], slice(idx[-1] + 1, None))
    if not same and oshape[: n - 1] == dshape[: n - 1]:
        return (*idx[:-1], ...)
    return None


def align(outputs, ref, impl, masks, force: Callable | None, kwargs: Callable | None, acceptable=None,
          independent=()):
    """The reference and masks to compare ``impl`` with, after its decision divergences.

    ``acceptable(name, index) -> bool`` says which divergences may be followed
    (None: all of them, as when deriving bounds from the baseline). Returns
    (ref, masks, note). Exceptions from ``force`` propagate.
    """
    firsts = first_divergences(outputs, ref, impl, masks)
    if not firsts:
        return ref, masks, ""
    followable = [d for d in firsts if acceptable is None or acceptable(*d)]
    if force is not None and followable:
        forced = dict(backend.call(force, kwargs(), impl))  # on the selected reference backend
        return forced, masks, f"teacher-forced after {followable[0][0]} {_at(followable[0][1])}"
    if not followable:  # divergences that are not acceptable hide nothing: each is judged (and FAILs) itself
        return ref, masks, ""
    shapes = {n: np.shape(ref[n]) for n in outputs}
    masks = {n: m.copy() for n, m in masks.items()}
    # Only an acceptable divergence makes later elements unknowable; hiding downstream of an
    # unacceptable one would let two wrong outputs hide each other (p/q swapped passed that way).
    for dname, idx in followable:
        for oname in outputs:
            if oname in independent:
                continue
            sl = _downstream(shapes[dname], idx, shapes[oname], oname == dname)
            if sl is not None:
                masks[oname][sl] = False
    for dname, idx in followable:  # a divergence is itself always judged; two must not hide each other
        masks[dname][idx] = True
    first = followable[0]
    return ref, masks, f"not compared downstream of {first[0]} {_at(first[1])} (the Op has no force)"


def unit(fmt: str) -> float:
    return 2.0 ** -numerics.get_format(fmt).precision


def bias(x: np.ndarray, r: np.ndarray, mask: np.ndarray, fmt: str, scale=None) -> tuple[float, float, int, int]:
    """(mean, standard error, elements, rows) of the signed scaled error sign(ref) (out - ref) / (u s),
    each clipped (C2 v2: the envelope's units; without s, in quanta of the reference). The
    standard error is that of the row means (a row: one vector along the last axis), since the
    elements of a row may share an error (attention's P weights, a norm's scale) and are not
    independent samples; rows are."""
    use = mask & np.isfinite(r) & np.isfinite(x) & (r != 0)
    n = int(use.sum())
    if n == 0:
        return 0.0, 0.0, 0, 0
    unit_of = numerics.quantum(np.where(use, r, 1.0), fmt) if scale is None else \
        unit(fmt) * np.asarray(scale, np.float64) + registry.FTZ_FLOOR
    with np.errstate(invalid="ignore", divide="ignore"):
        d = np.where(use, np.clip(np.sign(r) * (x - r) / unit_of, -registry.BIAS_CLIP, registry.BIAS_CLIP), 0.0)
    d2, u2 = d.reshape(-1, d.shape[-1]) if d.ndim else d.reshape(1, 1), use.reshape(-1, d.shape[-1]) if d.ndim \
        else use.reshape(1, 1)
    counts = u2.sum(axis=-1)
    rows = counts > 0
    row_means = d2.sum(axis=-1)[rows] / counts[rows]
    g = int(rows.sum())
    se = float(row_means.std() / np.sqrt(g)) if g > 1 else float("inf")
    return float(d.sum() / n), se, n, g


def _represented(o: Output, ref, out, mask, bound, scale) -> _Verdict:
    """PASS inside the tight bound; ACCEPTABLE (precision) inside the envelope; FAIL outside it,
    on a non-finite mismatch, or on a systematic bias (CONTRACTS C2 v2)."""
    r = np.asarray(ref, np.float64)
    x = np.asarray(out, np.float64)
    err = np.where(mask, numerics.ulp_error(x, r, o.fmt), 0.0)
    worst = float(err.max()) if err.size else 0.0
    at = np.unravel_index(int(np.argmax(err)), err.shape) if err.size else ()
    norm = numerics.normwise_error(x[mask], r[mask])
    bu, bn = float(bound["bound_ulp"]), float(bound["bound_norm"])
    numbers = {"ulp": worst, "ulp_bound": bu, "norm": norm, "norm_bound": bn,
               "tight_frac": max(worst / bu if bu > 0 else (0.0 if worst == 0 else np.inf),
                                 norm / bn if bn > 0 else (0.0 if norm == 0 else np.inf))}
    tight = f"{o.name}: max {worst:.1f} ulp (bound {bu:.1f}) at {_at(at)}; normwise {norm:.2g} (bound {bn:.2g})"
    nonfinite = mask & ~(np.isfinite(x) & np.isfinite(r)) & ~((x == r) | (np.isnan(x) & np.isnan(r)))
    if nonfinite.any():
        at = tuple(np.argwhere(nonfinite)[0])
        numbers["envelope_frac"] = np.inf
        return _Verdict(Result.FAIL, f"{o.name}: {int(nonfinite.sum())} non-finite mismatch(es), first at {_at(at)} "
                        f"[got {float(x[at])!r}, expected {float(r[at])!r}]", numbers)
    env = bound.get("envelope")
    in_tight = worst <= bu and norm <= bn
    if env is None or scale is None:
        return _Verdict(Result.PASS if in_tight else Result.FAIL, tight, numbers)
    frac, at, e, enorm = _envelope_frac(x, r, mask, scale, env, o)
    numbers["envelope_frac"] = frac
    k, n = float(env["k"]), float(env["n"])
    where = f"max {e:.3g} u*s (envelope {k:g}) at {_at(at)}; normwise {enorm:.3g} u*||s|| (envelope {n:g})"
    if not in_tight and frac > 1.0:
        return _Verdict(Result.FAIL, f"{o.name}: outside the envelope: {where} [got {float(x[at])!r}, expected "
                        f"{float(r[at])!r}, s {float(np.asarray(scale)[at]):.3g}]; {tight.split(': ', 1)[1]}", numbers)
    # inside the bounds: a systematic direction of the errors is still a bug (truncation)
    mean, se, count, rows = bias(x, r, mask, o.value_fmt, scale)
    if env.get("bias", True) and o.value_fmt in registry.BIAS_FORMATS and count >= registry.BIAS_MIN_ELEMENTS \
            and rows >= registry.BIAS_MIN_ROWS and abs(mean) > registry.BIAS_LIMIT and abs(mean) > registry.BIAS_Z * se:
        return _Verdict(Result.FAIL, f"{o.name}: systematic bias: mean signed error {mean:+.3f} u*s toward "
                        f"{'zero' if mean < 0 else 'infinity'} over {count} elements in {rows} rows (limit "
                        f"{registry.BIAS_LIMIT}, {registry.BIAS_Z:g} standard errors of the row means; truncation or a "
                        "one-sided double rounding); " + tight, numbers)
    if in_tight:
        return _Verdict(Result.PASS, tight, numbers)
    return _Verdict(Result.ACCEPTABLE, f"{o.name}: precision: outside the tight bound ({tight.split(': ', 1)[1]}), "
                    f"inside the envelope ({where})", numbers, ("precision",))


def _envelope_frac(x, r, mask, scale, env, o: Output):
    """(fraction of the envelope, worst index, worst componentwise u*s multiple, normwise multiple)."""
    u = unit(o.value_fmt)
    s = np.asarray(scale, np.float64) + registry.FTZ_FLOOR / u
    # inf - inf where both are the same infinity, NaN - NaN where both are NaN: equal, no error
    with np.errstate(invalid="ignore"):
        diff = np.where(mask & (x != r) & ~(np.isnan(x) & np.isnan(r)), np.abs(x - r), 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        e = np.where(diff == 0, 0.0, diff / (u * s))
    e = np.where(np.isnan(e), np.inf, e)
    at = np.unravel_index(int(np.argmax(e)), e.shape) if e.size else ()
    worst = float(e.max()) if e.size else 0.0
    snorm = float(np.sqrt(np.sum(np.where(mask, s, 0.0) ** 2)))
    dnorm = float(np.sqrt(np.sum(diff**2)))
    enorm = 0.0 if dnorm == 0 else (np.inf if snorm == 0 else dnorm / (u * snorm))
    return max(worst / float(env["k"]), enorm / float(env["n"])), at, worst, enorm


def _exact(o: Output, ref, out, mask) -> _Verdict:
    diff = (np.asarray(out) != np.asarray(ref)) & mask
    if not diff.any():
        return _Verdict()
    at = tuple(np.argwhere(diff)[0])
    got, want = np.asarray(out)[at], np.asarray(ref)[at]
    return _Verdict(Result.FAIL, f"{o.name}: {int(diff.sum())} of {int(mask.sum())} differ, first at {_at(at)} "
                    f"(got {got}, expected {want})")


def _decision(o: Output, ref, out, mask, bound) -> _Verdict:
    x, r = np.asarray(out), np.asarray(ref[o.name])
    diff = (x != r) & mask
    if not diff.any():
        return _Verdict()
    margin = np.asarray(ref[f"{o.name}.margin"], np.float64)
    tol = tolerance(o.name, bound, ref)
    ok = diff & (margin > 0) & (margin <= tol)
    regret = ref.get(f"{o.name}.regret")
    if regret is not None:
        # Teacher forcing scored the implementation's own choice: near-tied is acceptable, an
        # arbitrary value at an ambiguous decision is not (nor a tie the C4 rule decides).
        regret = np.asarray(regret, np.float64)
        ok = diff & (regret > 0) & (regret <= tol)
    bad = diff & ~ok
    if bad.any():
        at = tuple(np.argwhere(bad)[0])
        m = margin[at]
        why = f"exact tie, decided by {o.tie_rule}" if m == 0 else f"margin {m:.3g} > tol {tol[at]:.3g}"
        if regret is not None and m > 0:
            why = f"its choice scores {regret[at]:.3g} below the best, tol {tol[at]:.3g}"
        return _Verdict(Result.FAIL, f"{o.name}: differs at {_at(at)} (got {x[at]}, expected {r[at]}; {why})")
    at = tuple(np.argwhere(ok)[0])
    return _Verdict(Result.ACCEPTABLE, f"{o.name}: ambiguous: {int(ok.sum())} acceptable divergence(s), first at "
                    f"{_at(at)} (got {x[at]}, expected {r[at]}; margin {margin[at]:.3g} <= tol {tol[at]:.3g})",
                    flags=("ambiguous",))


def _with_scales(spec, kwargs, ref: Mapping) -> dict:
    """A recomputed reference with its magnitudes (C2 v2), as generation stored them."""
    ref = dict(ref)
    if spec is not None and spec.scales is not None:
        for name, s in spec.scales(kwargs(), ref).items():
            ref[name if "." in name else f"{name}.scale"] = s
    return ref


def compare(outputs: Mapping[str, Output], ref: Mapping, impl: Mapping, masks: Mapping, bounds: Mapping,
            force: Callable | None = None, kwargs: Callable | None = None, independent=(), spec=None) -> _Verdict:
    """Compare normalised implementation outputs (NumPy) with the reference.

    ``kwargs()`` gives fresh keyword arguments for ``force``. ``spec`` (the Op's registry
    entry) supplies ``follow`` and ``scales``: with a followed intermediate (e.g. the conv's
    finish delta), that output is judged against the stored reference and every other one
    against the reference recomputed from the implementation's value of it. Returns the
    worst verdict over outputs, its detail naming each output that did not PASS.
    """
    masks = full_masks(outputs, ref, masks)
    verdicts = []
    if spec is not None and spec.follow is not None and kwargs is not None:
        followed = {n: _represented(outputs[n], ref[n], impl[n], masks[n], bounds[n], ref.get(f"{n}.scale"))
                    for n in spec.followed}
        verdicts += followed.values()
        if all(not v.result.failed for v in followed.values()):
            try:
                fresh = _with_scales(spec, kwargs, spec.follow(kwargs(), impl))
            except Exception as exc:  # noqa: BLE001 - reported, not raised
                return _Verdict(Result.ERROR, f"following the implementation failed: {type(exc).__name__}: {exc}"
                                .splitlines()[0])
            ref = {**ref, **{k: v for k, v in fresh.items() if k.split(".")[0] not in spec.followed}}
        outputs = {n: o for n, o in outputs.items() if n not in spec.followed}

    def acceptable(name, idx):
        m = float(np.asarray(ref[f"{name}.margin"])[idx])
        return 0 < m <= float(tolerance(name, bounds[name], ref)[idx])

    try:
        forced_ref, masks, note = align(outputs, ref, impl, masks, force, kwargs, acceptable, independent)
        if forced_ref is not ref:
            ref = {**ref, **_with_scales(spec, kwargs, forced_ref)}
    except Exception as exc:  # noqa: BLE001 - any failure to follow the implementation is reported, not raised
        return _Verdict(Result.ERROR, f"teacher forcing failed: {type(exc).__name__}: {exc}".splitlines()[0])
    for name, o in outputs.items():
        if o.cls == REPRESENTED:
            verdicts.append(_represented(o, ref[name], impl[name], masks[name], bounds[name], ref.get(f"{name}.scale")))
        elif o.cls == EXACT:
            verdicts.append(_exact(o, ref[name], impl[name], masks[name]))
        else:
            verdicts.append(_decision(o, ref, impl[name], masks[name], bounds[name]))
    worst = max(v.result for v in verdicts)
    shown = [v.detail for v in verdicts if v.result != Result.PASS]
    if not shown:  # a PASS still says how close it came
        rep = [v for v in verdicts if v.numbers]
        shown = [max(rep, key=lambda v: v.numbers["ulp"] / max(v.numbers["ulp_bound"], 1e-300)).detail] if rep else []
    numbers = {}
    rep = [v.numbers for v in verdicts if v.numbers]
    if rep:
        u = max(rep, key=lambda n: n["ulp"])
        w = max(rep, key=lambda n: n["norm"])
        numbers = {"worst_ulp": u["ulp"], "ulp_bound": u["ulp_bound"], "worst_norm": w["norm"],
                   "norm_bound": w["norm_bound"], "tight_frac": max(n["tight_frac"] for n in rep)}
        env = [n["envelope_frac"] for n in rep if n.get("envelope_frac") is not None]
        numbers["envelope_frac"] = max(env) if env else None
    flags = tuple(sorted({f for v in verdicts if v.result == Result.ACCEPTABLE for f in v.flags}))
    return _Verdict(worst, "; ".join(shown + ([note] if note else [])), numbers, flags)
