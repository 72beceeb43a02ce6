"""The head GEMM on a cuBLASLt algorithm chosen by timing, for FastRound and proposal_head (fast mode).

x [M, K] BF16 bits @ w [N, K]^T -> fp32 [M, N], FP32 accumulation (CUBLAS_COMPUTE_32F), as
``fast_block.CaptureGemm`` (cublasGemmEx with the default algorithm) computes it. At the round's head
shapes (N the vocabulary, M = B (W - 1) rows) the default is not the fastest: on the H200 (inside graphs, weights
from DRAM)
timed the heuristic's algorithms at 578 against 625 us (27B, M 7), 239 against 251 (35B, M 7) and 282
against 304 (35B, M 120); at 27B M 120 none beat the default.

``LtGemm.tune`` asks cublasLtMatmulAlgoGetHeuristic for up to ``candidates`` algorithms of the shape,
times each against gemmEx on the caller's arrays (eager, CUDA events, median of ``reps``; the head
is 1-2.5 GB, far above L2, so every call streams it from DRAM), and keeps the fastest only where it
beats gemmEx by more than ``margin`` (else calls stay on gemmEx). Split-K algorithms are allowed with
a reduction in FP32 (CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE / OUTPUT_TYPE, both FP32 here), not the
in-place scheme; the chosen algorithm's outputs are the same bits on every call (tests/gpu). The call
goes to the current stream with a workspace of its own, so it may be captured into a CUDA graph.

Numerics: a different algorithm adds the same products in another order (other K tiles, or K
slices summed in FP32): the logits differ from gemmEx's in the last bits, inside the FP32
accumulation bound (docs/contracts.md C2) that the suite applies to any engine. The choice is made by
timing, so two processes may choose differently and their logits may differ in the last bits (a near
tie may then pick another token); within a process a shape keeps its choice per owner (``tuned``'s
cache: one FastRound, one FastCudaBackend). Where bitwise
reproducibility across processes matters more than ~4-9 % of the head GEMM, turn it off
(FastOptions(round_head_lt=False, proposal_head_lt=False), kernels_cu/fast/options.py).
"""

from __future__ import annotations

import ctypes
import statistics

import numpy as np

from kernels_cu.fast.gemm import loaded_library

_COMPUTE_32F, _R_32F, _R_16BF = 68, 0, 14
_DESC_TRANSA, _DESC_TRANSB = 3, 4
_PREF_MAX_WORKSPACE, _PREF_REDUCTION_MASK = 1, 3
_REDUCTION_FP32 = 2 | 4  # COMPUTE_TYPE | OUTPUT_TYPE (NONE always allowed; INPLACE excluded)

# The users' defaults (fast_round.FastRound's head, fast.FastSelectBackend.proposal_head): keep an algorithm
# only where it beats gemmEx by more than MARGIN, and tune only heads of MIN_BYTES or more (below, a few
# percent is timing noise, and the small vectors keep gemmEx's bits).
MARGIN = 0.02
MIN_BYTES = 256 << 20


class HeuristicResult(ctypes.Structure):
    """cublasLtMatmulHeuristicResult_t (cublasLt.h): the opaque algorithm, its workspace size and status."""

    _fields_ = [("algo", ctypes.c_uint64 * 8), ("workspaceSize", ctypes.c_size_t), ("state", ctypes.c_int),
                ("wavesCount", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


def cp():
    import cupy

    return cupy


def tuned(cache: dict, x, w, out, fallback, *, margin: float | None = None, max_shapes: int = 8):
    """out = x @ w.T through a per-shape cache {(M, N, K): LtGemm or None} of its owner: the shape's first
    call tunes (eagerly: never call this while capturing), later calls reuse the choice, so a shape keeps
    one algorithm in a process (one owner). Any cuBLASLt failure leaves that shape on ``fallback``
    (gemmEx), the error recorded under cache[("error", M, N, K)]. At most ``max_shapes`` tuned shapes are
    kept (the oldest dropped: 32 MiB of workspace each). ``margin`` None: MARGIN as it is at the call."""
    M, K = x.shape
    key = (M, w.shape[0], K)
    if key in cache:
        g = cache[key]
        return fallback(x, w, out) if g is None else g(x, w, out)
    try:
        cp().cuda.device.get_cublas_handle()  # CuPy's cuBLAS (and with it its cublasLt) loaded first
        cache[key] = LtGemm(*key, fallback).tune(x, w, out, margin=MARGIN if margin is None else margin)
    except Exception as exc:  # noqa: BLE001 - cuBLASLt unavailable or refusing: gemmEx, and say why
        cache[key] = None
        cache[("error", *key)] = f"{type(exc).__name__}: {exc}"
        fallback(x, w, out)
    shapes = [k for k in cache if len(k) == 3]
    for old in shapes[:-max_shapes]:
        g = cache.pop(old)
        if g is not None:
            g.free()


def describe(cache: dict) -> dict:
    """``tuned``'s cache as a record: 'M x N x K' -> the tuning's timings (us per call of gemmEx and of each
    algorithm, and the choice), or {'chosen': 'gemmEx', 'error': ...} where cuBLASLt failed for the shape."""
    return {"x".join(map(str, k)): g.timings if g is not None else {"chosen": "gemmEx",
                                                                    "error": cache.get(("error", *k))}
            for k, g in cache.items() if len(k) == 3}


def _aligned(*arrays) -> bool:
    """Every array at the 256-byte alignment the heuristic assumes (its default MIN_ALIGNMENT preferences)."""
    return not any(a.data.ptr % 256 for a in arrays)


def matmul_descriptors(lt, M: int, N: int, K: int, workspace_bytes: int, reduction_mask: int | None = None):
    """The cuBLASLt descriptors of x [M, K] BF16 @ w [N, K]^T -> fp32 [M, N] (COMPUTE_32F; column-major
    C^T [N, M] = w (op T) x): (desc, la, lb, lc, pref), the preference holding the workspace limit and, if
    given, the reduction-scheme mask. Raises RuntimeError naming the call that failed. free_descriptors
    releases them."""
    vp, i32, sz = ctypes.c_void_p, ctypes.c_int32, ctypes.c_size_t  # attribute sizes as size_t

    def check(status: int, what: str):
        if status != 0:
            raise RuntimeError(f"LtGemm: {what} returned cuBLAS status {status}")

    desc, la, lb, lc, pref = vp(), vp(), vp(), vp(), vp()
    check(lt.cublasLtMatmulDescCreate(ctypes.byref(desc), _COMPUTE_32F, _R_32F), "MatmulDescCreate")
    for attr, val in ((_DESC_TRANSA, 1), (_DESC_TRANSB, 0)):
        v = i32(val)
        check(lt.cublasLtMatmulDescSetAttribute(desc, attr, ctypes.byref(v), sz(4)), "DescSetAttribute")
    for lay, dt, rows, cols in ((la, _R_16BF, K, N), (lb, _R_16BF, K, M), (lc, _R_32F, N, M)):
        check(lt.cublasLtMatrixLayoutCreate(ctypes.byref(lay), dt, ctypes.c_uint64(rows), ctypes.c_uint64(cols),
                                            ctypes.c_int64(rows)), "LayoutCreate")
    check(lt.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "PreferenceCreate")
    ws = ctypes.c_uint64(workspace_bytes)
    check(lt.cublasLtMatmulPreferenceSetAttribute(pref, _PREF_MAX_WORKSPACE, ctypes.byref(ws), sz(8)),
          "PreferenceSetAttribute")
    if reduction_mask is not None:
        mask = ctypes.c_uint32(reduction_mask)
        check(lt.cublasLtMatmulPreferenceSetAttribute(pref, _PREF_REDUCTION_MASK, ctypes.byref(mask), sz(4)),
              "PreferenceSetAttribute")
    return desc, la, lb, lc, pref


def free_descriptors(lt, desc, la, lb, lc, pref):
    lt.cublasLtMatmulPreferenceDestroy(pref)
    for lay in (la, lb, lc):
        lt.cublasLtMatrixLayoutDestroy(lay)
    lt.cublasLtMatmulDescDestroy(desc)


def lt_library():
    """The libcublasLt that CuPy's cuBLAS loaded (else the first one the loader finds)."""
    return loaded_library("libcublasLt")


class LtGemm:
    """One (M, N, K) shape: the cuBLASLt descriptors, the tuned algorithm (or None: gemmEx), a workspace."""

    WORKSPACE_BYTES = 32 << 20
    _handle = None
    _lt = None

    def __init__(self, M: int, N: int, K: int, fallback):
        self.shape = (M, N, K)
        self.fallback = fallback  # CaptureGemm: the default algorithm
        self.algo = None
        self.timings: dict = {}
        if LtGemm._lt is None:
            LtGemm._lt = lt_library()
            h = ctypes.c_void_p()
            self._check(LtGemm._lt.cublasLtCreate(ctypes.byref(h)), "cublasLtCreate")
            LtGemm._handle = h
        self.desc, self.la, self.lb, self.lc, self.pref = matmul_descriptors(LtGemm._lt, M, N, K, self.WORKSPACE_BYTES,
                                                                             _REDUCTION_FP32)
        self.workspace = cp().empty(self.WORKSPACE_BYTES, dtype=np.uint8)
        self._alpha, self._beta = ctypes.c_float(1.0), ctypes.c_float(0.0)

    @staticmethod
    def _check(status: int, what: str):
        if status != 0:
            raise RuntimeError(f"LtGemm: {what} returned cuBLAS status {status}")

    def heuristics(self, candidates: int) -> list:
        res = (HeuristicResult * candidates)()
        got = ctypes.c_int32()
        st = LtGemm._lt.cublasLtMatmulAlgoGetHeuristic(LtGemm._handle, self.desc, self.la, self.lb, self.lc,
                                                       self.lc, self.pref, candidates, res, ctypes.byref(got))
        if st != 0:
            return []
        return [res[i] for i in range(got.value) if res[i].state == 0 and res[i].workspaceSize <= self.WORKSPACE_BYTES]

    def run_algo(self, algo, x, w, out):
        vp = ctypes.c_void_p
        stream = vp(cp().cuda.get_current_stream().ptr)
        self._check(LtGemm._lt.cublasLtMatmul(LtGemm._handle, self.desc, ctypes.byref(self._alpha), vp(w.data.ptr),
                                              self.la, vp(x.data.ptr), self.lb, ctypes.byref(self._beta),
                                              vp(out.data.ptr), self.lc, vp(out.data.ptr), self.lc,
                                              ctypes.byref(algo), vp(self.workspace.data.ptr),
                                              ctypes.c_size_t(self.WORKSPACE_BYTES), stream), "cublasLtMatmul")

    def _check_args(self, x, w, out):
        M, N, K = self.shape
        if (tuple(x.shape) != (M, K) or tuple(w.shape) != (N, K) or tuple(out.shape) != (M, N)
                or not (x.flags.c_contiguous and w.flags.c_contiguous and out.flags.c_contiguous)):
            raise ValueError(f"LtGemm{self.shape}: shapes {x.shape} @ {w.shape}.T -> {out.shape} (C-contiguous)")

    def tune(self, x, w, out, *, candidates: int = 8, reps: int = 5, margin: float = 0.02):
        """Time gemmEx and each heuristic algorithm on these arrays (the current stream, eager); keep the
        fastest algorithm where it beats gemmEx by more than ``margin``. Returns self. Never while a stream
        captures (the timing needs events and host waits)."""
        self._check_args(x, w, out)
        if not _aligned(x, w, out):
            self.timings = {"chosen": "gemmEx", "why": "arrays not 256-byte aligned"}
            self.fallback(x, w, out)
            return self
        c = cp()
        s = c.cuda.get_current_stream()

        def timed(fn, calls: int = 4) -> float:  # us a call; calls back to back, so the host's launch
            fn()                                   # cost hides behind the GPU's work after the first
            ts = []
            for _ in range(reps):
                e0, e1 = c.cuda.Event(), c.cuda.Event()
                e0.record(s)
                for _ in range(calls):
                    fn()
                e1.record(s)
                e1.synchronize()
                ts.append(c.cuda.get_elapsed_time(e0, e1) * 1e3 / calls)
            return statistics.median(ts)

        base = timed(lambda: self.fallback(x, w, out))
        self.timings = {"gemmEx": round(base, 2)}
        best, best_t, chosen = None, base * (1.0 - margin), "gemmEx"
        for i, h in enumerate(self.heuristics(candidates)):
            try:
                t = timed(lambda h=h: self.run_algo(h.algo, x, w, out))
            except RuntimeError as exc:  # an algorithm the heuristic offered but the call refused: skip it
                self.timings[f"lt{i}"] = str(exc)
                continue
            self.timings[f"lt{i}"] = round(t, 2)
            if t < best_t:
                best, best_t, chosen = h, t, f"lt{i}"
        self.algo = None if best is None else best.algo
        self.timings["chosen"] = chosen
        self(x, w, out)  # the outputs of the chosen path
        return self

    def __call__(self, x, w, out):
        """out = x @ w.T on the tuned algorithm; gemmEx where none was kept, or where an array is not at
        the 256-byte alignment the heuristic assumed (its default preference) for the tuned one."""
        if self.algo is None or not _aligned(x, w, out):
            return self.fallback(x, w, out)
        self._check_args(x, w, out)
        self.run_algo(self.algo, x, w, out)

    def free(self):
        if LtGemm._lt is None or getattr(self, "desc", None) is None:
            return
        free_descriptors(LtGemm._lt, self.desc, self.la, self.lb, self.lc, self.pref)
        self.desc = None

    def __del__(self):
        try:
            self.free()
        except Exception:  # noqa: BLE001,S110 - interpreter shutdown: the library may be gone already
            pass
