"""The draft_attention key set and its boolean mask, in NumPy only (docs/ops.md, draft_attention).

Both third-party adapters (examples/torch_sdpa/sdpa.py for PyTorch's SDPA backends,
examples/flashinfer/adapter.py for FlashInfer's prefill kernel) lay the keys out the same way
and hand the kernel the same mask, built here from the Op's inputs:

    keys, per batch row b with F = frontier[b]:
        columns 0 .. C-1      the C ring slots; slot s holds the unique p in [F - C, F) with
                              p = s (mod C), i.e. p = F - 1 - ((F - 1 - s) mod C); present when p >= 0
        columns C .. C+W-1    the W block rows at F + j; present when j < live[b]
    allowed[b, i, n]  for the query column i at F + i:
        key n present and (window == 0 or |p_n - (F + i)| < window)   (strict: distance S is out)

Positions stay int64 (the vectors reach 2^32 and beyond). Nothing here depends on torch, on a GPU
or on the reference, so tests/test_third_party_examples.py can check it against
reference.draft_attention.allowed on every vector.
"""

from __future__ import annotations

import numpy as np


def ring_positions(frontier, capacity: int) -> np.ndarray:
    """Absolute position [B, C] held by each ring slot (negative where the slot was never written)."""
    f = np.asarray(frontier, dtype=np.int64).reshape(-1, 1)
    capacity = int(capacity)
    if capacity <= 0:
        return np.zeros((f.shape[0], 0), dtype=np.int64)
    slots = np.arange(capacity, dtype=np.int64)[None, :]
    return f - 1 - np.mod(f - 1 - slots, capacity)


def key_positions(frontier, live, capacity: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """(positions [B, C+W], present [B, C+W]) of the keys: the ring slots, then the block rows."""
    f = np.asarray(frontier, dtype=np.int64).reshape(-1, 1)
    n_live = np.asarray(live, dtype=np.int64).reshape(-1, 1)
    ring = ring_positions(frontier, capacity)
    cols = np.arange(int(width), dtype=np.int64)[None, :]
    block = f + cols
    positions = np.concatenate([ring, block], axis=1)
    present = np.concatenate([ring >= 0, np.broadcast_to(cols < n_live, block.shape)], axis=1)
    return positions, present


def allowed_mask(frontier, live, capacity: int, width: int, window: int) -> np.ndarray:
    """Boolean [B, W, C+W]: True where query column i may attend key n (docs/ops.md, draft_attention)."""
    positions, present = key_positions(frontier, live, capacity, width)
    f = np.asarray(frontier, dtype=np.int64).reshape(-1, 1)
    queries = f + np.arange(int(width), dtype=np.int64)[None, :]  # [B, W]
    mask = np.broadcast_to(present[:, None, :], (present.shape[0], int(width), present.shape[1]))
    window = int(window)
    if window > 0:
        distance = np.abs(positions[:, None, :] - queries[:, :, None])
        mask = mask & (distance < window)
    return np.ascontiguousarray(mask, dtype=bool)


def pack_mask_rows(mask_2d) -> np.ndarray:
    """A [rows, keys] boolean mask as FlashInfer's packed custom mask: the row-major flattening,
    eight entries per byte, entry i in bit i % 8 of byte i // 8 (``flashinfer.packbits(...,
    bitorder="little")``), built here so that no FlashInfer kernel is needed to pack it."""
    return np.packbits(np.asarray(mask_2d, dtype=bool).reshape(-1), bitorder="little")
