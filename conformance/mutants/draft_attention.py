"""Mutants of draft_attention: window, causality, mask, ring, tail, position, V and GQA bugs."""

from __future__ import annotations

import numpy as np

from conformance import registry
from conformance.mutants.base import Mutant, _ArgsMutant, _causal, _gqa_perm, _int32, _truncate_bf16, _unwrapped_ring
from reference import numerics, precision
from reference.draft_attention import attend, draft_attention
from reference.precision import inter, work


class WindowLeS(Mutant):
    """Local window tested as |p_k - p_q| <= S: one key more on each side than < S."""

    op, pitfall = "draft_attention", "window_le_S"
    family = "window"

    def draft_attention(self, window, **kw):
        w = int(window)
        return self._baseline(draft_attention, window=w + 1 if w > 0 else 0, **kw)


class CausalDraftAttention(Mutant):
    """Block rows masked causally (a config that omits is_causal resolved to causal)."""

    op, pitfall = "draft_attention", "causal_draft_attention"
    family = "window"

    def draft_attention(self, q, live, **kw):
        return {"out": _causal(q.shape[1], lambda lv: self._baseline(draft_attention, q=q, live=lv, **kw)["out"], live)}


class Bf16TruncationAttention(Mutant):
    """The attention output stored BF16 by truncation instead of round-to-nearest-even."""

    op, pitfall = "draft_attention", "bf16_truncation"
    family = "rounding"

    def draft_attention(self, q, k, v, k_cache, v_cache, frontier, live, window):
        with precision.baseline(registry.get(self.op).bf16_intermediates):
            out = attend(q, k, v, k_cache, v_cache, frontier, live, int(window))
        return {"out": _truncate_bf16(out)}


def _attend_with(q, k, v, k_cache, v_cache, frontier, live, window: int, kind: str) -> np.ndarray:
    """reference.draft_attention.attend with one of the shipped mask bugs."""
    from reference import precision as Pm
    from reference.draft_attention import key_positions

    q, k, v = work(q), work(k), work(v)
    b, w, hq, d = q.shape
    hk = k.shape[2]
    keys = np.repeat(np.concatenate([work(k_cache), k], axis=1), hq // hk, axis=2)
    vals = np.repeat(np.concatenate([work(v_cache), v], axis=1), hq // hk, axis=2)
    pos, present = key_positions(frontier, live, k_cache.shape[1], w)
    pq = np.asarray(frontier, dtype=np.int64)[:, None] + np.arange(w, dtype=np.int64)
    if kind == "int32":  # positions held in int32: past 2^31 they wrap negative (a context key then is "absent")
        cap = k_cache.shape[1]
        pos, pq = _int32(pos), _int32(pq)
        present = present & np.concatenate([pos[:, :cap] >= 0, np.ones_like(present[:, cap:])], axis=1)
    mask = np.broadcast_to(present[:, None, :], (b, w, pos.shape[1])).copy()
    if window > 0:
        dist = pos[:, None, :] - pq[:, :, None]
        if kind == "left_only":  # the window bounds keys before the query only
            mask &= dist > -window
        elif kind == "shared_length":  # every row windowed from the block's last position
            last = (np.asarray(frontier, dtype=np.int64) + w - 1)[:, None, None]
            mask &= (pos[:, None, :] > last - window) & (np.abs(dist) < window)
        else:
            mask &= np.abs(dist) < window
    mask = mask[:, None]
    s = Pm.einsum("bihd,bkhd->bhik", q, keys) * q.dtype.type(1.0 / np.sqrt(d))
    s = np.where(mask, s, -np.inf)
    m = np.max(s, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    p = np.where(mask, Pm.exp(s - m), 0)
    row_sum = np.sum(p, axis=-1)
    p = inter(p, "probs")
    pv = Pm.einsum("bhik,bkhd->bihd", p, np.where(np.isfinite(vals), vals, 0))
    denom = np.transpose(row_sum, (0, 2, 1))[..., None]
    return np.divide(pv, denom, out=np.zeros_like(pv), where=denom > 0)


class _MaskMutant(Mutant):
    op = "draft_attention"
    kind = ""

    def draft_attention(self, q, k, v, k_cache, v_cache, frontier, live, window):
        with precision.baseline(registry.get(self.op).bf16_intermediates):
            out = _attend_with(q, k, v, k_cache, v_cache, frontier, live, int(window), self.kind)
        return {"out": numerics.storage(out, "bf16")}


class LeftOnlyWindow(_MaskMutant):
    """Non-causal layer windowed on one side only (keys before the query), the left-only staircase."""

    pitfall, kind = "left_only_window", "left_only"
    family = "window"


class DecodeRowsSharedLength(_MaskMutant):
    """The block expanded into decode rows sharing one sequence length: every row's window starts
    from the block's last position (narrow by up to block - 1 keys)."""

    pitfall, kind = "decode_rows_shared_length", "shared_length"
    family = "window"


class WindowDropped(_ArgsMutant):
    """The sliding window silently dropped: a local layer attends like a full one."""

    op, pitfall, fn = "draft_attention", "window_dropped", draft_attention
    family = "window"

    def change(self, kw):
        return {**kw, "window": 0}


class WindowNarrow(_ArgsMutant):
    """Window bound one key short (|p_k - p_q| < S - 1): the key at distance S - 1 dropped."""

    op, pitfall, fn = "draft_attention", "mask_boundary", draft_attention
    family = "window"

    def change(self, kw):
        w = int(kw["window"])
        return {**kw, "window": w - 1 if w > 1 else w}


class RingReadUnwrapped(_ArgsMutant):
    """The context ring read without mod C: position p from slot p - max(0, F - C)."""

    op, pitfall, fn = "draft_attention", "ring_wrap", draft_attention
    family = "window"

    def change(self, kw):
        return {**kw, "k_cache": _unwrapped_ring(kw["k_cache"], kw["frontier"]),
                "v_cache": _unwrapped_ring(kw["v_cache"], kw["frontier"])}


class LiveIgnored(_ArgsMutant):
    """Block rows past the live extent attended (live taken as W)."""

    op, pitfall, fn = "draft_attention", "tail_extent", draft_attention
    family = "extent"

    def change(self, kw):
        return {**kw, "live": np.full_like(kw["live"], np.shape(kw["q"])[1])}


class Int32Positions(_MaskMutant):
    """Positions held in int32: past 2^31 they wrap negative (context keys vanish, distances jump)."""

    pitfall, kind = "positions_2p31", "int32"
    family = "positions"
    also = ("positions_2p32",)


class VInfTimesZero(Mutant):
    """Masked keys multiplied by their zero weight: an FP16-overflowed V outside the window gives 0 * inf = NaN."""

    op, pitfall = "draft_attention", "fp16_overflow"
    family = "rounding"

    def draft_attention(self, v_cache, **kw):
        out = np.asarray(self._baseline(draft_attention, v_cache=v_cache, **kw)["out"], np.float64)
        bad = ~np.isfinite(np.asarray(v_cache, np.float64)).reshape(v_cache.shape[0], -1).all(axis=1)
        out[bad] = np.nan
        return {"out": numerics.storage(out, "bf16")}


class GqaInterleaved(_ArgsMutant):
    """GQA head mapping interleaved (KV head h % Hk) instead of blocked (h // (Hq/Hk))."""

    op, pitfall, fn = "draft_attention", "gqa_head_mapping", draft_attention
    family = "gqa_head_mapping"

    def change(self, kw):
        self._perm = _gqa_perm(np.shape(kw["q"])[2], np.shape(kw["k"])[2])
        q = np.asarray(kw["q"])
        q2 = np.empty_like(q)
        q2[:, :, self._perm] = q
        return {**kw, "q": q2}

    def draft_attention(self, **kw):
        out = self._baseline(draft_attention, **self.change(dict(kw)))["out"]
        return {"out": out[:, :, self._perm]}


# --- variants of the window family (the ring's reader) and of the rounding family (the store) ------


class _RingReadMutant(_ArgsMutant):
    """The context ring read one slot off: position p from slot (p + shift) mod C."""

    op, pitfall, family, fn = "draft_attention", "ring_read_slot", "window", draft_attention
    shift = 0

    def change(self, kw):
        return {**kw, "k_cache": np.roll(kw["k_cache"], -self.shift, axis=1),
                "v_cache": np.roll(kw["v_cache"], -self.shift, axis=1)}


class RingReadPlusOne(_RingReadMutant):
    """Position p read from slot (p + 1) mod C (the writer's off-by-one, on the reader's side)."""

    variant, shift = "plus_one", 1


class RingReadMinusOne(_RingReadMutant):
    """Position p read from slot (p - 1) mod C."""

    variant, shift = "minus_one", -1


def _bf16_half_away(x) -> np.ndarray:
    """BF16 by rounding half away from zero (add half a quantum to the magnitude's bits, then truncate)."""
    bits = np.asarray(x, np.float32).view(np.uint32)
    up = (bits.astype(np.uint64) + np.uint64(0x8000)).astype(np.uint32) & np.uint32(0xFFFF0000)
    return numerics.storage(np.where(np.isfinite(x), up.view(np.float32).astype(np.float64), x), "bf16")


class _StoreRoundingMutant(Mutant):
    """The attention output stored BF16 by another rounding than round-to-nearest-even."""

    op, pitfall, family = "draft_attention", "store_rounding", "rounding"

    def draft_attention(self, q, k, v, k_cache, v_cache, frontier, live, window):
        with precision.baseline(registry.get(self.op).bf16_intermediates):
            out = np.asarray(attend(q, k, v, k_cache, v_cache, frontier, live, int(window)), np.float64)
        mode = self.bug.get("mode")
        if mode == "half_away":
            return {"out": _bf16_half_away(out)}
        if mode == "via_fp16":  # an FP16 staging buffer: FP16's range and rounding first, then BF16's
            with np.errstate(over="ignore"):
                out = out.astype(np.float16).astype(np.float64)
        return {"out": numerics.storage(out, "bf16")}


class StoreHalfAway(_StoreRoundingMutant):
    """BF16 rounded half away from zero (exact ties go up in magnitude, not to the even neighbour)."""

    variant, BUG = "half_away", {"mode": "half_away"}


class StoreViaFp16(_StoreRoundingMutant):
    """Double rounding through FP16: the output rounded to FP16 (overflowing past 65504) and then to BF16."""

    variant, BUG = "via_fp16", {"mode": "via_fp16"}
