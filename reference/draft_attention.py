"""Non-causal draft attention over the context ring and the query block (spec: "Draft attention is
non-causal over context and query-block K/V"; CONTRACTS C7 for the ring, C2 for the baseline).

Row b, query column i sits at p_q = F + i (F = frontier[b]). Its keys are

    context  p in [max(0, F - C), F), read from ring slot p mod C
    block    F + j for j < live[b]
    local layer (window S > 0):  allowed(p_q, p_k) = abs(p_k - p_q) < S
    full layer  (window 0):      every key above
    out[b,i,h] = sum_k softmax_k(q[b,i,h] . key_k / sqrt(D)) value_k,   key/value of KV head h // (Hq/Hk)

Nothing is causal: query i sees block rows j > i. A query row with no allowed key (possible only
for rows >= live) gets zeros; those rows are unspecified.

The softmax is written the way a flash kernel runs it: unnormalized P = exp(s - max) feeds the PV
product and the FP32 row sum divides at the end. Production kernels cast P to BF16 as the
tensor-core operand of PV while scores and row sums stay FP32, so "probs" is the one intermediate
the baseline keeps in BF16.
"""

from __future__ import annotations

import numpy as np

from reference import precision as P
from reference.backend import portable, xp
from reference.precision import inter, represent, work


def key_positions(frontier, live, capacity: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Absolute positions [B, C+W] of the C ring slots then the W block rows, and which are present.

    Slot s holds the unique p in [F - C, F) with p = s (mod C); it is present when p >= 0.
    """
    f = xp.asarray(frontier, dtype=np.int64)[:, None]
    slot = xp.arange(capacity, dtype=np.int64)
    p_ctx = f - capacity + xp.mod(slot - (f - capacity), capacity)
    p_blk = f + xp.arange(width, dtype=np.int64)
    present_blk = xp.arange(width) < xp.asarray(live, dtype=np.int64)[:, None]
    return xp.concatenate([p_ctx, p_blk], axis=1), xp.concatenate([p_ctx >= 0, present_blk], axis=1)


def _in_window(p_k, p_q, window: int):
    """The local window's rule: a key at position p_k is within the window of the query at p_q."""
    return xp.abs(p_k - p_q) < window


def allowed(frontier, live, capacity: int, width: int, window: int) -> np.ndarray:
    """Boolean [B, W queries, C+W keys]: which key each query row may attend."""
    pos, present = key_positions(frontier, live, capacity, width)
    pq = xp.asarray(frontier, dtype=np.int64)[:, None] + xp.arange(width, dtype=np.int64)
    mask = xp.broadcast_to(present[:, None, :], (pos.shape[0], width, pos.shape[1]))
    if window > 0:
        mask = mask & _in_window(pos[:, None, :], pq[:, :, None], window)
    return mask


def attend(q, k, v, k_cache, v_cache, frontier, live, window: int) -> np.ndarray:
    """The attention output [B, W, Hq, D] before its represented rounding (draft_layer uses it)."""
    q, k, v = work(q), work(k), work(v)
    _, w, hq, d = q.shape
    hk = k.shape[2]
    if hq % hk:
        raise ValueError(f"draft_attention: {hq} query heads are not a multiple of {hk} KV heads")
    keys = xp.concatenate([work(k_cache), k], axis=1)
    vals = xp.concatenate([work(v_cache), v], axis=1)
    keys, vals = xp.repeat(keys, hq // hk, axis=2), xp.repeat(vals, hq // hk, axis=2)
    mask = allowed(frontier, live, k_cache.shape[1], w, window)[:, None]  # [B, 1, W, C+W]
    s = P.einsum("bihd,bkhd->bhik", q, keys) * q.dtype.type(1.0 / np.sqrt(d))
    s = xp.where(mask, s, -np.inf)
    m = xp.max(s, axis=-1, keepdims=True)
    m = xp.where(xp.isfinite(m), m, 0)
    p = xp.where(mask, P.exp(s - m), 0)
    row_sum = xp.sum(p, axis=-1)  # [B, Hq, W], from the unrounded P as a flash kernel keeps it
    p = inter(p, "probs")
    finite = xp.isfinite(vals)
    pv = P.einsum("bhik,bkhd->bihd", p, xp.where(finite, vals, 0))
    # A non-finite V (FP16 overflow is kept, C1) counts only where it is attended: a key
    # outside the window or the populated bounds must not turn 0 * inf into NaN.
    for b, key, h, j in xp.argwhere(~finite).tolist():
        weight = p[b, h, :, key]
        with np.errstate(invalid="ignore"):
            pv[b, :, h, j] += xp.where(weight > 0, weight * vals[b, key, h, j], 0)
    denom = xp.transpose(row_sum, (0, 2, 1))[..., None]
    return xp.where(denom > 0, pv / xp.where(denom > 0, denom, 1), 0)  # rows with no key: zeros


@portable
def draft_attention(q, k, v, k_cache, v_cache, frontier, live, window) -> dict[str, np.ndarray]:
    """The Op: ``out`` [B, W, Hq, D], represented BF16 (rows < live compared)."""
    return {"out": represent(attend(q, k, v, k_cache, v_cache, frontier, live, int(window)), "bf16")}
