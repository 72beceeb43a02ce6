"""BF16 GEMMs and device-resident weights shared by the fast kernels (kernels_cu/fast/backend.py,
kernels_cu/fast/block.py): cuBLAS gemmEx with BF16 inputs, FP32 output and FP32 accumulation
(CUBLAS_COMPUTE_32F), and the per-source-array cache of BF16 weight bits."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

# cuBLAS / CUDA enums (stable ABI values)
_OP_N, _OP_T = 0, 1
_CUDA_R_32F, _CUDA_R_16BF = 0, 14
_CUBLAS_COMPUTE_32F = 68
_CUBLAS_GEMM_DEFAULT = -1
_POINTER_MODE_HOST = 0


def cp():
    import cupy

    return cupy


def loaded_library(stem: str):
    """ctypes handle of the CUDA library ``stem`` (e.g. "libcublas", "libcublasLt") that this process
    already loaded (CuPy's, found in /proc/self/maps), else the first of stem.so.13 / .12 / .so the loader
    finds. RuntimeError if none: then CuPy has not loaded it and the toolkit's copy is not on the path."""
    import ctypes

    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1]
                if f"/{stem}.so" in path:
                    return ctypes.CDLL(path)
    except OSError:  # no /proc (not Linux): the loader's search below
        pass
    for name in (f"{stem}.so.13", f"{stem}.so.12", f"{stem}.so"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise RuntimeError(f"{stem} is not loaded in this process and not found by the loader")


def data_ptr(a) -> int:
    """The address of an array's first element: a CuPy array's device pointer, or a NumPy array's
    host address (host weights before they are made resident; NumPy stand-ins in CPU plan tests)."""
    ptr = getattr(getattr(a, "data", None), "ptr", None)
    return int(ptr) if ptr is not None else int(a.__array_interface__["data"][0])


def _key(a) -> tuple:
    """Identity of a weight array: the object, its data pointer, shape, strides and dtype."""
    return (id(a), data_ptr(a), tuple(a.shape), tuple(a.strides), str(a.dtype))


class ResidentWeights:
    """Device-resident BF16 weights keyed by the source array (held, so its id and pointer
    cannot be reused while the entry lives). LRU over at most ``max_bytes``."""

    def __init__(self, max_bytes: int = 48 << 30):
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple, tuple] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def get(self, key: tuple, sources: tuple, build):
        hit = self._entries.get(key)
        if hit is not None:
            self._entries.move_to_end(key)
            self.hits += 1
            return hit[1]
        self.misses += 1
        value = build()
        self._entries[key] = (sources, value)
        while len(self._entries) > 1 and sum(v[1].nbytes for v in self._entries.values()) > self.max_bytes:
            self._entries.popitem(last=False)
        return value

    def clear(self):
        self._entries.clear()


def gemm_path() -> str:
    try:
        from cupy_backends.cuda.libs import cublas  # noqa: F401

        return "cublas gemmEx (A, B CUDA_R_16BF; C CUDA_R_32F; CUBLAS_COMPUTE_32F; CUBLAS_GEMM_DEFAULT)"
    except Exception as exc:  # noqa: BLE001
        return f"fp32 cupy.matmul fallback ({type(exc).__name__})"


def gemm_bf16(x, w, out=None):
    """x [M, K] BF16 bits @ w [N, K] BF16 bits .T -> fp32 [M, N]; FP32 accumulation (cuBLAS
    gemmEx, CUBLAS_COMPUTE_32F). Row-major C [M, N] is column-major C^T = w (op T) * x."""
    c = cp()
    x = c.ascontiguousarray(x)
    w = c.ascontiguousarray(w)
    M, K = x.shape
    N = w.shape[0]
    if w.shape[1] != K:
        raise ValueError(f"gemm_bf16: inner dimensions differ: {x.shape} and {w.shape}")
    if out is None:
        out = c.empty((M, N), dtype=np.float32)
    if M == 0 or N == 0:
        return out
    if K == 0:
        out.fill(0)
        return out
    from cupy_backends.cuda.libs import cublas

    handle = c.cuda.device.get_cublas_handle()
    cublas.setPointerMode(handle, _POINTER_MODE_HOST)
    alpha = np.ones(1, dtype=np.float32)
    beta = np.zeros(1, dtype=np.float32)
    cublas.gemmEx(handle, _OP_T, _OP_N, N, M, K, alpha.ctypes.data, w.data.ptr, _CUDA_R_16BF, K, x.data.ptr,
                  _CUDA_R_16BF, K, beta.ctypes.data, out.data.ptr, _CUDA_R_32F, N, _CUBLAS_COMPUTE_32F,
                  _CUBLAS_GEMM_DEFAULT)
    return out
