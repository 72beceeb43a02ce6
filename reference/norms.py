"""Shared layer pieces: plain RMSNorm, full-head RMSNorm, scalar RoPE, SiLU.

    plain_rmsnorm(x, w) = w * x / sqrt(mean(x^2) + eps)        (over the last axis)
    plain_head_rmsnorm(x, w): the same over each head's D values, w of shape [D]
    rope_1d(x, p): full-head split-half rotation. For i < D/2,
        f_i = theta ** (-2i / D),  a = p * f_i,
        out[i]       = x[i] cos a - x[i + D/2] sin a
        out[i + D/2] = x[i + D/2] cos a + x[i] sin a
"""

from __future__ import annotations

import numpy as np

from reference import precision as P
from reference.backend import xp
from reference.precision import work


def plain_rmsnorm(x, weight, eps: float) -> np.ndarray:
    x = work(x)
    ms = xp.mean(x * x, axis=-1, keepdims=True)
    return work(weight) * (x / xp.sqrt(ms + x.dtype.type(eps)))


def plain_head_rmsnorm(x, weight, eps: float, head_dim: int) -> np.ndarray:
    """x [..., n_heads, D] -> [..., n_heads, D].

    Callers split heads first: a flat [..., n_heads * D] input is ambiguous when
    n_heads = 1, so it is refused rather than guessed.
    """
    x = work(x)
    if x.ndim < 2 or x.shape[-1] != head_dim:
        raise ValueError(f"plain_head_rmsnorm: expected [..., heads, {head_dim}], got shape {x.shape}")
    return plain_rmsnorm(x, weight, eps)


def rope_angles(positions, head_dim: int, theta: float) -> np.ndarray:
    """Angles [..., D/2] for integer absolute positions (any size up to 2**63).

    Angles are always formed in float64 from the exact integer position: a
    float32 position cannot represent positions above 2**24.
    """
    half = head_dim // 2
    inv_freq = float(theta) ** (-xp.arange(half, dtype=np.float64) * 2.0 / head_dim)
    pos = xp.asarray(positions, dtype=np.int64).astype(np.float64)
    return pos[..., None] * inv_freq


def rope_1d(x, positions, theta: float) -> np.ndarray:
    """Rotate x [..., n_heads, D] at positions [...] (broadcast over heads)."""
    x = work(x)
    d = x.shape[-1]
    ang = rope_angles(positions, d, theta)[..., None, :]  # [..., 1, D/2]
    cos, sin = xp.cos(ang).astype(x.dtype), xp.sin(ang).astype(x.dtype)
    lo, hi = x[..., : d // 2], x[..., d // 2 :]
    return xp.concatenate([lo * cos - hi * sin, hi * cos + lo * sin], axis=-1)


def silu(x) -> np.ndarray:
    x = work(x)
    return x / (1 + P.exp(-x))
