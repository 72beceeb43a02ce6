"""feature_capture in the fast mode: the chosen target blocks concatenated as BF16 bits (exact:
the inputs are BF16), one BF16 tensor-core GEMM with FP32 accumulation through the resident
fc weight, then the exact mode's RMSNorm kernel (plain_rmsnorm, BF16 out).

The exact mode converts the blocks and the fc weight to FP32 and runs an SGEMM on every call
(at the 27B width the fc weight is 5120 x 25600: 262 MB of BF16, 524 MB as FP32 copies). The
products are the same (BF16 x BF16 is exact in FP32); only the order of the FP32 accumulation
differs, which CONTRACTS C2 admits (the output is BF16 after the norm: an FP32 accumulation over
25600 terms moves it far less than one BF16 ulp).
"""

from __future__ import annotations

import numpy as np

from kernels_cu.fast_gemm import cp, gemm_bf16
from kernels_cu.ops_attention import bf16_bits, rmsnorm


class FastCaptureMixin:
    """feature_capture over resident BF16 weights (needs ``self._bits`` and ``self._f32``)."""

    def feature_capture(self, *, block_outputs, fc_weight, hidden_norm, target_layer_ids, eps):
        blocks = bf16_bits(block_outputs)
        lt, t, ht = blocks.shape
        ids = [int(i) for i in target_layer_ids]
        if not ids or any(not 0 <= i < lt for i in ids):
            raise ValueError(f"feature_capture: block ids {ids} outside 0..{lt - 1}")
        fc = self._bits(fc_weight)
        if fc.ndim != 2 or fc.shape[1] != len(ids) * ht:
            raise ValueError(f"feature_capture: fc_weight {tuple(fc.shape)} does not take {len(ids)} x {ht} features")
        # [T, n * Ht]: row t holds block ids[0] row t, then ids[1] row t, ...; a gather of bits
        s = cp().ascontiguousarray(blocks[cp().asarray(ids, dtype=np.int64)].transpose(1, 0, 2).reshape(t, -1))
        projected = gemm_bf16(s, fc)
        _, context = rmsnorm(projected, self._f32(hidden_norm), eps, f32_out=False, bf16_out=True)
        return {"context": context}
