"""proposal_head's eager time against PyTorch's, in parts (H200 probe, issue 12): the 35B head (248320 x
2048) at B1 K7 and B8 K15, timed interleaved (fast, torch, fast, torch, ...) with benchmarks.gpu_bench.Timer
(L2 flushed before each call, median): the Op, the Op on the v5 top-k kernels (TOPK_VEC off), our GEMM
alone (gemm_bf16, FP32 out) and torch's GEMM alone (BF16 out, then .float()), and the Op's host time (the
Python call's wall time with the GPU idle, which eager timing adds where the GPU waits for the host).

    python -m benchmarks.head_probe [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    import cupy as cp
    import torch

    from benchmarks.gpu_bench import Timer, bits
    from kernels_cu import fast
    from kernels_cu.fast_gemm import gemm_bf16

    timer = Timer(cp, torch)
    vr, h = 248320, 2048
    head = torch.randn(vr, h, dtype=torch.bfloat16, device="cuda") * (h**-0.5)
    hb = bits(cp, head)
    be = fast.FastCudaBackend()
    be.prepare(head=hb)
    out = []
    for b, w in [(1, 8), (8, 16)]:
        kd = w - 1
        hid = torch.randn(b, kd, h, dtype=torch.bfloat16, device="cuda")
        hidb = bits(cp, hid)
        kw = {"hidden": hidb, "head": hb, "vocab_size": vr - 192}

        def tor():
            z = (hid.reshape(-1, h) @ head.T).float()
            z[:, vr - 192:] = -math.inf
            return torch.argmax(z, dim=1)

        def v5():
            fast.TOPK_VEC = fast.TOPK_MERGE_WARP = False
            try:
                return be.proposal_head(**kw)
            finally:
                fast.TOPK_VEC = fast.TOPK_MERGE_WARP = True

        fns = {"op": lambda: be.proposal_head(**kw), "torch": tor, "op_v5_topk": v5,
               "gemm": lambda: gemm_bf16(hidb.reshape(b * kd, h), hb),
               "torch_gemm": lambda: (hid.reshape(-1, h) @ head.T).float()}
        times = {k: [] for k in fns}
        for _ in range(args.rounds):
            for k, f in fns.items():
                times[k].append(timer(f))
        cp.cuda.runtime.deviceSynchronize()
        host = []
        for _ in range(20):
            cp.cuda.runtime.deviceSynchronize()
            t0 = time.perf_counter()
            be.proposal_head(**kw)
            host.append((time.perf_counter() - t0) * 1e3)
        cp.cuda.runtime.deviceSynchronize()
        r = {"shape": f"35B B{b} K{kd}", **{k: round(statistics.median(v), 4) for k, v in times.items()},
             "spread": {k: [round(x, 4) for x in v] for k, v in times.items()},
             "op_host_ms": round(statistics.median(host), 4)}
        out.append(r)
        print(json.dumps(r), flush=True)
    print(f"\n{'shape':14s} " + " ".join(f"{k:>11s}" for k in ["op", "torch", "op_v5_topk", "gemm", "torch_gemm",
                                                           "op_host_ms"]))
    for r in out:
        print(f"{r['shape']:14s} " + " ".join(f"{r[k]:11.4f}" for k in ["op", "torch", "op_v5_topk", "gemm",
                                                                   "torch_gemm", "op_host_ms"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
