"""feature_capture in the fast mode (grouped_conv's fast path: kernels_cu/fast/grouped_conv.py).

feature_capture: the chosen target blocks concatenated as BF16 bits (fast/feature_capture.cu
``fc_gather_bits``, a copy: the inputs are BF16), one BF16 tensor-core GEMM with FP32 accumulation
through the resident fc weight, then the exact mode's RMSNorm kernel (plain_rmsnorm, BF16 out).
The exact mode converts the blocks and the fc weight to FP32 and runs an SGEMM on every call (at
the 27B width the fc weight is 5120 x 25600: 262 MB of BF16). The products are the same (BF16 x
BF16 is exact in FP32); only the order of the FP32 accumulation differs, which CONTRACTS C2 admits
(the output is BF16 after the norm: its BF16-chain envelope counts the GEMM's FP32 accumulation,
reference.magnitude.linear, far below one BF16 rounding).
"""

from __future__ import annotations

import numpy as np

from kernels_cu.exact.attention import _THREADS, _grid, bf16_bits, capture_ids, rmsnorm
from kernels_cu.fast.gemm import cp, gemm_bf16
from kernels_cu.loader import load_module

_IDS: dict = {}  # (device, ids) -> the device int32 array of the block ids, kept across calls


def _ids_on_device(ids: tuple):
    key = (cp().cuda.Device().id, ids)
    if key not in _IDS:
        _IDS[key] = cp().asarray(np.asarray(ids, dtype=np.int32))
    return _IDS[key]


def gather_blocks(blocks, ids) -> object:
    """[T, n * Ht] BF16 bits: row t = blocks[ids[0], t] ++ blocks[ids[1], t] ++ ..."""
    _, t, ht = blocks.shape
    out = cp().empty((t, len(ids) * ht), dtype=np.uint16)
    if out.size:
        blocks = cp().ascontiguousarray(blocks)
        vec = ht % 8 == 0 and blocks.data.ptr % 16 == 0  # out is a fresh (aligned) allocation
        load_module("fast/feature_capture").get_function("fc_gather_bits")(
            _grid(out.size // 8 if vec else out.size), (_THREADS,),
            (blocks, _ids_on_device(tuple(ids)), np.int32(len(ids)), np.int64(t), np.int32(ht), np.int32(vec), out))
    return out


class FastCaptureMixin:
    """feature_capture over the resident BF16 fc weight (needs ``self._bits`` and ``self._f32`` of
    FastSelectBackend)."""

    def feature_capture(self, *, block_outputs, fc_weight, hidden_norm, target_layer_ids, eps):
        blocks = bf16_bits(block_outputs)
        ht = blocks.shape[2]
        ids = capture_ids(blocks, target_layer_ids)
        fc = self._bits(fc_weight)
        if fc.ndim != 2 or fc.shape[1] != len(ids) * ht:
            raise ValueError(f"feature_capture: fc_weight {tuple(fc.shape)} does not take {len(ids)} x {ht} features")
        projected = gemm_bf16(gather_blocks(blocks, ids), fc)
        _, context = rmsnorm(projected, self._f32(hidden_norm), eps, f32_out=False, bf16_out=True)
        return {"context": context}
