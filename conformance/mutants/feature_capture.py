"""Mutants of feature_capture: which target block is read, and how the features are stored."""

from __future__ import annotations

import numpy as np

from conformance import registry
from conformance.mutants.base import Mutant, _truncate_bf16
from reference import numerics, precision
from reference.feature_capture import feature_capture
from reference.norms import plain_rmsnorm
from reference.precision import inter, work


class BoundaryIndex(Mutant):
    """Target layer id l read one entry late (block l + 1): hidden-state boundaries
    (embedding at 0) mixed up with block ids."""

    op, pitfall = "feature_capture", "boundary_index"

    def feature_capture(self, block_outputs, target_layer_ids, **kw):
        # the engine's list ends with the last block: an id past it reads that block
        last = block_outputs.shape[0] - 1
        ids = [min(int(i) + 1, last) for i in target_layer_ids]
        return self._baseline(feature_capture, block_outputs=block_outputs, target_layer_ids=ids, **kw)


class LastBlockFinalNorm(Mutant):
    """The last block's output taken from Hugging Face hidden_states[-1], which holds
    norm(block output). The target's final norm weight is not an input of the Op, so a
    unit weight stands in for it (the bug is the normalization, not the weight)."""

    op, pitfall = "feature_capture", "last_block_final_norm"

    def feature_capture(self, block_outputs, eps, **kw):
        r = np.asarray(block_outputs, np.float64).copy()
        r[-1] = plain_rmsnorm(r[-1], np.ones(r.shape[-1]), 1e-6)
        return self._baseline(feature_capture, block_outputs=numerics.storage(r, "bf16"), eps=eps, **kw)


class Bf16TruncationFeatures(Mutant):
    """The context features stored BF16 by truncation."""

    op, pitfall, variant = "feature_capture", "bf16_truncation", "feature_capture"

    def feature_capture(self, block_outputs, fc_weight, hidden_norm, target_layer_ids, eps):
        with precision.baseline(registry.get(self.op).bf16_intermediates):
            r = work(block_outputs)
            s = np.concatenate([r[int(i)] for i in target_layer_ids], axis=-1)
            out = plain_rmsnorm(inter(precision.matmul(s, work(fc_weight).T), "projected"), hidden_norm, eps)
        return {"context": _truncate_bf16(out)}


class CaptureBeforeLayer(Mutant):
    """Capture taken at each block's input: id l reads block l - 1's output (id 0 reads the
    embedding, which is not an input here: zeros), so the last block is never captured."""

    op, pitfall = "feature_capture", "capture_before_layer"

    def feature_capture(self, block_outputs, target_layer_ids, **kw):
        r = np.concatenate([np.zeros_like(block_outputs[:1]), block_outputs[:-1]], axis=0)
        return self._baseline(feature_capture, block_outputs=r, target_layer_ids=target_layer_ids, **kw)
