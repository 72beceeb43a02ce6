"""Counter-based random numbers (CONTRACTS C3).

Philox4x32-10 (Salmon et al., Random123). Every random decision of a request is
a pure function of (seed, absolute position, purpose, index): the batch row
never enters the key, so permuting or regrouping a batch changes nothing.

    key     = (seed & 0xffffffff, seed >> 32)
    counter = (position & 0xffffffff, position >> 32, purpose, index)
    U       = ((x0 >> 8) | 1) * 2**-24          in (0, 1), exact in float32

Sampling from weights r over an ordered support is an exponential race:
argmax_v r(v) / E_v over r(v) > 0 with E_v = -ln U_v (U_v drawn at index v),
ties to the lowest index. The accept test for proposal d is U * q(d) < p(d).
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np

_M0 = np.uint64(0xD2511F53)
_M1 = np.uint64(0xCD9E8D57)
_W0 = np.uint64(0x9E3779B9)
_W1 = np.uint64(0xBB67AE85)
_MASK32 = np.uint64(0xFFFFFFFF)
_SHIFT = np.uint64(32)


class Purpose(IntEnum):
    DFLASH2_PROPOSAL = 1
    ACCEPT = 2
    CORRECTION = 3
    BONUS = 4


def philox4x32(counter, key, rounds: int = 10) -> np.ndarray:
    """Philox4x32-R. counter [..., 4] uint32-valued, key [..., 2]; returns [..., 4] uint32.

    Leading axes broadcast between counter and key.
    """
    c = np.asarray(counter, dtype=np.uint64)
    k = np.asarray(key, dtype=np.uint64)
    if c.shape[-1:] != (4,) or k.shape[-1:] != (2,):
        raise ValueError(f"philox4x32: counter must end in 4 words and key in 2, got {c.shape} and {k.shape}")
    if np.any(c > _MASK32) or np.any(k > _MASK32):
        raise ValueError("philox4x32: counter and key words must fit in 32 bits")
    c0, c1, c2, c3 = (c[..., i] for i in range(4))
    k0, k1 = k[..., 0], k[..., 1]
    c0, c1, c2, c3, k0, k1 = np.broadcast_arrays(c0, c1, c2, c3, k0, k1)
    for r in range(rounds):
        if r:
            k0 = (k0 + _W0) & _MASK32
            k1 = (k1 + _W1) & _MASK32
        p0 = _M0 * c0  # < 2**64: both factors are below 2**32
        p1 = _M1 * c2
        c0, c1, c2, c3 = (
            (p1 >> _SHIFT) ^ c1 ^ k0,
            p1 & _MASK32,
            (p0 >> _SHIFT) ^ c3 ^ k1,
            p0 & _MASK32,
        )
    return np.stack([c0, c1, c2, c3], axis=-1).astype(np.uint32)


def _split64(v) -> tuple[np.ndarray, np.ndarray]:
    v = np.asarray(v)
    if v.dtype.kind == "f":
        raise TypeError("seeds and positions must be integers, not floats")
    if np.any(v < 0) if v.dtype.kind == "i" else False:
        raise ValueError("seeds and positions must be non-negative")
    v = v.astype(np.uint64)
    return v & _MASK32, v >> _SHIFT


def key_of(seed) -> np.ndarray:
    lo, hi = _split64(seed)
    return np.stack([lo, hi], axis=-1)


def counter_of(position, purpose, index=0) -> np.ndarray:
    lo, hi = _split64(position)
    purpose = np.asarray(purpose, dtype=np.uint64)
    index = np.asarray(index, dtype=np.uint64)
    lo, hi, purpose, index = np.broadcast_arrays(lo, hi, purpose, index)
    return np.stack([lo, hi, purpose, index], axis=-1)


def word_to_uniform(x0) -> np.ndarray:
    """U = ((x0 >> 8) | 1) * 2**-24: open interval (0, 1), exact in float32."""
    x0 = np.asarray(x0, dtype=np.uint64)
    return ((x0 >> np.uint64(8)) | np.uint64(1)).astype(np.float64) * 2.0**-24


def uniform(seed, position, purpose, index=0) -> np.ndarray:
    """The keyed draw U(seed, position, purpose, index); broadcasts over its arguments."""
    seed = np.asarray(seed)
    ctr = counter_of(position, purpose, index)
    key = key_of(seed)
    key = np.broadcast_to(key, ctr.shape[:-1] + (2,)) if key.ndim < ctr.ndim else key
    return word_to_uniform(philox4x32(ctr, key)[..., 0])


def exponential_race(weights, seed, position, purpose) -> tuple[int, float]:
    """Sample an index of ``weights`` (1-D, non-negative, any scale) by the race.

    Returns (index, margin) where margin is the log-ratio between the winner's
    score r/E and the runner-up's (inf with one contender): the decision's
    distance from a tie, for comparison classes (C2).
    """
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1:
        raise ValueError("exponential_race: weights must be 1-D")
    support = np.flatnonzero(w > 0)
    if support.size == 0:
        raise ValueError("exponential_race: no positive weight")
    u = uniform(seed, position, purpose, support)
    score = np.log(w[support]) - np.log(-np.log(u))  # log(r / E): same order, no overflow
    best = int(np.argmax(score))  # first maximum: the lowest index wins ties
    others = np.delete(score, best)
    margin = float(score[best] - others.max()) if others.size else float("inf")
    return int(support[best]), margin
