"""Does the implementation conform to a catalog mutant? The suite's verdict, with the mutant as
the reference.

A real engine with a catalogued bug never reproduces the mutant bit for bit: the mutant is the
float32 baseline with the bug written in, the engine rounds its own way. So a mutant *matches*
when the implementation would be PASS or ACCEPTABLE judged against that mutant exactly as the
suite judges it against the reference:

- represented outputs inside the mutant's accuracy envelope, measured with the magnitudes
  (``<name>.scale``) of the mutant's own outputs (a probability the reference filters to 0 has
  no magnitude there; the mutant's has);
- decisions equal, or divergent only where the *mutant's* decision is near-tied (its own
  margins), never with the reference's margins where the mutant decided otherwise;
- teacher forcing after an acceptable divergence, where the mutant is "the reference on changed
  inputs" (``_ArgsMutant``): the Op's force on those inputs.

Two references stand for a mutant. Its *float64 twin*: the mutant's own code with every reference
call left in float64 (``Mutant._baseline`` returns the full reference output, margins included),
judged with the suite's bounds, as the reference is. Where the mutant computes outside
``_baseline`` (a reimplementation in float32) the twin carries that float32 rounding too, so the
mutant's float32 outputs are tried as well with the bounds doubled: both the mutant and the
engine carry a legitimate rounding error each, and the triangle inequality adds them.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from conformance import compare
from conformance.compare import Result
from conformance.registry import DECISION, REPRESENTED

# both the engine and the float32 mutant are within one envelope of the truth
WIDEN = 2.0


def fresh(vec) -> dict:
    return {**{k: np.array(v, copy=True) for k, v in vec.inputs.items()}, **copy.deepcopy(dict(vec.params))}


def pure_args(mutant) -> bool:
    """A mutant that is exactly "the reference on changed keyword arguments" (``_ArgsMutant``
    whose Op method is not overridden): its reference, force and follow are the Op's own on
    ``change(kwargs)``."""
    from conformance.mutants.base import _ArgsMutant

    if not isinstance(mutant, _ArgsMutant):
        return False
    return not any(mutant.op in k.__dict__ for k in type(mutant).__mro__
                   if isinstance(k, type) and issubclass(k, _ArgsMutant) and k is not _ArgsMutant)


def twin(vec, mutant) -> dict | None:
    """The mutant's outputs with its reference calls left in float64 (margins included), or None
    where the mutant never calls ``_baseline`` or the twin cannot run."""
    t = copy.copy(mutant)
    used = []

    def full(fn, **kwargs):
        used.append(fn)
        return dict(fn(**kwargs))

    t._baseline = full
    try:
        with np.errstate(all="ignore"):
            out = dict(getattr(t, vec.op)(**fresh(vec)))
    except Exception:  # noqa: BLE001 - a mutant whose code needs storage dtypes: no twin
        return None
    if not used or any(n not in out for n in vec.outputs):
        return None
    for name, o in vec.outputs.items():
        if np.shape(out[name]) != np.shape(vec.expected[name]):
            return None
        if o.cls != REPRESENTED:
            out[name] = np.asarray(out[name]).astype(np.asarray(vec.expected[name]).dtype)
    return out


def widened(bounds: Mapping, factor: float) -> dict:
    if factor == 1.0:
        return dict(bounds)
    out = {}
    for name, b in bounds.items():
        b = dict(b)
        for key in ("bound_ulp", "bound_norm", "margin_err", "envelope_k"):
            if key in b:
                b[key] = float(b[key]) * factor
        if b.get("envelope") is not None:
            b["envelope"] = {**b["envelope"], "k": float(b["envelope"]["k"]) * factor,
                             "n": float(b["envelope"]["n"]) * factor}
        out[name] = b
    return out


def reference_for(vec, spec, out: Mapping, kwargs: Callable) -> dict:
    """``out`` (a mutant's outputs) completed into a reference dict the comparison can use:
    margins (the mutant's own where it returned them; the reference's where its decision is the
    reference's; 0, no ambiguity granted, where it decided otherwise and has none) and scales (the
    larger of the reference's and those of the mutant's outputs)."""
    ref = dict(vec.expected)
    ref.update({k: v for k, v in out.items() if k.split(".")[0] in vec.outputs})
    for name, o in vec.outputs.items():
        if o.cls != DECISION:
            continue
        mine = out.get(f"{name}.margin")
        if mine is not None and np.shape(mine) == np.shape(out[name]):
            ref[f"{name}.margin"] = np.asarray(mine, np.float64)
        else:
            same = np.asarray(out[name]) == np.asarray(vec.expected[name])
            base = np.asarray(vec.expected.get(f"{name}.margin", np.zeros(np.shape(same))), np.float64)
            ref[f"{name}.margin"] = np.where(same, base, 0.0)
        ref.pop(f"{name}.regret", None)
    if spec is not None and spec.scales is not None:
        try:
            with np.errstate(all="ignore"):
                mine = spec.scales(kwargs(), ref)
        except Exception:  # noqa: BLE001 - no scales for the mutant's outputs: the reference's
            mine = {}
        for name, s in mine.items():
            key = name if "." in name else f"{name}.scale"
            old = vec.expected.get(key)
            s = np.asarray(s, np.float64)
            if old is not None and np.shape(old) == s.shape:
                s = np.fmax(s, np.asarray(old, np.float64))
            ref[key] = s
    return ref


@dataclass
class Judged:
    result: Result
    frac: float  # worst fraction of the (unwidened) envelope, or of the tight bound, used
    exact: bool
    how: str  # "float64 twin" | "float32 mutant, bounds doubled"


def equal(vec, impl: Mapping, ref: Mapping) -> bool:
    masks = compare.full_masks(vec.outputs, vec.expected, vec.masks)
    for name, o in vec.outputs.items():
        a, b = np.asarray(impl[name]), np.asarray(ref[name])
        if a.shape != b.shape:
            return False
        if o.cls == REPRESENTED:
            a, b = a.astype(np.float64), b.astype(np.float64)
            same = (a == b) | (np.isnan(a) & np.isnan(b))
        else:
            same = a == b
        if not np.all(same | ~masks[name]):
            return False
    return True


def judge(vec, spec, mutant, impl: Mapping, f32_out: Mapping | None, twin_out: Mapping | None) -> Judged | None:
    """The implementation judged against the mutant; None where it FAILs against every form."""
    if f32_out is not None and equal(vec, impl, f32_out):
        return Judged(Result.PASS, 0.0, True, "bit-identical to the mutant")
    tries = []
    if twin_out is not None:
        tries.append((twin_out, 1.0, "float64 twin"))
    if f32_out is not None:
        tries.append((f32_out, WIDEN, "float32 mutant, bounds doubled"))
    args = pure_args(mutant)
    for out, factor, how in tries:
        kw = (lambda: mutant.change(fresh(vec))) if args else (lambda: fresh(vec))
        ref = reference_for(vec, spec, out, kw)
        force = spec.force if (args and spec is not None) else None
        try:
            with np.errstate(all="ignore"):
                v = compare.compare(vec.outputs, ref, impl, vec.masks, widened(vec.bounds, factor), force, kw,
                                    spec.independent if (args and spec is not None) else (),
                                    spec=spec if args else None)
        except Exception:  # noqa: BLE001, S112 - a comparison that cannot use this form: try the next
            continue
        if v.result in (Result.PASS, Result.ACCEPTABLE):
            frac = v.numbers.get("envelope_frac")
            if frac is None:
                frac = v.numbers.get("tight_frac", 0.0) or 0.0
            return Judged(v.result, float(frac) * factor, False, how)
    return None
