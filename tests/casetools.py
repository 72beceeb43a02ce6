"""Helpers shared by the per-Op test files."""

from __future__ import annotations

import hashlib
import json

import numpy as np


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
