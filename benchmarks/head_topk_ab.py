"""A/B of candidate_topk / proposal_head with and without the fused head (kernels_cu/fast_head.py: the head GEMM
with the top-k in its epilogue) in one process (H200, issue 12: "candidate_topk time independent of B x K").

For each head geometry and row count the Op is timed both ways on the same inputs (gpu_bench's Timer: CUDA
events, L2 flushed before each call, median), the fused kernel alone (without the merge) too, and the two
ways' ids compared where the float64-free check allows: the fraction of ids equal (they differ only where two
logits are within the two GEMMs' rounding of each other).

    python -m benchmarks.head_topk_ab [--rows 7,120] [--json out.json]

Columns: ms of the cuBLAS path (fast_head.ENABLED off: gemmEx or the tuned cuBLASLt GEMM + split top-k), of the Op
with it on (routed by fast_head.MAX_ROWS: above an Op's limit this is the cuBLAS path again), and of the fused
kernel alone at every row count (without the merge); growth = time at the largest row count over time at the
smallest, per column; GEMM = the head GEMM alone (gemmEx into FP32 logits, no top-k: the rows' tensor work that
any one-pass implementation pays); other kernel = the kernel fast_head.PINGPONG does not pick, alone (single_ms: the
single-tile fast_head_topk while the ping-pong kernel is the default); floor = the head's bytes at 4.1 TB/s.
"""

from __future__ import annotations

import argparse
import json
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="7,15,56,120")
    ap.add_argument("--reps", type=int, default=25)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    import cupy as cp
    import numpy as np
    import torch

    from benchmarks.gpu_bench import Timer, bits
    from kernels_cu import fast_head
    from kernels_cu.fast import FastCudaBackend
    from kernels_cu.fast_gemm import gemm_bf16

    timer = Timer(cp, torch)
    fast = FastCudaBackend()
    rows_list = [int(r) for r in args.rows.split(",")]
    out = []
    for name, vr, h, op, k in [("27B candidate_topk", 248320, 5120, "candidate_topk", 16),
                               ("35B proposal_head", 248320, 2048, "proposal_head", 1)]:
        head = torch.randn(vr, h, dtype=torch.bfloat16, device="cuda") * (h**-0.5)
        hb = bits(cp, head)
        fast.prepare(head=hb)
        for m in rows_list:
            hid = bits(cp, torch.randn(m, h, dtype=torch.bfloat16, device="cuda"))
            if op == "candidate_topk":
                def call(hid=hid, hb=hb, vr=vr, k=k):
                    return fast.candidate_topk(hidden=hid, head=hb, vocab_size=vr - 192, top_k=k)["ids"]
            else:
                def call(hid=hid, hb=hb, vr=vr):
                    return fast.proposal_head(hidden=hid, head=hb, vocab_size=vr)["tokens"]
            res = {"op": name, "rows": m, "k": k, "floor_ms": vr * h * 2 / 4.1e12 * 1e3}
            got = {}
            for enabled in (False, True, False, True):  # interleaved: a drift hits both
                fast_head.ENABLED = enabled
                t = timer(call, reps=args.reps)
                key = "fused_ms" if enabled else "cublas_ms"
                res[key] = min(res.get(key, float("inf")), t)
                got[enabled] = cp.asnumpy(call())
            fast_head.ENABLED = True
            partial = cp.empty((m, fast_head.grid(vr), k), dtype=np.uint64)
            pp0 = fast_head.PINGPONG
            for pp in (pp0, not pp0):  # the kernel the Ops launch, then the other one
                fast_head.PINGPONG = pp
                res["kernel_ms" if pp == pp0 else ("single_ms" if pp0 else "pingpong_ms")] = timer(
                    lambda hid=hid, hb=hb, vr=vr, k=k, partial=partial:
                    fast_head.topk_partial_into(hid, hb, vr, k, partial), reps=args.reps)
            fast_head.PINGPONG = pp0
            # the head GEMM alone (gemmEx, FP32 logits, no top-k): what any one-pass implementation pays for the
            # rows' tensor work, to read the fused kernel's growth against
            logits = cp.empty((m, vr), dtype=np.float32)
            res["gemm_ms"] = timer(lambda hid=hid, hb=hb, logits=logits: gemm_bf16(hid, hb, logits), reps=args.reps)
            del logits
            res["ids_equal_frac"] = float((got[True] == got[False]).mean())
            out.append(res)
            print(json.dumps(res), flush=True)
        del head
    for name in dict.fromkeys(r["op"] for r in out):
        rs = [r for r in out if r["op"] == name]
        lo, hi = rs[0], rs[-1]
        print(f"\n{name}: rows {lo['rows']} -> {hi['rows']}, floor {lo['floor_ms']:.3f} ms")
        other = "single_ms" if "single_ms" in lo else "pingpong_ms"
        print(f"{'rows':>5} {'cublas ms':>10} {'fused ms':>9} {'kernel ms':>10} {other[:-3]:>9} {'GEMM ms':>8} "
              f"{'ids equal':>9}")
        for r in rs:
            print(f"{r['rows']:>5} {r['cublas_ms']:>10.3f} {r['fused_ms']:>9.3f} {r['kernel_ms']:>10.3f} "
                  f"{r[other]:>9.3f} {r['gemm_ms']:>8.3f} {r['ids_equal_frac']:>9.4f}")
        print(f"growth: cublas {hi['cublas_ms'] / lo['cublas_ms']:.3f}x, fused {hi['fused_ms'] / lo['fused_ms']:.3f}x, "
              f"the GEMM alone {hi['gemm_ms'] / lo['gemm_ms']:.3f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": out, "compile_options": fast_head.compile_options()[:-1]}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
