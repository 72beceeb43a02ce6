"""Would a K split (a strided-batched GEMM whose S partial products the consumer sums) or a
cuBLASLt algorithm chosen per shape beat cublasGemmEx's default at the round's GEMMs, timed the way
the round runs them? (H200 probe, issue 12.)

Each configuration is captured as one CUDA graph of ``--calls`` back-to-back GEMMs that cycle over
enough weight copies (> 128 MB) that no call finds its weight in L2, and replayed; the time per call
is the replay time over the calls (CUDA events, median of the replays). Per (M, N, K):
  gemmEx        what kernels_cu.fast_gemm.gemm_bf16 / CaptureGemm launch today;
  split S       cublasGemmStridedBatchedEx over S K-slices (x and w offset by K / S along the row,
                leading dimension K), S fp32 partial outputs [S, M, N], no reduction kernel (the
                consumer would add the S partials in slice order);
  Lt best       the fastest of up to ``--algos`` cublasLtMatmulAlgoGetHeuristic algorithms.
The floor is the weight, activation and output bytes at the copy bandwidth measured in the run.

    python -m benchmarks.splitk_probe [--json out.json]
"""

from __future__ import annotations

import argparse
import ctypes
import json

from benchmarks import graph_timer
from benchmarks.lt_probe import lt_free, lt_setup
from kernels_cu.fast_gemm import loaded_library
from kernels_cu.fast_lt import lt_library as _lt_lib

SHAPES = [
    # 27B DFlash2: conv delta (2M rows), q/k/v, o, gate/up, down; B8 W16 then B1 W8
    (256, 1280, 5120), (128, 6144, 5120), (128, 5120, 4096), (128, 34816, 5120), (128, 5120, 17408),
    (16, 1280, 5120), (8, 6144, 5120), (8, 5120, 4096), (8, 34816, 5120), (8, 5120, 17408),
    # 35B DFlash: B1 W8 then B8 W16
    (8, 6144, 2048), (8, 2048, 4096), (8, 12288, 2048), (8, 2048, 6144),
    (128, 6144, 2048), (128, 2048, 4096), (128, 12288, 2048), (128, 2048, 6144),
    # heads
    (7, 248320, 5120), (120, 248320, 5120), (7, 248320, 2048), (120, 248320, 2048),
]
SPLITS = (2, 4, 8)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--algos", type=int, default=16)
    ap.add_argument("--calls", type=int, default=16)
    ap.add_argument("--replays", type=int, default=9)
    args = ap.parse_args(argv)
    import cupy as cp
    import numpy as np
    import torch

    from benchmarks.gpu_bench import Timer, measure_ceilings
    from kernels_cu.fast_block import CaptureGemm
    from kernels_cu.fast_gemm import gemm_bf16

    gemm_bf16(cp.zeros((2, 8), np.uint16), cp.zeros((2, 8), np.uint16))  # loads libcublas (and Lt)
    copy_bw = measure_ceilings(cp, torch, Timer(cp, torch))["copy_bandwidth_TBps"] * 1e12
    cap = CaptureGemm()
    blas = loaded_library("libcublas")
    vp, i32 = ctypes.c_void_p, ctypes.c_int
    sb = blas.cublasGemmStridedBatchedEx
    sb.argtypes = [vp, i32, i32, i32, i32, i32, vp, vp, i32, i32, ctypes.c_int64, vp, i32, i32, ctypes.c_int64,
                   vp, vp, i32, i32, ctypes.c_int64, i32, i32, i32]
    sb.restype = i32
    lt = _lt_lib()
    lth = vp()
    assert lt.cublasLtCreate(ctypes.byref(lth)) == 0
    ws_bytes = 32 << 20
    ws = cp.empty(ws_bytes, np.uint8)
    one, zero = np.ones(1, np.float32), np.zeros(1, np.float32)
    stream = cp.cuda.Stream(non_blocking=True)

    def graph_us(launch, n_w):
        """Per-call microseconds of args.calls launches cycling over the n_w weight copies."""
        return round(graph_timer.graph_us(cp, stream, launch, calls=args.calls, replays=args.replays, sets=n_w,
                                          warm=2), 2)

    def probe(m, n, k):
        n_w = max(2, min(16, -(-(128 << 20) // (n * k * 2))))
        x = (cp.random.standard_normal((m, k), dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)
        ws_list = [(cp.random.standard_normal((n, k), dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)
                   for _ in range(n_w)]
        c = cp.empty((max(SPLITS), m, n), np.float32)
        ref = gemm_bf16(x, ws_list[0])
        rec = {"M": m, "N": n, "K": k, "weights": n_w,
               "floor_us": round((n * k * 2 + m * k * 2 + m * n * 4) / copy_bw * 1e6, 2)}
        with stream:
            rec["gemmEx_us"] = graph_us(lambda j: cap(x, ws_list[j], c[0]), n_w)
        for s in SPLITS:
            if k % (8 * s) or n * k * 2 > (256 << 20):  # 16-byte aligned slices; heads: not split
                continue
            kk = k // s

            def split(j, s=s, kk=kk):
                handle = cp.cuda.device.get_cublas_handle()
                cap._set_stream(handle, stream.ptr)
                cap._set_workspace(handle, cap.workspace.data.ptr, cap.WORKSPACE_BYTES)
                st = sb(handle, 1, 0, n, m, kk, one.ctypes.data, ws_list[j].data.ptr, 14, k, kk, x.data.ptr, 14, k,
                        kk, zero.ctypes.data, c.data.ptr, 0, n, m * n, s, 68, -1)
                assert st == 0, st

            rec[f"split{s}_us"] = graph_us(split, n_w)
            err = float(cp.abs(c[:s].sum(axis=0) - ref).max() / (cp.abs(ref).max() + 1e-30))
            rec[f"split{s}_relerr"] = err
        # cuBLASLt heuristic algorithms, each in its own graph
        desc, la, lb, lc, pref, res, got, st = lt_setup(lt, lth, m, n, k, ws_bytes, args.algos)
        alpha, beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
        lt_times = []
        for r in range(got if st == 0 else 0):
            if res[r].state != 0:
                continue

            def run(j, r=r):
                s_ = lt.cublasLtMatmul(lth, desc, ctypes.byref(alpha), vp(ws_list[j].data.ptr), la, vp(x.data.ptr),
                                       lb, ctypes.byref(beta), vp(c.data.ptr), lc, vp(c.data.ptr), lc,
                                       ctypes.byref(res[r].algo), vp(ws.data.ptr), ctypes.c_size_t(ws_bytes),
                                       vp(stream.ptr))
                assert s_ == 0, s_

            try:
                lt_times.append(graph_us(run, n_w))
            except Exception as exc:  # noqa: BLE001 - an algorithm that does not capture: recorded
                lt_times.append(f"{type(exc).__name__}: {exc}"[:80])
        num = [t for t in lt_times if isinstance(t, float)]
        rec["lt_all_us"] = lt_times
        rec["lt_best_us"] = min(num) if num else None
        rec["lt_best_index"] = lt_times.index(min(num)) if num else None
        lt_free(lt, desc, la, lb, lc, pref)
        return rec

    out = []
    for m, n, k in SHAPES:
        out.append(probe(m, n, k))
        print(json.dumps(out[-1]), flush=True)
        cp.get_default_memory_pool().free_all_blocks()
    print(f"\n{'M':>4} {'N':>6} {'K':>6} {'floor':>6} {'gemmEx':>7} " + " ".join(f"{'S' + str(s):>6}" for s in SPLITS)
          + f" {'Lt':>6}  (us per call, graph)")
    for r in out:
        sp = " ".join(f"{r.get(f'split{s}_us', float('nan')):6.1f}" for s in SPLITS)
        print(f"{r['M']:4d} {r['N']:6d} {r['K']:6d} {r['floor_us']:6.1f} {r['gemmEx_us']:7.1f} {sp} "
              f"{r['lt_best_us'] or float('nan'):6.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
