"""Where the fast proposal round's time goes: every kernel of FastRound's
CUDA graph replay, from a CUPTI trace (torch.profiler), at both official geometries, plus each of
the round's GEMM shapes timed alone against PyTorch's F.linear and its weight-streaming floor.

    python -m benchmarks.profile_round [--reps 10] [--shapes 1x8,8x16] [--json out.json]

Per (geometry, B, W): the replay's span (first kernel start to last kernel end, median over the
replays), the sum of its kernels' durations (the difference is launch gaps inside the graph), and
the time per kernel class (cuBLAS GEMM, glue, attention, top-k, selector). The trace is taken
without L2 flushes between replays (the weights, 1.7 and 5.9 GB, are about 35-120x the H200's 50 MB
L2, so a replay re-reads them anyway). Needs CuPy and PyTorch on a CUDA GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

from kernels_cu.fast.perf import advances


def kernel_class(name: str) -> str:
    n = name.lower()
    if n.startswith("fb_"):
        return "glue (fast/block.cu)"
    if n.startswith("fast_gemv"):
        return "layer GEMMs (fast/gemv.cu)"
    if n.startswith(("fa_", "flash", "fast_attn")) or "attn" in n:
        return "attention"
    if n.startswith("fast_head"):
        return "fused head (fast/head.cu)"
    if "topk" in n or n.startswith("fs_"):
        return "top-k"
    if "selector" in n or "rowdot" in n:
        return "selector"
    if any(t in n for t in ("gemm", "xmma", "cutlass", "nvjet", "sm90", "sm80", "splitk", "reduce")):
        return "cuBLAS"
    return "other"


def trace_kernels(torch, fn, reps: int) -> list[list[dict]]:
    """The kernels of ``reps`` calls of fn (each followed by a device sync), from a CUPTI trace:
    a list per call of {name, ts, dur} (microseconds), in start order."""
    from torch.profiler import ProfilerActivity, profile

    import cupy as cp

    cp.cuda.Device().synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
            cp.cuda.Device().synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    ks = sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    if not ks or len(ks) % reps:
        raise RuntimeError(f"{len(ks)} kernels traced over {reps} calls (not a multiple)")
    n = len(ks) // reps
    return [[{"name": e["name"], "ts": float(e["ts"]), "dur": float(e["dur"])} for e in ks[i * n:(i + 1) * n]]
            for i in range(reps)]


def summarize(calls: list[list[dict]]) -> dict:
    span = statistics.median(c[-1]["ts"] + c[-1]["dur"] - c[0]["ts"] for c in calls)
    busy = statistics.median(sum(k["dur"] for k in c) for c in calls)
    per_pos = [statistics.median(c[i]["dur"] for c in calls) for i in range(len(calls[0]))]
    adv = [advances(c) for c in calls]
    per_adv = [statistics.median(a[i] for a in adv) for i in range(len(calls[0]))]
    classes: dict[str, list] = {}
    for k, t, a in zip(calls[0], per_pos, per_adv):
        cl = classes.setdefault(kernel_class(k["name"]), [0, 0.0, 0.0])
        cl[0] += 1
        cl[1] += t
        cl[2] += a
    kernels = [{"i": i, "name": k["name"][:90], "class": kernel_class(k["name"]), "us": round(t, 2),
                "advance_us": round(a, 2)} for i, (k, t, a) in enumerate(zip(calls[0], per_pos, per_adv))]
    return {"span_us": round(span, 1), "busy_us": round(busy, 1), "gaps_us": round(span - busy, 1),
            "kernels_per_call": len(per_pos),
            "classes": {c: {"n": n, "us": round(t, 1), "advance_us": round(a, 1)}
                        for c, (n, t, a) in sorted(classes.items(), key=lambda x: -x[1][1])},
            "kernels": kernels}


def gemm_probe(cp, torch, timer, shapes, floor_bw) -> list[dict]:
    """Each (M, N, K) of the round timed alone: our CaptureGemm call, torch F.linear (BF16 out),
    the weight floor."""
    import torch.nn.functional as F

    from benchmarks.gpu_bench import bits
    from kernels_cu.fast.block import CaptureGemm

    cg = CaptureGemm()
    out = []
    for (m, n, k), count in shapes.items():
        x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.01
        xb, wb = bits(cp, x), bits(cp, w)
        o = cp.empty((m, n), dtype=cp.float32)
        floor = (n * k * 2 + m * k * 2 + m * n * 4) / floor_bw * 1e6
        ours = timer(lambda: cg(xb, wb, o)) * 1e3
        tl = timer(lambda: F.linear(x, w)) * 1e3
        out.append({"M": m, "N": n, "K": k, "per_round": count, "ours_us": round(ours, 1), "torch_us": round(tl, 1),
                    "floor_us": round(floor, 1), "ours_TBps": round((n * k * 2) / ours / 1e6, 2)})
        del x, w
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--shapes", default="1x8,8x16")
    ap.add_argument("--geometries", default="dflash2-27b,dflash-35b-a3b")
    ap.add_argument("--no-gemm-probe", action="store_true")
    ap.add_argument("--top", type=int, default=12, help="slowest kernels printed per case")
    ap.add_argument("--sequence", action="store_true", help="print every kernel's duration and advance")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    import cupy as cp
    import torch

    from benchmarks.gpu_bench import Timer, measure_ceilings, round_drafter, round_inputs
    from conformance.geometry import GEOMETRIES, _capacity
    from reference.config import PRESETS

    timer = Timer(cp, torch)
    floor_bw = measure_ceilings(cp, torch, timer)["copy_bandwidth_TBps"] * 1e12
    report = {"copy_TBps": floor_bw / 1e12, "cases": []}
    for geo in args.geometries.split(","):
        cfg = PRESETS[GEOMETRIES[geo]]
        fr, tw, tr, wbits, extra, weight_bytes = round_drafter(cp, torch, cfg)
        gemms: dict = {}
        for spec in args.shapes.split(","):
            b, w = (int(v) for v in spec.split("x"))
            kw, keep = round_inputs(cp, torch, cfg, b, w, 4096)
            ws = fr.workspace(b, w, _capacity(cfg, 4096))
            fr.step(**kw, graph=False)
            kw_ws = dict(kw, context_k=ws.ck, context_v=ws.cv)
            eng = fr._round_eng
            inner = eng.gemm
            log = []

            def logged(x, wt, o, inner=inner, log=log):
                log.append((int(x.shape[0]), int(wt.shape[0]), int(x.shape[1])))
                return inner(x, wt, o)

            eng.gemm = logged
            try:
                fr.step(**kw_ws, graph=False)
            finally:
                del eng.gemm
            for s in log:
                gemms[s] = gemms.get(s, 0) + 1
            for _ in range(3):
                fr.step(**kw_ws)
            assert fr.last_path == "graph", fr.last_path
            graph_ms = timer(lambda: ws.graph.launch())
            calls = trace_kernels(torch, lambda: ws.graph.launch(), args.reps)
            summ = summarize(calls)
            lg = ws.logits  # the head's logits of the last replay: what the top-k kernels were given (None: fused head)
            if lg is None:
                logit_stats = {"fused_head": True}
            else:
                fin = cp.isfinite(lg)
                row0 = lg[0][fin[0]]
                logit_stats = {"finite": float(fin.mean()), "nan": float(cp.isnan(lg).mean()),
                               "row0_std": float(row0.std()) if row0.size else None,
                               "row0_distinct": int(cp.unique(row0).size)}
            case = {"geometry": geo, "B": b, "W": w, "graph_ms_flushed": round(graph_ms, 4),
                    "weight_floor_ms": round(weight_bytes / floor_bw * 1e3, 4), "gemms": log,
                    "logits": logit_stats, **summ}
            report["cases"].append(case)
            print(f"\n== {geo} B{b} W{w}: graph {graph_ms:.3f} ms (L2 flushed), trace span {summ['span_us']:.0f} us, "
                  f"kernels busy {summ['busy_us']:.0f} us, gaps {summ['gaps_us']:.0f} us over "
                  f"{summ['kernels_per_call']} kernels; weight floor {case['weight_floor_ms'] * 1e3:.0f} us", flush=True)
            print(f"   logits: {logit_stats}")
            for c, v in summ["classes"].items():
                print(f"   {c:24s} {v['n']:4d} kernels {v['us']:8.1f} us, advancing the end by {v['advance_us']:7.1f} us")
            if args.sequence:  # every kernel in start order: duration and advance of the completion frontier
                for k in summ["kernels"]:
                    print(f"   {k['i']:3d} {k['us']:8.2f} {k['advance_us']:8.2f}  {k['class']:12s} {k['name'][:60]}")
            for k in sorted(summ["kernels"], key=lambda k: -k["us"])[:args.top]:
                print(f"   #{k['i']:3d} {k['us']:8.1f} us  {k['class']:12s} {k['name']}")
            del keep, kw, kw_ws
        if not args.no_gemm_probe:
            report.setdefault("gemm_probe", {})[geo] = probe = gemm_probe(cp, torch, timer, gemms, floor_bw)
            print(f"\n== {geo} GEMMs alone (L2 flushed, median): M N K per-round ours torch floor (us), ours TB/s")
            for r in probe:
                print(f"   {r['M']:5d} {r['N']:6d} {r['K']:6d} x{r['per_round']:<3d} {r['ours_us']:8.1f} {r['torch_us']:8.1f} "
                      f"{r['floor_us']:8.1f}  {r['ours_TBps']:.2f}")
        fr.drop()
        fr.resident.clear()
        del fr, tw, tr, wbits, extra
        cp.get_default_memory_pool().free_all_blocks()
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
