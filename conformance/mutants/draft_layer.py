"""Mutants of draft_layer: the draft_attention bugs one level up, inside a draft layer."""

from __future__ import annotations

import numpy as np

from conformance.mutants.base import (
    Mutant,
    _ArgsMutant,
    _causal,
    _int32,
    _layer_gqa,
    _layer_rope_interleaved,
    _unwrapped_ring,
)
from reference.draft_layer import draft_layer


class WindowLeSLayer(Mutant):
    """The same window bug inside a draft layer."""

    op, pitfall, variant = "draft_layer", "window_le_S", "draft_layer"
    family = "window"

    def draft_layer(self, window, **kw):
        w = int(window)
        return self._baseline(draft_layer, window=w + 1 if w > 0 else 0, **kw)


class CausalDraftLayer(Mutant):
    """draft_layer whose attention is causal over the block rows."""

    op, pitfall, variant = "draft_layer", "causal_draft_attention", "draft_layer"
    family = "window"

    def draft_layer(self, x, live, **kw):
        return {"x_next": _causal(x.shape[1], lambda lv: self._baseline(draft_layer, x=x, live=lv, **kw)["x_next"],
                                  live)}


class LayerWindowNarrow(_ArgsMutant):
    op, pitfall, variant, fn = "draft_layer", "mask_boundary", "draft_layer", draft_layer
    family = "window"

    def change(self, kw):
        w = int(kw["window"])
        return {**kw, "window": w - 1 if w > 1 else w}


class LayerRingReadUnwrapped(_ArgsMutant):
    op, pitfall, variant, fn = "draft_layer", "ring_wrap", "draft_layer", draft_layer
    family = "window"

    def change(self, kw):
        return {**kw, "k_cache": _unwrapped_ring(kw["k_cache"], kw["frontier"]),
                "v_cache": _unwrapped_ring(kw["v_cache"], kw["frontier"])}


class LayerLiveIgnored(_ArgsMutant):
    op, pitfall, variant, fn = "draft_layer", "tail_extent", "draft_layer", draft_layer
    family = "extent"

    def change(self, kw):
        return {**kw, "live": np.full_like(kw["live"], np.shape(kw["x"])[1])}


class LayerInt32Positions(_ArgsMutant):
    op, pitfall, variant, fn = "draft_layer", "positions_2p31", "draft_layer", draft_layer
    family = "positions"
    also = ("positions_2p32",)

    def change(self, kw):
        return {**kw, "frontier": _int32(kw["frontier"])}


class LayerRopeInterleaved(_ArgsMutant):
    """GPT-J (interleaved pairs) RoPE on the block's Q and K instead of split halves."""

    op, pitfall, variant, fn = "draft_layer", "rope_interleaved", "draft_layer", draft_layer
    family = "rope"

    def change(self, kw):
        return _layer_rope_interleaved(kw)


class LayerGqaInterleaved(_ArgsMutant):
    op, pitfall, variant, fn = "draft_layer", "gqa_head_mapping", "draft_layer", draft_layer
    family = "gqa_head_mapping"

    def change(self, kw):
        return _layer_gqa(kw)
