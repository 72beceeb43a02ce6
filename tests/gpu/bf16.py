"""BF16 bits for the GPU tests' inputs: float32 values truncated to their top 16 bits (any BF16 values will do), and
the bits read back exactly as float64 for the references."""

from __future__ import annotations

import numpy as np


def truncate(a) -> np.ndarray:
    """float32 array -> its BF16 bits by truncation (uint16)."""
    return (np.asarray(a, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)


def gauss_bits(rng, shape) -> np.ndarray:
    """Standard-normal draws of ``rng`` (a Generator, or a seed for a fresh one), cast to float32, as BF16 bits."""
    if not isinstance(rng, np.random.Generator):
        rng = np.random.default_rng(rng)
    return truncate(rng.standard_normal(shape).astype(np.float32))


def to_f64(bits) -> np.ndarray:
    """BF16 bits -> their values as float64 (exact)."""
    return (np.asarray(bits).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
