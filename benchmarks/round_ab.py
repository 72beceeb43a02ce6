"""A/B of the round's graph replay under fast_block settings, in one process (H200, issue 12).

For each geometry (27B DFlash2, 35B DFlash) and shape (B1 W8, B8 W16, F 4096) it builds the round
(FastRound, random weights, as benchmarks.gpu_bench's proposal_round bench), then for each
configuration re-makes the workspace and the captured graph and times the graph replay (gpu_bench's
Timer: L2 flushed, median). Configurations, interleaved over ``--rounds`` passes:
  nosplit  GEMM_SPLITS {}: every GEMM of the block whole
  v7       the defaults (the K-split GEMMs of fast_block.GEMM_SPLITS)
(fb_resid_norm's block size is not switched here: 256 threads at H 5120 would leave its register
path; benchmarks/glue_probe.py and the round trace measure it.) Prints ms per replay, the ratio, the
weight floor at the measured copy bandwidth and at the issue's 4.1 TB/s, and whether the tokens
equal nosplit's.

    python -m benchmarks.round_ab [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics

CONFIGS = {
    "nosplit": {"GEMM_SPLITS": {}},
    "v7": {},
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shapes", default="1x8,8x16")
    ap.add_argument("--geometries", default="dflash2-27b,dflash-35b-a3b")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    import cupy as cp
    import torch

    import kernels_cu.fast_block as fb
    from benchmarks.gpu_bench import Timer, measure_ceilings, round_drafter, round_inputs
    from conformance.geometry import GEOMETRIES, _capacity
    from reference.config import PRESETS

    timer = Timer(cp, torch)
    copy_bw = measure_ceilings(cp, torch, timer)["copy_bandwidth_TBps"] * 1e12
    defaults = {"GEMM_SPLITS": fb.GEMM_SPLITS}
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    report = {"copy_TBps": copy_bw / 1e12, "cases": []}
    for geo in args.geometries.split(","):
        cfg = PRESETS[GEOMETRIES[geo]]
        fr, tw, tr, wbits, extra, weight_bytes = round_drafter(cp, torch, cfg)
        cap = _capacity(cfg, 4096)
        for b, w in shapes:
            kw, _ = round_inputs(cp, torch, cfg, b, w, 4096)
            times = {name: [] for name in CONFIGS}
            tokens = {}
            for _ in range(args.rounds):
                for name, over in CONFIGS.items():
                    for k, v in defaults.items():
                        setattr(fb, k, over.get(k, v))
                    cp.cuda.Device().synchronize()
                    fr._ws.clear()  # a new workspace (the split outputs' shapes) and a new graph
                    ws = fr.workspace(b, w, cap)
                    fr.step(**kw, graph=False)  # copies the rings in
                    kw_ws = dict(kw, context_k=ws.ck, context_v=ws.cv)
                    for _ in range(2):
                        out = fr.step(**kw_ws)
                    tokens.setdefault(name, cp.asnumpy(out["tokens"]))
                    times[name].append(timer(lambda ws=ws: ws.graph.launch()))
            for k, v in defaults.items():
                setattr(fb, k, v)
            rec = {"geometry": geo, "B": b, "W": w, "weight_bytes": weight_bytes,
                   "floor_ms_measured_bw": weight_bytes / copy_bw * 1e3, "floor_ms_4_1": weight_bytes / 4.1e12 * 1e3,
                   "ms": {n: statistics.median(t) for n, t in times.items()}, "all_ms": times,
                   "tokens_equal_nosplit": {n: bool((tokens[n] == tokens["nosplit"]).all()) for n in tokens}}
            report["cases"].append(rec)
            print(json.dumps(rec), flush=True)
        fr.drop()
        fr.resident.clear()
        del fr, tw, tr, wbits, extra
        cp.get_default_memory_pool().free_all_blocks()
        torch.cuda.empty_cache()
    print(f"\n{'round':<24}" + "".join(f"{n:>9}" for n in CONFIGS) + "  v7/nosplit  v7/floor(meas)  v7/floor(4.1)")
    for r in report["cases"]:
        ms = r["ms"]
        label = f"{r['geometry']} B{r['B']} W{r['W']}"
        print(f"{label:<24}" + "".join(f"{ms[n]:9.3f}" for n in CONFIGS)
              + f"  {ms['v7'] / ms['nosplit']:10.3f}  {ms['v7'] / r['floor_ms_measured_bw']:14.2f}"
              f"  {ms['v7'] / r['floor_ms_4_1']:13.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
