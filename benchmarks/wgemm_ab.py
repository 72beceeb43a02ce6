"""The block's layer GEMMs at B8 W16 (128 rows) and between: kernels_cu/fast_wgemm.cu against the cuBLAS path the
block takes today (H200 probe, issue 12, session v16).

Each configuration is captured as one CUDA graph of ``--calls`` back-to-back GEMMs that cycle over enough weight
copies (> 128 MB) that no call finds its weight in L2, and replayed (benchmarks/graph_timer.py: CUDA events, median).
Per (M, N, K):
  cublas      what the block runs without this kernel: cublasGemmEx, or the K-split strided-batched GEMM where
              fast_block.GEMM_SPLITS splits the shape (its partials then added by the consumer, not timed here);
  wgemm       fast_wgemm.gemm_into (PDL on: back to back, each call's first weight stages load under the call ahead);
  wgemm_nopdl the same launched the ordinary way;
  wgemm_sS    STAGES S (``--stages``);
  wgemm_gG    a grid of G blocks (``--blocks``): with the x rows per stage (``--rows``, ``--min-rows``) it tells a
              limit a multiprocessor (the rate falls with the blocks) from one of the whole chip.
Also the largest |difference| to cuBLAS relative to max |cuBLAS| (both FP32 accumulation of the same products: a
few ulps). The floor is the weight, activation and output bytes at the copy bandwidth measured in the run.

    python -m benchmarks.wgemm_ab [--rows 128] [--stages 4,6] [--json out.json]
"""

from __future__ import annotations

import argparse
import json

from benchmarks import graph_timer

SHAPES = [  # (N, K): 35B q/k/v, o, gate/up, down; 27B q/k/v, o, gate/up, down, conv delta
    (6144, 2048), (2048, 4096), (12288, 2048), (2048, 6144),
    (6144, 5120), (5120, 4096), (34816, 5120), (5120, 17408), (1280, 5120),
]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="128", help="comma-separated M")
    ap.add_argument("--stages", default="", help="extra STAGES values to time, comma-separated")
    ap.add_argument("--shapes", default="", help="only these N x K, comma-separated (e.g. 34816x5120); default all")
    ap.add_argument("--min-rows", type=int, default=None, help="fast_wgemm.MIN_ROWS for this run (rows below 17)")
    ap.add_argument("--blocks", default="", help="also time fast_wgemm at these grids, comma-separated (at most one a "
                                                 "multiprocessor): how the weight rate scales with the blocks streaming")
    ap.add_argument("--calls", type=int, default=16)
    ap.add_argument("--replays", type=int, default=9)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    import cupy as cp
    import numpy as np
    import torch

    from benchmarks.gpu_bench import Timer, measure_ceilings
    from kernels_cu import fast_wgemm
    from kernels_cu.fast_block import CaptureGemm, split_k
    from kernels_cu.fast_gemm import gemm_bf16

    gemm_bf16(cp.zeros((2, 8), np.uint16), cp.zeros((2, 8), np.uint16))  # loads libcublas
    copy_bw = measure_ceilings(cp, torch, Timer(cp, torch))["copy_bandwidth_TBps"] * 1e12
    cap = CaptureGemm()
    stream = cp.cuda.Stream(non_blocking=True)
    extra = [int(s) for s in args.stages.split(",") if s]
    grids = [int(b) for b in args.blocks.split(",") if b]
    only = {tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s}
    if args.min_rows is not None:
        fast_wgemm.MIN_ROWS = args.min_rows

    def us(launch, n_w):
        return round(graph_timer.graph_us(cp, stream, launch, calls=args.calls, replays=args.replays, sets=n_w,
                                          warm=n_w), 2)

    def probe(m, n, k):
        n_w = max(2, min(16, -(-(128 << 20) // (n * k * 2))))
        x = (cp.random.standard_normal((m, k), dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)
        ws = [(cp.random.standard_normal((n, k), dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)
              for _ in range(n_w)]
        s = split_k(m, n, k)
        c = cp.empty((s, m, n) if s > 1 else (m, n), np.float32)
        o = cp.empty((m, n), np.float32)
        rec = {"M": m, "N": n, "K": k, "weights": n_w, "cublas_split": s,
               "floor_us": round((n * k * 2 + m * k * 2 + m * n * 4) / copy_bw * 1e6, 2)}

        def ours(j, blocks=None):
            fast_wgemm.gemm_into(x, ws[j], o, blocks=blocks)

        with stream:
            rec["cublas_us"] = us(lambda j: cap(x, ws[j], c), n_w)
            if not fast_wgemm.takes(m, n, k):
                return rec
            rec["wgemm_us"] = us(ours, n_w)
            fast_wgemm.PDL = False
            rec["wgemm_nopdl_us"] = us(ours, n_w)
            fast_wgemm.PDL = True
            default = fast_wgemm.STAGES
            for st in extra:
                fast_wgemm.STAGES = st
                rec[f"wgemm_s{st}_us"] = us(ours, n_w)
            fast_wgemm.STAGES = default
            for g in grids:
                rec[f"wgemm_g{g}_us"] = us(lambda j, g=g: ours(j, g), n_w)
            rec["weight_TBps"] = round(n * k * 2 / (rec["wgemm_us"] * 1e-6) / 1e12, 3)
            ours(0)
            ref = gemm_bf16(x, ws[0])
            stream.synchronize()
            rec["rel_diff"] = float(cp.abs(o - ref).max() / (cp.abs(ref).max() + 1e-30))
        return rec

    out = []
    for m in (int(r) for r in args.rows.split(",")):
        for n, k in [sh for sh in SHAPES if not only or sh in only]:
            out.append(probe(m, n, k))
            print(json.dumps(out[-1]), flush=True)
            cp.get_default_memory_pool().free_all_blocks()
    cols = ["cublas_us", "wgemm_us", "wgemm_nopdl_us", *[f"wgemm_s{st}_us" for st in extra],
            *[f"wgemm_g{g}_us" for g in grids]]
    print(f"\n{'M':>4} {'N':>6} {'K':>6} {'floor':>6} " + " ".join(f"{c[:-3]:>12}" for c in cols)
          + "  (us per call, graph of back-to-back calls)")
    for r in out:
        print(f"{r['M']:4d} {r['N']:6d} {r['K']:6d} {r['floor_us']:6.1f} "
              + " ".join(f"{r.get(c, float('nan')):12.1f}" for c in cols))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
