"""The block's layer GEMMs at few rows on kernels_cu/fast_gemv.cu (issue 12, fast mode).

``gemv_into(x, w, out)``: out [M, N] fp32 = x [M, K] @ w [N, K]^T, BF16 bits, FP32 accumulation on the
tensor cores, M <= MAX_M (16). ``takes(M, N, K)`` says whether a shape runs here (GEMV on, K % 32 == 0,
N % 16 == 0); fast_block's engine (``CudaEngine.layer_gemm``) sends the layers' GEMMs of such shapes
here instead of cuBLAS, whole (no K-split partials). The kernel is a plain launch, so it may be
captured into a CUDA graph. See the .cu header for the layout and the numerics.
"""

from __future__ import annotations

import functools

import numpy as np

from kernels_cu.loader import load_module

GEMV = True  # False: every layer GEMM on cuBLAS (as before session v9)
MAX_M = 16
_THREADS = 256  # fast_gemv.cu FGV_WARPS * 32


def cp():
    import cupy

    return cupy


@functools.cache
def _fn(name: str):
    return load_module("fast_gemv").get_function(name)


def takes(M: int, N: int, K: int) -> bool:
    return bool(GEMV) and 1 <= M <= MAX_M and K >= 32 and K % 32 == 0 and N >= 16 and N % 16 == 0


def gemv_into(x, w, out) -> bool:
    """out = x @ w.T on fast_gemv.cu; False (nothing launched) where the arrays do not fit its contract
    (shape, C order, 16-byte rows): the caller runs its GEMM instead."""
    M, K = x.shape
    N = w.shape[0]
    if (not takes(M, N, K) or w.shape[1] != K or tuple(out.shape) != (M, N) or x.dtype != np.uint16
            or w.dtype != np.uint16 or out.dtype != np.float32
            or not (x.flags.c_contiguous and w.flags.c_contiguous and out.flags.c_contiguous)
            or x.data.ptr % 16 or w.data.ptr % 16):
        return False
    _fn("fast_gemv_n1" if M <= 8 else "fast_gemv_n2")((N // 16,), (_THREADS,),
                                                      (x, w, out, np.int32(M), np.int32(N), np.int32(K)))
    return True
