"""Context K/V materialization for one draft layer (spec: "Each draft layer independently projects
this common c_t into its context K/V"; CONTRACTS C1 representation, C7 storage).

For the T rows of a prefill chunk at absolute positions t = start .. start+T-1:

    k_raw(t) = W_context_key c_t                      no BF16 cast before the head norm
    k_ctx(t) = BF16(rope_1d(plain_head_rmsnorm(k_raw(t), key_norm), position=t))
    v_ctx(t) = FP16_RNE(BF16(W_context_value c_t))    (numerics.context_v)

Storage "ring" ([C, Hk, D]): position p goes to slot p mod C; a chunk longer than C writes only its
final C rows; the frontier becomes start + T either way, and the live interval is
[max(0, F - C), F). Storage "paged" ([pages, page_size, Hk, D]): position p goes to physical
page page_table[p // page_size], row p % page_size; live positions are [0, F). The returned caches
are the input caches with these writes applied; everything outside the live positions is
unspecified. The fused materializer keeps k_raw and the normalized K private, so the baseline has
no BF16 intermediate here.
"""

from __future__ import annotations

import numpy as np

from reference import precision as P
from reference.backend import portable, xp
from reference.norms import plain_head_rmsnorm, rope_1d
from reference.precision import represent, work


def chunk_rows(rows: int, capacity: int | None) -> np.ndarray:
    """Indices into the chunk of the rows that are stored (all, or the final ``capacity`` of a ring)."""
    first = 0 if capacity is None else max(0, rows - capacity)
    return xp.arange(first, rows)


def ring_slots(positions, capacity: int) -> np.ndarray:
    return xp.mod(xp.asarray(positions, dtype=np.int64), capacity)


def paged_rows(positions, page_table, page_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(physical page, row in page) of each absolute position."""
    p = xp.asarray(positions, dtype=np.int64)
    return xp.asarray(page_table, dtype=np.int64)[p // page_size], p % page_size


def live_mask(frontier: int, cache_shape, storage: str, page_table=None, page_size=None) -> np.ndarray:
    """Boolean of ``cache_shape``: the elements holding a live position (C7), the compared ones."""
    mask = xp.zeros(cache_shape[:-2], dtype=bool)
    if storage == "ring":
        capacity = cache_shape[0]
        mask[ring_slots(xp.arange(max(0, frontier - capacity), frontier), capacity)] = True
    else:
        mask[paged_rows(xp.arange(frontier), page_table, int(page_size))] = True
    return xp.broadcast_to(mask[..., None, None], cache_shape).copy()


@portable
def context_kv(
    context, k_cache, v_cache, wk, wv, k_norm, start, eps, theta, head_dim, storage, page_size=None, page_table=None,
) -> dict[str, np.ndarray]:
    c = work(context)
    start, rows = int(start), c.shape[0]
    positions = start + xp.arange(rows, dtype=np.int64)
    k_raw = P.matmul(c, work(wk).T).reshape(rows, -1, int(head_dim))  # [T, Hk, D] even when Hk = 1
    k = represent(rope_1d(plain_head_rmsnorm(k_raw, k_norm, eps, int(head_dim)), positions, theta), "bf16")
    v_raw = P.matmul(c, work(wv).T).reshape(k.shape)
    v = represent(represent(v_raw, "bf16"), "fp16")

    k_out, v_out = work(k_cache).copy(), work(v_cache).copy()
    store_rows(k_out, v_out, positions, k, v, storage, page_table, page_size)
    return {"k_cache": k_out, "v_cache": v_out, "frontier": xp.asarray(start + rows, dtype=np.int64)}


def store_rows(k_out, v_out, positions, k, v, storage: str, page_table=None, page_size=None) -> None:
    """Write the chunk's rows (positions ``positions``) into the caches in place (C7): a ring keeps
    the chunk's last capacity rows at slot p mod capacity; pages go through the page table."""
    if storage == "ring":
        keep = chunk_rows(len(positions), k_out.shape[0])
        slots = ring_slots(positions[keep], k_out.shape[0])
        k_out[slots], v_out[slots] = k[keep], v[keep]
    elif storage == "paged":
        page, row = paged_rows(positions, page_table, int(page_size))
        k_out[page, row], v_out[page, row] = k, v
    else:
        raise ValueError(f"context_kv: storage must be 'ring' or 'paged', got {storage!r}")
