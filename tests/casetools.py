"""Helpers shared by the per-Op test files."""

from __future__ import annotations

import hashlib
import json
import math

import numpy as np

from reference import numerics, precision
from reference.rng import uniform


def fingerprint(generated) -> list[str]:
    """One digest per case over its id, params, flags, inputs and masks (dtype, shape and bytes):
    two generator runs must give the same list."""
    out = []
    for c in generated:
        h = hashlib.sha256(json.dumps([c.id, c.params, c.flags], sort_keys=True).encode())
        for name in sorted(c.inputs) + sorted(f"mask:{m}" for m in c.masks):
            a = np.asarray(c.masks[name[5:]] if name.startswith("mask:") else c.inputs[name])
            h.update(f"{name}{a.dtype}{a.shape}".encode() + a.tobytes())
        out.append(h.hexdigest())
    return out


def check_generator(generate, pitfalls=(), count=(10, 60)) -> list:
    """Two runs give identical cases, ids are unique, the case count is in range, and each
    pitfall is flagged exactly on the cases whose id names it (``op/<pitfall>__...``).
    Returns the cases for further checks."""
    a, b = generate(), generate()
    assert fingerprint(a) == fingerprint(b)
    ids = [c.id for c in a]
    assert len(ids) == len(set(ids)) and count[0] <= len(ids) <= count[1]
    for c in a:
        for pitfall in pitfalls:
            assert (pitfall in c.flags) == (f"/{pitfall}__" in c.id), c.id
    return a


def bound_and_ref(spec, case, name, fmt):
    """The harness's max-ULP allowance (C2): 2x the float32 baseline's max ULP error + 1."""
    ref = spec.reference(**case.kwargs())[name]
    with precision.baseline(spec.bf16_intermediates):
        base = spec.reference(**case.kwargs())[name]
    mask = case.masks[name]
    return 2 * numerics.ulp_error(base, ref, fmt)[mask].max() + 1, ref, mask


def U(seed, pos, purpose, index=0) -> float:
    """One keyed uniform of C3."""
    return float(uniform(np.uint64(seed), pos, purpose, index))


def race(weights, seed, pos, purpose):
    """The C3 race as written, a loop independent of reference.rng.exponential_race:
    argmax r(v) / E_v, E_v = -ln U_v, lowest index on ties."""
    best, score = None, -1.0
    for v, w in enumerate(weights):
        if w > 0:
            s = w / -math.log(U(seed, pos, purpose, v))
            if s > score:
                best, score = v, s
    return best


U32 = 0xFFFFFFFF


def philox_py(counter, key):
    """Philox4x32-10 in plain Python ints (Salmon et al.), independent of reference.rng."""
    c, k = list(counter), list(key)
    for rnd in range(10):
        if rnd:
            k = [(k[0] + 0x9E3779B9) & U32, (k[1] + 0xBB67AE85) & U32]
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [(p1 >> 32) ^ c[1] ^ k[0], p1 & U32, (p0 >> 32) ^ c[3] ^ k[1], p0 & U32]
    return c
