"""Mutants of masked_block: the anchor, the DFlash2 columns, and the attention bugs in every layer."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from conformance.mutants.base import Mutant, _ArgsMutant, _int32, _layer_gqa, _layer_rope_interleaved, _unwrapped_ring
from reference.draft_layer import forward
from reference.masked_block import CONV_WEIGHTS, LAYER_WEIGHTS, block_tokens, masked_block
from reference.norms import plain_rmsnorm
from reference.precision import inter, represent, work


class WindowLeSBlock(Mutant):
    """The same window bug in every local layer of the masked block."""

    op, pitfall, variant = "masked_block", "window_le_S", "masked_block"
    family = "window"

    def masked_block(self, windows, **kw):
        return self._baseline(masked_block, windows=[int(w) + 1 if int(w) > 0 else 0 for w in windows], **kw)


class AnchorAsMask(Mutant):
    """The anchor column embedded as MASK instead of the committed token."""

    op, pitfall = "masked_block", "anchor_as_mask"
    family = "anchor_as_mask"

    def masked_block(self, anchor, mask_token_id, **kw):
        return self._baseline(masked_block, anchor=np.full_like(anchor, mask_token_id),
                              mask_token_id=mask_token_id, **kw)


def _masked_block(anchor, embed, frontier, live, context_k, context_v, final_norm, mask_token_id, windows, eps, theta,
                  head_dim, variant, num_drafts, *, live_only=False, **weights):
    """masked_block written out; ``live_only``: DFlash2 attends over the live (verifiable) columns only."""
    names = LAYER_WEIGHTS + (CONV_WEIGHTS if variant == "dflash2" else ())
    x = work(embed)[block_tokens(anchor, mask_token_id, int(num_drafts))]
    attn_live = np.asarray(live) if variant == "dflash" or live_only else np.full(x.shape[0], x.shape[1])
    for layer, window in enumerate(windows):
        x = inter(forward(x, context_k[layer], context_v[layer], frontier, attn_live, eps=eps, theta=theta,
                          head_dim=head_dim, window=int(window), variant=variant,
                          **{n: weights[n][layer] for n in names}), "x")
    return {"hidden": represent(plain_rmsnorm(x, final_norm, eps)[:, 1:], "bf16")}


class Dflash2AllColumns(Mutant):
    """DFlash2 computing only the verifiable columns near a request's tail (verify_size =
    min(block_size, ...)): the block's attention sees live rows only, as DFlash's does."""

    op, pitfall = "masked_block", "dflash2_all_columns"
    family = "extent"

    BUG: ClassVar[dict] = {"live_only": True}

    def masked_block(self, **kw):
        return self._baseline(_masked_block, **self.bug, **kw)


class BlockWindowNarrow(_ArgsMutant):
    op, pitfall, variant, fn = "masked_block", "mask_boundary", "masked_block", masked_block
    family = "window"

    def change(self, kw):
        return {**kw, "windows": [int(w) - 1 if int(w) > 1 else int(w) for w in kw["windows"]]}


class BlockRingReadUnwrapped(_ArgsMutant):
    op, pitfall, variant, fn = "masked_block", "ring_wrap", "masked_block", masked_block
    family = "window"

    def change(self, kw):
        return {**kw, "context_k": np.stack([_unwrapped_ring(c, kw["frontier"]) for c in kw["context_k"]]),
                "context_v": np.stack([_unwrapped_ring(c, kw["frontier"]) for c in kw["context_v"]])}


class BlockLiveIgnored(_ArgsMutant):
    """DFlash's block attends every column, not just the live P + 1."""

    op, pitfall, variant, fn = "masked_block", "tail_extent", "masked_block", masked_block
    family = "extent"

    def change(self, kw):
        return {**kw, "live": np.full_like(kw["live"], int(kw["num_drafts"]) + 1)}


class BlockInt32Positions(_ArgsMutant):
    op, pitfall, variant, fn = "masked_block", "positions_2p32", "masked_block", masked_block
    family = "positions"
    also = ("positions_2p31",)

    def change(self, kw):
        return {**kw, "frontier": _int32(kw["frontier"])}


class BlockRopeInterleaved(_ArgsMutant):
    op, pitfall, variant, fn = "masked_block", "rope_interleaved", "masked_block", masked_block
    family = "rope"

    def change(self, kw):
        return _layer_rope_interleaved(kw, lead=True)


class BlockGqaInterleaved(_ArgsMutant):
    op, pitfall, variant, fn = "masked_block", "gqa_head_mapping", "masked_block", masked_block
    family = "gqa_head_mapping"

    def change(self, kw):
        return _layer_gqa(kw)
