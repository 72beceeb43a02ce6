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
    family = "capture"

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
    family = "capture"

    def feature_capture(self, block_outputs, eps, **kw):
        r = np.asarray(block_outputs, np.float64).copy()
        r[-1] = plain_rmsnorm(r[-1], np.ones(r.shape[-1]), 1e-6)
        return self._baseline(feature_capture, block_outputs=numerics.storage(r, "bf16"), eps=eps, **kw)


class Bf16TruncationFeatures(Mutant):
    """The context features stored BF16 by truncation."""

    op, pitfall, variant = "feature_capture", "bf16_truncation", "feature_capture"
    family = "rounding"

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
    family = "capture"

    def feature_capture(self, block_outputs, target_layer_ids, **kw):
        r = np.concatenate([np.zeros_like(block_outputs[:1]), block_outputs[:-1]], axis=0)
        return self._baseline(feature_capture, block_outputs=r, target_layer_ids=target_layer_ids, **kw)


# --- variants of the norm and capture families: same mechanism, other details -------------------


def _norm(x, w, eps, *, eps_outside_sqrt=False, eps_on_sum=False, sum_of_squares=False, weight_before=False,
          one_plus_weight=False):
    """plain_rmsnorm written out, with the formula slips engines ship as switches (all off: the spec's
    w * x / sqrt(mean(x^2) + eps))."""
    x = work(x)
    w = work(w)
    if one_plus_weight:  # a Gemma-style (1 + w) scale applied to a checkpoint that stores w itself
        w = w + x.dtype.type(1)
    if weight_before:  # the weight folded into x before the statistics are taken
        x = w * x
    sq = np.sum(x * x, axis=-1, keepdims=True)
    n = x.dtype.type(x.shape[-1])
    e = x.dtype.type(eps)
    if sum_of_squares:  # the sum of squares where the mean belongs
        r = np.sqrt(sq + e)
    elif eps_on_sum:  # eps added to the sum before the division by n (eps / n on the mean)
        r = np.sqrt((sq + e) / n)
    elif eps_outside_sqrt:
        r = np.sqrt(sq / n) + e
    else:
        r = np.sqrt(sq / n + e)
    return x / r if weight_before else w * (x / r)


class _NormMutant(Mutant):
    """feature_capture with the context norm's formula written out (``_norm``), one slip switched on."""

    op, pitfall, family = "feature_capture", "rmsnorm_formula", "norm"

    def feature_capture(self, block_outputs, fc_weight, hidden_norm, target_layer_ids, eps):
        with precision.baseline(registry.get(self.op).bf16_intermediates):
            r = work(block_outputs)
            s = np.concatenate([r[int(i)] for i in target_layer_ids], axis=-1)
            projected = inter(precision.matmul(s, work(fc_weight).T), "projected")
            out = _norm(projected, hidden_norm, eps, **self.bug)
        return {"context": numerics.storage(out, "bf16")}


class NormEpsOutsideSqrt(_NormMutant):
    """eps added after the square root: x / (sqrt(mean(x^2)) + eps)."""

    variant, BUG = "eps_outside_sqrt", {"eps_outside_sqrt": True}


class NormEpsOnSum(_NormMutant):
    """eps added to the sum of squares before dividing by n: sqrt((sum(x^2) + eps) / n)."""

    variant, BUG = "eps_on_sum", {"eps_on_sum": True}


class NormSumOfSquares(_NormMutant):
    """The sum of squares instead of their mean: x / sqrt(sum(x^2) + eps)."""

    variant, BUG = "sum_of_squares", {"sum_of_squares": True}


class NormWeightBefore(_NormMutant):
    """The weight applied before the normalization: (w x) / rms(w x), not w (x / rms(x))."""

    variant, BUG = "weight_before", {"weight_before": True}


class NormOnePlusWeight(_NormMutant):
    """A (1 + w) scale (the Gemma convention) on a checkpoint whose norm stores w."""

    variant, BUG = "one_plus_weight", {"one_plus_weight": True}


class _CaptureIdsMutant(Mutant):
    """The reference on the id list as a buggy engine reads it: ``ids(list, blocks) -> list``."""

    op, family = "feature_capture", "capture"

    def ids(self, ids, blocks):
        return ids

    def feature_capture(self, block_outputs, target_layer_ids, **kw):
        ids = self.ids([int(i) for i in target_layer_ids], block_outputs.shape[0])
        return self._baseline(feature_capture, block_outputs=block_outputs, target_layer_ids=ids, **kw)


class CaptureIdsSorted(_CaptureIdsMutant):
    """Features concatenated in ascending block order, not in the recorded id order (a capture hook
    that fills the buffer as the layers run)."""

    pitfall, variant = "capture_layer_order", "sorted"

    def ids(self, ids, blocks):
        return sorted(ids)


class CaptureIdsReversed(_CaptureIdsMutant):
    """Features concatenated last id first (a stack popped instead of a list read)."""

    pitfall, variant = "capture_layer_order", "reversed"

    def ids(self, ids, blocks):
        return ids[::-1]


class CaptureOneBased(_CaptureIdsMutant):
    """Ids read as one-based (block l - 1); id 0 reads index -1, the last block, as Python and
    wrapped pointer arithmetic have it."""

    pitfall = "capture_index_base"

    def ids(self, ids, blocks):
        return [(i - 1) % blocks for i in ids]
