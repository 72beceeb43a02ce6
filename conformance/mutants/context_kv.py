"""Mutants of context_kv: ring slots and wrap, K/V representation, RoPE positions and layout."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from conformance.mutants.base import Mutant, _split_of_interleaved
from reference import numerics
from reference.context_kv import chunk_rows, paged_rows, ring_slots
from reference.norms import plain_head_rmsnorm, rope_1d
from reference.precision import represent, work


def _fp32_rope(x, positions, theta):
    """RoPE with angles formed in FP32 from FP32 positions (exact only below 2^24). The inverse
    frequencies as HF and vLLM form them, 1 / theta^(2i / D) in FP32: past 2^24 the angle is
    position times them, so one ulp of another formula moves it by whole turns."""
    d = x.shape[-1]
    inv = (np.float32(1.0) / np.float32(theta) ** (np.arange(0, d, 2).astype(np.float32) / np.float32(d)))
    ang = (np.asarray(positions).astype(np.float32)[..., None] * inv)[..., None, :]
    cos, sin = np.cos(ang.astype(np.float64)).astype(x.dtype), np.sin(ang.astype(np.float64)).astype(x.dtype)
    lo, hi = x[..., : d // 2], x[..., d // 2:]
    return np.concatenate([lo * cos - hi * sin, hi * cos + lo * sin], axis=-1)


def _rope_interleaved(x, positions, theta):
    """GPT-J RoPE: pairs (2i, 2i+1) rotated by angle i, instead of the spec's split halves (i, i + D/2)."""
    x = work(x)
    d = x.shape[-1]
    perm = _split_of_interleaved(d)
    y = rope_1d(x[..., perm], positions, theta)
    out = np.empty_like(y)
    out[..., perm] = y
    return out


def _context_kv(context, k_cache, v_cache, wk, wv, k_norm, start, eps, theta, head_dim, storage, page_size=None,
                page_table=None, *, k_raw_bf16=False, v_via_bf16=True, ring_shift=0, fp32_positions=False,
                rope_interleaved=False, bf16_positions=False, no_wrap=False, first_rows=False, v_saturate=False,
                v_ftz=False):
    """context_kv written out with its representation and slot choices as switches."""
    c = work(context)
    start, rows = int(start), c.shape[0]
    positions = start + np.arange(rows, dtype=np.int64)
    k_raw = (c @ work(wk).T).reshape(rows, -1, int(head_dim))
    if k_raw_bf16:  # the projection GEMM writes its output in the model dtype before the norm
        k_raw = represent(k_raw, "bf16")
    rope = _fp32_rope if fp32_positions else (_rope_interleaved if rope_interleaved else rope_1d)
    rope_pos = numerics.to_bf16(positions.astype(np.float64)) if bf16_positions else positions
    k = represent(rope(plain_head_rmsnorm(k_raw, k_norm, eps, int(head_dim)), rope_pos, theta), "bf16")
    v_raw = (c @ work(wv).T).reshape(k.shape)
    v = represent(represent(v_raw, "bf16") if v_via_bf16 else v_raw, "fp16")
    if v_saturate:  # a saturating FP16 cast: overflow to +-65504 instead of +-inf
        v = np.clip(v, -65504.0, 65504.0)
    if v_ftz:  # FP16 subnormals flushed to zero
        v = np.where(np.abs(v) < 2.0**-14, np.copysign(0.0, v), v)
    k_out, v_out = work(k_cache).copy(), work(v_cache).copy()
    if storage == "ring":
        cap = k_out.shape[0]
        keep = np.arange(min(rows, cap)) if first_rows else chunk_rows(rows, cap)
        slots = ring_slots(positions[keep] + ring_shift, cap)
        if no_wrap:  # written linearly from the chunk's first slot: rows past the ring's end are lost
            lin = positions[keep][0] % cap + np.arange(len(keep)) if len(keep) else np.zeros(0, np.int64)
            keep, slots = keep[lin < cap], slots[lin < cap]
        k_out[slots], v_out[slots] = k[keep], v[keep]
    else:
        page, row = paged_rows(positions, page_table, int(page_size))
        k_out[page, row], v_out[page, row] = k, v
    return {"k_cache": k_out, "v_cache": v_out, "frontier": np.asarray(start + rows, dtype=np.int64)}


class _KvMutant(Mutant):
    """context_kv written out (``_context_kv``) with the subclass's bug switched in."""

    op = "context_kv"

    def context_kv(self, **kw):
        return self._baseline(_context_kv, **self.bug, **kw)


class RingSlot(_KvMutant):
    """Ring slot (p + 1) mod C: the write lands one slot past where readers look."""

    op, pitfall = "context_kv", "ring_slot"
    family = "window"

    BUG: ClassVar[dict] = {"ring_shift": 1}


class KBf16BeforeNorm(_KvMutant):
    """Raw context K rounded to BF16 between projection and head norm. C1 forbids it, but the
    head norm is scale-invariant, so the error is one BF16 rounding of the normalized K: the
    size of the legitimate rounding of the norm's output before RoPE (C2 v2). The suite flags
    it ACCEPTABLE(precision) at its cases, which --strict fails; no envelope can FAIL it
    without failing that legitimate engine."""

    op, pitfall = "context_kv", "k_bf16_before_norm"
    family = "rounding"
    expect = "precision"

    BUG: ClassVar[dict] = {"k_raw_bf16": True}


class Fp32Positions(_KvMutant):
    """RoPE angles from FP32 positions (the HF/vLLM habit): positions above 2^24 lose bits."""

    op, pitfall = "context_kv", "positions_2p31"
    family = "positions"

    BUG: ClassVar[dict] = {"fp32_positions": True}


class Fp32Positions2p32(Fp32Positions):
    op, pitfall, variant = "context_kv", "positions_2p32", "fp32_positions"
    family = "positions"


class VFp16WithoutBf16(_KvMutant):
    """Context V rounded straight to FP16, skipping the BF16 step of FP16_RNE(BF16(v))."""

    op, pitfall = "context_kv", "v_fp16_without_bf16"
    family = "rounding"

    BUG: ClassVar[dict] = {"v_via_bf16": False}


class RingWriteNoWrap(_KvMutant):
    """A chunk written linearly from its first slot: rows past the ring's end are lost, not wrapped."""

    pitfall = "ring_wrap"
    family = "window"
    BUG: ClassVar[dict] = {"no_wrap": True}


class ChunkFirstRows(_KvMutant):
    """A chunk longer than the ring keeps its first C rows instead of its last C."""

    pitfall = "chunk_longer_than_S"
    family = "window"
    BUG: ClassVar[dict] = {"first_rows": True}


class VSaturating(_KvMutant):
    """Context V cast to FP16 with saturation: overflow gives +-65504, not +-inf (C1)."""

    pitfall = "fp16_overflow"
    family = "rounding"
    BUG: ClassVar[dict] = {"v_saturate": True}


class VFtz(_KvMutant):
    """FP16 subnormals of V flushed to zero (C1 keeps them)."""

    pitfall = "fp16_subnormal"
    family = "rounding"
    BUG: ClassVar[dict] = {"v_ftz": True}


class KvRopeInterleaved(_KvMutant):
    """Context K rotated GPT-J style (interleaved pairs) instead of split halves."""

    pitfall = "rope_interleaved"
    family = "rope"
    BUG: ClassVar[dict] = {"rope_interleaved": True}


class KvRopeBf16Positions(_KvMutant):
    """RoPE table built in BF16: positions above 256 are not exact (candle #3520, sglang #33117)."""

    pitfall = "rope_bf16_table"
    family = "rope"
    BUG: ClassVar[dict] = {"bf16_positions": True}


# --- a variant of the window family: the ring's writer off by one the other way ------------------


class RingSlotMinusOne(_KvMutant):
    """Ring slot (p - 1) mod C: the write lands one slot before where readers look."""

    op, pitfall, variant, family = "context_kv", "ring_slot", "minus_one", "window"

    BUG: ClassVar[dict] = {"ring_shift": -1}
