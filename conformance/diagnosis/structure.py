"""Structural signatures of a difference, implementation against reference.

Each is a shape of the error an engineer reads first: a permutation of heads, rows, taps or layers
along an axis; a shift by one along an axis; a mirrored order; a constant scale; only the last
element, or only the boundary, of an axis differing; the whole output as the reference's with one
input off by one (a position, a window, a start: where the Op draws uniforms, an RNG counter
field). None of them names a catalogued pitfall: a signature is what the error looks like, not
which bug made it. Each comes with its evidence; nothing is returned without it.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from conformance import compare
from conformance.compare import Result
from conformance.diagnosis.explain import error_map
from conformance.diagnosis.match import fresh
from conformance.registry import REPRESENTED

MAX_AXIS = 64  # permutations are searched along axes up to this size
# integer inputs whose off-by-one is a classic: positions and counters, window bounds, starts
OFFSET_FIELDS = ("frontier", "start", "window", "position", "positions")
RNG_INPUTS = ("seed",)


def _close(o, bound, x, r, mask, scale) -> np.ndarray:
    return error_map(o, bound, x, r, mask, scale) <= 2.0


def _label(name: str, shape: tuple, axis: int) -> str:
    return f"{name} axis {axis} (of {list(shape)})"


def _axis_signatures(name, o, bound, x, r, mask, scale, diff) -> list[dict]:
    found = []
    x, r = np.asarray(x), np.asarray(r)
    if x.shape != r.shape or x.ndim == 0 or not diff.any():
        return found
    if o.cls == REPRESENTED:
        with np.errstate(all="ignore"):
            found += _value_signatures(name, o, bound, x, r, mask, scale)
    found += _index_signatures(name, o, bound, x, r, mask, scale, diff)
    return found


def _value_signatures(name, o, bound, x, r, mask, scale) -> list[dict]:
    found = []
    x64, r64 = x.astype(np.float64), r.astype(np.float64)
    ok = mask & np.isfinite(x64) & np.isfinite(r64)
    if ok.sum() < 4:
        return found
    rr = float(np.sum(np.where(ok, r64 * r64, 0.0)))
    if rr > 0:
        c = float(np.sum(np.where(ok, x64 * r64, 0.0))) / rr
        if abs(c - 1.0) > 1e-3 and np.isfinite(c) and _close(o, bound, x64, c * r64, mask, scale).all():
            found.append({"signature": "constant scale", "text": f"{name} is the reference times {c:.6g}",
                          "evidence": f"every compared element of {name} within the allowance of {c:.6g} x "
                                      "the reference", "confidence": 0.8})
    c = float(np.mean((x64 - r64)[ok]))
    if c != 0 and np.isfinite(c) and _close(o, bound, x64, r64 + c, mask, scale).all():
        found.append({"signature": "constant offset", "text": f"{name} is the reference plus {c:.6g}",
                      "evidence": f"every compared element of {name} within the allowance of the reference "
                                  f"+ {c:.6g}", "confidence": 0.8})
    return found


def _index_signatures(name, o, bound, x, r, mask, scale, diff) -> list[dict]:
    found = []
    for a in range(x.ndim):
        n = x.shape[a]
        if n < 2:
            continue
        where = np.moveaxis(diff, a, 0).reshape(n, -1).any(axis=1)
        lab = _label(name, x.shape, a)
        if diff.sum() < 2:  # one differing element has no "only" about it
            pass
        elif n >= 3 and where[-1] and not where[:-1].any():
            found.append({"signature": "last element only", "text": f"only the last index of {lab} differs",
                          "evidence": f"{int(diff.sum())} differing elements, all at index {n - 1} of axis {a}",
                          "confidence": 0.5})
        elif n >= 3 and (where[0] or where[-1]) and not where[1:-1].any():
            at = [i for i in (0, n - 1) if where[i]]
            found.append({"signature": "boundary only", "text": f"only the boundary of {lab} differs (index "
                          f"{' and '.join(map(str, at))})", "evidence": f"{int(diff.sum())} differing elements, all "
                          f"at the edge of axis {a}", "confidence": 0.5})
        xs, rs, ms = np.moveaxis(x, a, 0), np.moveaxis(r, a, 0), np.moveaxis(mask, a, 0)
        ss = None if scale is None or np.shape(scale) != x.shape else np.moveaxis(np.asarray(scale), a, 0)

        def same(i, j, xs=xs, rs=rs, ms=ms, ss=ss):
            # every element compared at i must have a compared counterpart at j
            if (ms[i] & ~ms[j]).any():
                return False
            return bool(_close(o, bound, xs[i], rs[j], ms[i], None if ss is None else ss[j]).all())

        if all(same(i, n - 1 - i) for i in range(n)):
            found.append({"signature": "mirrored", "text": f"{lab} in reverse order",
                          "evidence": f"index i of axis {a} holds the reference's index {n - 1} - i, every element "
                                      "within the allowance", "confidence": 0.8})
            continue
        for step in (1, -1):
            idx = range(1, n) if step == 1 else range(n - 1)
            changed = [i for i in idx if where[i]]
            if changed and all(same(i, i - step) for i in idx):
                found.append({"signature": "shift by one", "text": f"{lab} shifted by {step:+d} (index i holds the "
                              f"reference's i {'-' if step == 1 else '+'} 1)",
                              "evidence": f"{len(changed)} differing indices of axis {a}, each equal within the "
                                          "allowance to its neighbour in the reference", "confidence": 0.7})
                break
        if n <= MAX_AXIS and where.any():
            perm = []
            for i in range(n):
                js = [j for j in range(n) if j not in perm and same(i, j)]
                if not js:
                    perm = None
                    break
                perm.append(i if i in js else js[0])
            if perm is not None and perm != list(range(n)) and len(set(perm)) == n:
                moved = [f"{i}<-{j}" for i, j in enumerate(perm) if i != j]
                found.append({"signature": "permutation", "text": f"{lab} permuted: {', '.join(moved[:8])}"
                              + (" ..." if len(moved) > 8 else ""),
                              "evidence": f"each index of axis {a} equals (within the allowance) another index of "
                                          "the reference, a one-to-one map", "confidence": 0.8})
    return found


def _offset_signatures(vec, spec, impl: Mapping) -> list[dict]:
    if spec is None:
        return []
    found = []
    kw0 = fresh(vec)
    rng = any(k in kw0 for k in RNG_INPUTS)
    for field in OFFSET_FIELDS:
        if field not in kw0:
            continue
        v = np.asarray(kw0[field])
        if v.dtype.kind not in "iu":
            continue
        for step in (1, -1):
            def kwargs(field=field, step=step):
                kw = fresh(vec)
                kw[field] = (np.asarray(kw[field]) + step).astype(np.asarray(kw[field]).dtype) \
                    if np.ndim(kw[field]) else type(kw[field])(int(kw[field]) + step)
                return kw
            try:
                with np.errstate(all="ignore"):
                    ref = dict(spec.reference(**kwargs()))
                    if spec.scales is not None:
                        ref.update({(k if "." in k else f"{k}.scale"): s for k, s in spec.scales(kwargs(), ref).items()})
                    verdict = compare.compare(vec.outputs, ref, impl, vec.masks, vec.bounds, spec.force, kwargs,
                                              spec.independent, spec=spec)
            except Exception:  # noqa: BLE001, S112 - an input the reference refuses off by one: no signature
                continue
            if verdict.result in (Result.PASS, Result.ACCEPTABLE):
                what = "a position / RNG counter field" if rng and field != "window" else "an input"
                found.append({"signature": "input off by one",
                              "text": f"the reference's output with `{field}` {step:+d} ({what})",
                              "evidence": f"the implementation is {verdict.result.name} against the reference "
                                          f"rerun with {field} {step:+d}", "confidence": 0.85})
    return found


def signatures(vec, spec, impl: Mapping, maps: Mapping, diff: Mapping) -> list[dict]:
    """Structural hypotheses, most confident first."""
    from conformance.compare import full_masks

    masks = full_masks(vec.outputs, vec.expected, vec.masks)
    found = _offset_signatures(vec, spec, impl)
    for name, o in vec.outputs.items():
        if not diff[name].any():
            continue
        try:
            found += _axis_signatures(name, o, vec.bounds.get(name, {}), impl[name], vec.expected[name],
                                      masks[name], vec.expected.get(f"{name}.scale"), diff[name])
        except Exception:  # noqa: BLE001, S112 - an output whose shape defeats a signature: no signature
            continue
    found.sort(key=lambda h: -h["confidence"])
    return [{"kind": "structure", **h} for h in found]
