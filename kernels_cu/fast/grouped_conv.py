"""grouped_conv in the fast mode: the delta projection W_delta x as one BF16 GEMM on the resident projection (x is
BF16, so its products are the exact mode's), then the exact mode's conv_prepare / conv_finish kernels (coefficient
formed first, multiplied once; BF16 at the reference's points). The exact mode converts the projection to FP32 on
every call."""

from __future__ import annotations

import numpy as np

from kernels_cu.exact.attention import _NULL, _THREADS, _fn, _grid, bf16_bits, f32
from kernels_cu.fast.gemm import cp, gemm_bf16


class FastGroupedConvMixin:
    """grouped_conv over the resident BF16 projection (needs ``self._bits`` and ``self._f32`` of FastSelectBackend)."""

    def grouped_conv(self, *, x, z, base, proj):
        xb, zb = bf16_bits(x), bf16_bits(z)
        b, w, h = xb.shape
        if h % 16:
            raise ValueError(f"grouped_conv: hidden width {h} is not a multiple of 16")
        pw = self._bits(proj)
        if pw.shape != (4 * (h // 16), h):
            raise ValueError(f"grouped_conv: proj {tuple(pw.shape)}, expected {(4 * (h // 16), h)}")
        if zb.shape != xb.shape:
            raise ValueError(f"grouped_conv: z {tuple(zb.shape)} and x {tuple(xb.shape)} differ")
        bw = self._f32(base)
        rows = b * w
        delta = gemm_bf16(xb.reshape(rows, h), pw)  # [B*W, 4G] fp32
        prepared = cp().empty(xb.shape, dtype=np.uint16)
        fd = cp().empty((b, w, 2, h // 16), dtype=np.uint16)
        finished = cp().empty(xb.shape, dtype=np.uint16)
        if rows:
            _fn("exact/grouped_conv", "conv_prepare")(
                _grid(rows * h), (_THREADS,),
                (f32(xb), delta, bw, np.int32(w), np.int64(rows), np.int32(h), prepared, _NULL, fd))
            _fn("exact/grouped_conv", "conv_finish")(
                _grid(rows * h), (_THREADS,),
                (f32(zb), fd, bw, np.int32(w), np.int64(rows), np.int32(h), _NULL, _NULL, finished))
        return {"prepared": prepared, "finish_delta": fd, "finished": finished}
