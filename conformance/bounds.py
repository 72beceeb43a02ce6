"""Derived comparison bounds (CONTRACTS C2), computed once per case at generation.

The float32 baseline (the reference run under ``precision.baseline`` with the
Op's allowed BF16 intermediates) is compared with the float64 reference the same
way an implementation will be, teacher forcing included, and its errors set the
bounds stored in the vector's ``bounds`` header:

- represented: ``bound_ulp = 2 * baseline_ulp + 1`` (max ULP error over the mask)
  and ``bound_norm = 2 * baseline_norm + 2**-p`` (p: the format's significant
  bits; the floor is its unit roundoff).
- decision: ``margin_err`` = the largest error of the baseline's margin over
  elements where both margins are finite: ``|m_base - m_ref|`` where the two
  chose alike; ``m_ref + m_base`` where they chose differently (the baseline then
  scored the reference's winner at least ``m_base`` below its own). The
  comparison allows ``2 * margin_err`` plus an FP32-spacing floor
  (``compare.tolerance``). With this definition the baseline's own divergences
  are always acceptable.
- exact: no bound.

Stored numbers are rounded outward to two significant bits (``round_out``: up for
bounds and magnitudes, down for margins), so that what a BLAS or libm may change in the
last bits of a float64 (or of the float32 baseline, which ``reference.precision`` keeps
platform-independent anyway) cannot change the bytes (CONTRACTS C8).
An infinite bound (the baseline overflows or turns NaN where the reference is
finite) is refused: it would make the output uncheckable.

C2 v2 adds, per represented output, the accuracy ``envelope`` {k, n} of its registry
entry, and per decision with a ``.scale`` the ``envelope_k`` of its ambiguity band.
"""

from __future__ import annotations

import math

import numpy as np

from conformance.compare import align
from conformance.registry import DECISION, REPRESENTED
from reference import numerics


class BoundError(ValueError):
    pass


def round_out(x, up: bool = True, bits: int = 2):
    """x (scalar or array, >= 0) rounded to ``bits`` significant bits: up (bounds,
    magnitudes) or down (margins). 0, inf and NaN stay as they are."""
    a = np.asarray(x, np.float64)
    mant, exp = np.frexp(a)  # a = mant * 2**exp, mant in [0.5, 1)
    scaled = mant * 2.0**bits
    q = np.ceil(scaled) if up else np.floor(scaled)
    with np.errstate(over="ignore", invalid="ignore"):
        r = np.where(np.isfinite(a) & (a > 0), np.ldexp(q, exp - bits), a)
    return float(r) if np.ndim(x) == 0 and not isinstance(x, np.ndarray) else r


def ceil_sig(x: float) -> float:
    return float(round_out(float(x), up=True))


def derive(outputs, ref, base, masks, force=None, kwargs=None, independent=(), envelope=None,
           decision_k: float = 0.0) -> dict:
    """Bounds per represented and decision output, from reference and baseline outputs."""
    ref, masks, _ = align(outputs, ref, base, masks, force, kwargs, independent=independent)
    bounds = {}
    for name, o in outputs.items():
        mask = masks[name]
        if o.cls == REPRESENTED:
            err = numerics.ulp_error(base[name], ref[name], o.fmt)[mask]
            bl_ulp = ceil_sig(err.max() if err.size else 0.0)
            r = np.asarray(ref[name], np.float64)
            bl_norm = ceil_sig(numerics.normwise_error(np.asarray(base[name], np.float64)[mask], r[mask]))
            unit = 2.0 ** -numerics.get_format(o.fmt).precision
            bounds[name] = {"baseline_ulp": bl_ulp, "bound_ulp": 2 * bl_ulp + 1,
                            "baseline_norm": bl_norm, "bound_norm": ceil_sig(2 * bl_norm + unit)}
            env = (envelope or {}).get(name)
            if env is not None:
                bounds[name]["envelope"] = {"k": env.k, "n": env.n, **({} if env.bias else {"bias": False})}
        elif o.cls == DECISION:
            m = np.asarray(ref[f"{name}.margin"], np.float64)
            mb = np.asarray(base[f"{name}.margin"], np.float64)
            same = np.asarray(base[name]) == np.asarray(ref[name])
            with np.errstate(invalid="ignore"):  # inf margins (no contest) are left out just below
                err = np.where(same, np.abs(mb - m), m + mb)[mask & np.isfinite(m) & np.isfinite(mb)]
            floor_of = f"{name}.scale" if f"{name}.scale" in ref else f"|{name}.margin|"
            bounds[name] = {"margin_err": ceil_sig(err.max() if err.size else 0.0), "floor": f"fp32 spacing at {floor_of}"}
            if f"{name}.scale" in ref:
                bounds[name]["floor"] = f"envelope_k * 2^-24 * {name}.scale"
                bounds[name]["envelope_k"] = decision_k
        else:
            continue
        infinite = [k for k, v in bounds[name].items() if isinstance(v, float) and not math.isfinite(v)]
        if infinite:
            raise BoundError(f"output {name}: {infinite[0]} is not finite (the float32 baseline overflows "
                             "or gives NaN where the float64 reference is finite)")
    return bounds
