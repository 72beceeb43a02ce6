"""Would choosing cuBLASLt algorithms per shape beat cublasGemmEx's default at the round's GEMMs?
(H200 probe, issue 12.) For each (M, N, K) of the proposal round (row-major x [M, K] BF16 @ w [N, K]^T
-> fp32 [M, N], FP32 accumulation, as kernels_cu.fast_gemm.gemm_bf16), asks
cublasLtMatmulAlgoGetHeuristic for up to 16 algorithms, times each (CUDA events, median, L2 flushed)
and prints the default gemmEx time, the heuristic's first choice, the best of all and the floor (the
bytes at the copy bandwidth measured in the same run; not a hard bound for a read-only stream).

    python -m benchmarks.lt_probe [--json out.json]

ctypes on the libcublasLt that CuPy's cuBLAS loaded; enum values from cublasLt.h (CUDA 12/13).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys

from kernels_cu.fast_lt import HeuristicResult, free_descriptors, lt_library, matmul_descriptors

SHAPES = [  # (M, N, K): 27B DFlash2 B1 W8 / B8 W16 then 35B DFlash, layer GEMMs and the head
    (16, 1280, 5120), (8, 6144, 5120), (8, 5120, 4096), (8, 34816, 5120), (8, 5120, 17408), (7, 248320, 5120),
    (256, 1280, 5120), (128, 6144, 5120), (128, 5120, 4096), (128, 34816, 5120), (128, 5120, 17408),
    (120, 248320, 5120),
    (8, 6144, 2048), (8, 2048, 4096), (8, 12288, 2048), (8, 2048, 6144), (7, 248320, 2048),
    (128, 6144, 2048), (128, 2048, 4096), (128, 12288, 2048), (128, 2048, 6144), (120, 248320, 2048),
]


def lt_setup(lt, handle, m: int, n: int, k: int, ws_bytes: int, algos: int):
    """The cuBLASLt objects of x [m, k] BF16 @ w [n, k]^T -> fp32 [m, n] (kernels_cu.fast_lt's descriptors, every
    reduction scheme allowed) and up to ``algos`` heuristic results: (desc, la, lb, lc, pref, results, count,
    status). Free the first five with lt_free."""
    desc, la, lb, lc, pref = matmul_descriptors(lt, m, n, k, ws_bytes)
    res = (HeuristicResult * algos)()
    got = ctypes.c_int32()
    st = lt.cublasLtMatmulAlgoGetHeuristic(handle, desc, la, lb, lc, lc, pref, algos, res, ctypes.byref(got))
    return desc, la, lb, lc, pref, res, got.value, st


lt_free = free_descriptors


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--algos", type=int, default=16)
    args = ap.parse_args(argv)
    import cupy as cp
    import numpy as np
    import torch

    from benchmarks.gpu_bench import Timer, measure_ceilings
    from kernels_cu.fast_gemm import gemm_bf16

    gemm_bf16(cp.zeros((2, 8), np.uint16), cp.zeros((2, 8), np.uint16))  # loads libcublas (and Lt)
    timer = Timer(cp, torch)
    copy_bw = measure_ceilings(cp, torch, timer)["copy_bandwidth_TBps"] * 1e12  # the floors' rate
    lt = lt_library()
    vp = ctypes.c_void_p
    handle = vp()
    assert lt.cublasLtCreate(ctypes.byref(handle)) == 0
    ws_bytes = 32 << 20
    ws = cp.empty(ws_bytes, np.uint8)
    out = []
    i32 = ctypes.c_int32

    def setattr_(fn, obj, attr, value):
        v = i32(value)
        assert fn(obj, attr, ctypes.byref(v), ctypes.sizeof(v)) == 0

    def timed(fn):  # microseconds: gpu_bench's Timer (CUDA events, median, L2 flushed before each call)
        return timer(fn, warmup=1, reps=15) * 1e3

    for m, n, k in SHAPES:
        x = (cp.random.standard_normal((m, k), dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)
        w = (cp.random.standard_normal((n, k), dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)
        c = cp.empty((m, n), np.float32)
        desc, la, lb, lc, pref, res, got, st = lt_setup(lt, handle, m, n, k, ws_bytes, args.algos)
        alpha, beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
        stream = vp(cp.cuda.get_current_stream().ptr)
        times = []
        for r in range(got if st == 0 else 0):
            if res[r].state != 0:
                continue

            def run(r=r):
                s = lt.cublasLtMatmul(handle, desc, ctypes.byref(alpha), vp(w.data.ptr), la, vp(x.data.ptr), lb,
                                      ctypes.byref(beta), vp(c.data.ptr), lc, vp(c.data.ptr), lc,
                                      ctypes.byref(res[r].algo), vp(ws.data.ptr), ctypes.c_size_t(ws_bytes), stream)
                assert s == 0, s

            try:
                times.append(round(timed(run), 2))
            except AssertionError as exc:
                times.append(f"status {exc}")
        default = timed(lambda: gemm_bf16(x, w, c))
        num = [t for t in times if isinstance(t, float)]
        floor = (n * k * 2 + m * k * 2 + m * n * 4) / copy_bw * 1e6
        rec = {"M": m, "N": n, "K": k, "gemmEx_us": round(default, 2), "lt_first_us": num[0] if num else None,
               "lt_best_us": min(num) if num else None, "floor_us": round(floor, 2), "lt_all_us": times,
               "heuristic_status": st}
        out.append(rec)
        print(json.dumps(rec), flush=True)
        lt_free(lt, desc, la, lb, lc, pref)
        del x, w, c
    print(f"\n{'M':>5} {'N':>7} {'K':>6} {'gemmEx':>8} {'Lt 1st':>8} {'Lt best':>8} {'floor':>7} (us)")
    for r in out:
        print(f"{r['M']:5d} {r['N']:7d} {r['K']:6d} {r['gemmEx_us']:8.1f} {r['lt_first_us'] or 0:8.1f} "
              f"{r['lt_best_us'] or 0:8.1f} {r['floor_us']:7.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
