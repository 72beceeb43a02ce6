"""The DFlash2 selector's kernels before (select.cu bf16_rowdot, selector_walk: the exact mode's) and
after (fast_selector.cu) at the 27B DFlash2 shapes (H 5120, R 256, k 16), in one process:

    python -m benchmarks.bench_fast_selector [--reps 25] [--json out.json]

rowdot at M = 7 (B1 K7) and 120 (B8 K15) rows; the walk at B1 K7 and B8 K15, all rows greedy (T 0)
and all sampled (T 1). Kernel durations come from a CUPTI trace (torch.profiler; the GPU's own
timestamps, so no launch overhead), median over the reps, "warm" (inputs just used, in L2) and
"cold" (a 256 MiB fill before each kernel evicts L2, as the round's 2.5 GB head GEMM does before
the selector). Also CUDA-event times of a CUDA graph of 20 back-to-back launches (per launch, median
of the reps). Each row also says whether the fast outputs equal the exact ones bit for bit.
Needs CuPy and PyTorch on a CUDA GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import numpy as np

from benchmarks.graph_timer import graph_us

H, R, TOPK, V = 5120, 256, 16, 248320


def _bits(rng, shape, scale, xp=np):
    """BF16 bits of N(0, scale^2) (RNE); with xp = cupy, drawn on the device (the big tables)."""
    src = rng.standard_normal(shape, dtype=np.float32) if xp is np else xp.random.standard_normal(shape, np.float32)
    u = (src * np.float32(scale)).view(np.uint32)
    return ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)


def _graph_us(cp, fn, reps, n=20):
    """Median microseconds per call of fn captured n times in one graph (benchmarks/graph_timer.py)."""
    return graph_us(cp, cp.cuda.Stream(non_blocking=True), lambda _j: fn(), calls=n, replays=reps)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=25)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    import cupy as cp
    import torch

    from benchmarks.profile_round import trace_kernels
    from kernels_cu import fast_round as fr
    from kernels_cu import fast_selector as fs
    from kernels_cu.ops_select import _rowdot

    rng = np.random.default_rng(0)
    flush = cp.empty(256 << 20, dtype=np.uint8)
    w_hidden = cp.asarray(_bits(rng, (R, H), 0.02))
    cp.random.seed(0)
    w_pred = _bits(rng, (V, R), 0.5, cp)
    w_succ = _bits(rng, (V, R), 0.5, cp)
    rows = []

    def run(label, exact_fn, fast_fns, check):
        """fast_fns: {kernel label: launch}; check(label) -> outputs equal the exact ones."""
        rec = {"case": label}
        fns = [exact_fn, *fast_fns.values()]
        labels = ["exact", *fast_fns]
        for mode in ("warm", "cold"):
            def call(mode=mode):
                for f in fns:
                    if mode == "cold":
                        flush.fill(1)
                    f()

            try:
                calls = trace_kernels(torch, call, args.reps)
                names = [k["name"] for k in calls[0]]
                pos = [i for i, n in enumerate(names) if n.startswith(("bf16_rowdot", "selector_walk", "fast_"))]
                if len(pos) != len(fns):
                    raise RuntimeError(f"kernels {names}")
                for lab, i in zip(labels, pos):
                    rec[f"{mode}_{lab}_us"] = round(statistics.median(c[i]["dur"] for c in calls), 2)
                rec["kernels"] = [names[i] for i in pos]
            except Exception as exc:  # noqa: BLE001 - keep the other numbers
                rec[f"{mode}_error"] = f"{type(exc).__name__}: {exc}"
        try:
            rec["graph20_exact_us"] = round(_graph_us(cp, exact_fn, args.reps), 2)
            first = next(iter(fast_fns))
            rec[f"graph20_{first}_us"] = round(_graph_us(cp, fast_fns[first], args.reps), 2)
        except Exception as exc:  # noqa: BLE001
            rec["graph_error"] = f"{type(exc).__name__}: {exc}"
        rec["bitwise_equal"] = {lab: bool(check(lab)) for lab in fast_fns}
        print(json.dumps(rec), flush=True)
        rows.append(rec)

    for M in (7, 120):
        x = cp.asarray(_bits(rng, (M, H), 1.0))
        g_exact = cp.empty((M, R), dtype=np.uint16)
        default = fs.rowdot_plan(M, R, H, x.data.ptr, w_hidden.data.ptr)[0]
        kernels = [default] + sorted(n for n in fs.ROWDOT_KERNELS if n.endswith("_v") and n != default)
        g_fast = {n: cp.empty((M, R), dtype=np.uint16) for n in kernels}
        run(f"rowdot M{M} H{H} R{R}", lambda x=x, o=g_exact: _rowdot(x, w_hidden, bits_out=True, out=o),
            {n: (lambda x=x, o=g_fast[n], n=n: fs.rowdot_into(x, w_hidden, o, kernel=n)) for n in kernels},
            lambda n, g_fast=g_fast, b=g_exact: bool((g_fast[n] == b).all()))

    for B, K in ((1, 7), (8, 15)):
        M = B * K
        x = cp.asarray(_bits(rng, (M, H), 1.0))
        g = cp.empty((M, R), dtype=np.uint16)
        fs.rowdot_into(x, w_hidden, g)
        g = g.reshape(B, K, R)
        scores = cp.asarray(-np.sort(-rng.standard_normal((B, K, TOPK)) * 2.0, axis=-1).astype(np.float32))
        ids = cp.asarray(np.stack([rng.choice(V, TOPK, replace=False) for _ in range(M)]).reshape(B, K, TOPK)
                         .astype(np.int32))
        anchor = cp.asarray(rng.integers(0, V, B).astype(np.int32))
        seed = cp.asarray(rng.integers(0, 2**63, B, dtype=np.uint64))
        frontier = cp.asarray(rng.integers(0, 2**20, B).astype(np.int64))
        walks = sorted(fs.WALK_KERNELS)
        for T in (0.0, 1.0):
            temp = cp.full(B, T, dtype=np.float32)
            outs = {e: (cp.empty((B, K), np.int32), cp.empty((B, K), np.int32), cp.empty((B, K, TOPK), np.float32))
                    for e in ["exact", *walks]}
            common = (g, scores, ids, anchor, w_pred, w_succ, temp, seed, frontier)

            def check(lab, outs=outs):
                return all(bool((a.view(np.uint32) == b.view(np.uint32)).all())
                           for a, b in zip(outs["exact"], outs[lab]))

            run(f"walk B{B} K{K} k{TOPK} R{R} T{T}",
                lambda common=common, o=outs["exact"]: fr.selector_walk_into(*common, *o, exact=True),
                {n: (lambda common=common, o=outs[n], n=n: fs.walk_into(*common, *o, kernel=n)) for n in walks},
                check)

    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
