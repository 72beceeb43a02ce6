"""A/B of the round's graph replay under kernel settings, in one process (H200, issue 12).

For each geometry (27B DFlash2, 35B DFlash) and shape (B1 W8, B8 W16, F 4096) it builds the round
(FastRound, random weights, as benchmarks.gpu_bench's proposal_round bench), then for each
configuration re-makes the workspace and the captured graph and times the graph replay (gpu_bench's
Timer: L2 flushed, median). Configurations (``--configs``, the first is the baseline), interleaved
over ``--rounds`` passes, each a set of module attributes:
  nosplit     fast_block.GEMM_SPLITS {}: every GEMM of the block whole
  v7          fast_block's defaults (the K-split GEMMs of GEMM_SPLITS)
  rowdot_k4   the selector's g on mma.m8n8k4.f64 (fast_rowdot_s_v / fast_rowdot_m_v)
  rowdot_k16  above 16 rows the selector's g on mma.m16n8k16.f64 (fast_rowdot_s_v / fast_rowdot_m16_v;
              the session v8 A/B, docs/reports/h200-round-ab-rowdot-v8.json, had s16_v for 7 rows)
  tiles2, tiles1  the attention's key splits with at least 2 / 1 context tiles each (fast_attention
              MIN_TILES_PER_SPLIT, default 4: the bound that sets the split count at B1)
  nopdl       every kernel launched the ordinary way (kernels_cu.pdl.ENABLED False; default: the glue
              and attention kernels under programmatic dependent launch, kernels_cu/pdl.py)
  no_launch_order  the graph's PDL edges as captured (pdl.LAUNCH_ORDER False; default: relaxed to launch order)
  nopdl_glue  PDL for the attention only, the glue kernels launched the ordinary way (fast_block.PDL_GLUE)
  stages2, stages3, stages4  the attention's K/V stages forced (fast_attention.STAGES; default 2)
  alias2, alias3, alias4  the same with the attention's q rows and P scratch inside the stages
              (fast_attention.ALIAS: 3 stages then keep two blocks a multiprocessor at D 128)
  cublas_layers  the layer GEMMs at <= 16 rows on cuBLAS (fast_gemv.GEMV False; default: kernels_cu/fast_gemv.cu)
  gemv_nostage   fast_gemv without weight rows staged before the wait (fast_gemv.STAGE_BYTES 0)
  gemv_waves1    fast_gemv only for grids of one wave (fast_gemv.MAX_WAVES 1; default 2: the 35B gate/up
                 projection, 1.9 waves, on fast_gemv)
  gemv_m8        fast_gemv only up to 8 rows (fast_gemv.MAX_M 8: the DFlash2 conv delta's 16 rows on cuBLAS)
  gemv_nopdl     fast_gemv launched the ordinary way (fast_gemv.PDL False; its staging then overlaps nothing)
  gemv_stage128, gemv_stage64  fast_gemv staging at most 128 / 64 KiB a block (fast_gemv.STAGE_BYTES; default 192:
                 the whole K of every 35B layer GEMM; less lets a block share a multiprocessor with the kernel ahead's)
  gemv_noact     the MLP's [gate; up] GEMM on the plain fast_gemv kernel, then fb_silu_mul (fast_gemv.ACT False;
                 default: one kernel, the SiLU-mul in its epilogue)
  early_table_all  fb_qkv_post's RoPE table before its wait at every row count (fast_block.EARLY_TABLE_MAX_ROWS;
                 default 16)
  rn_block    fb_resid_norm one CTA a row at every row count (fast_block.RESID_NORM_PATH "block"; default: the
              cluster kernel up to 32 rows)
  default     the defaults
  head_gemmex the head GEMM on cublasGemmEx's default (fast_round.HEAD_LT False; default: a cuBLASLt
              algorithm where the first step timed one faster, kernels_cu/fast_lt.py)
  head_memset  the fused head's shared thresholds zeroed by a memset before each launch, v18's way (fast_head.
              CLEAN False, which brings the memset; default: the kernel's last block zeroes them at its end)
  head_unfused  the head GEMM and the split top-k (fast_head.ENABLED False; default: the fused head,
              kernels_cu/fast_head.py, where it applies)
  head_warp_rows  the fused head with v14's selection, a warp a hidden row (fast_head.SELECT_DEFINES)
  head_lanes_all  the fused head's lane form at every row count (fast_head.WARP_FORM_MAX_ROWS 0; default: v14's warp
              form up to 8 rows)
  wgemm       the layer GEMMs at 17..128 rows on kernels_cu/fast_wgemm.cu (fast_wgemm.ENABLED True; default: cuBLAS,
              session v16 measured the kernel slower)
  wgemm_nopdl the same, launched the ordinary way (fast_wgemm.PDL False)
  attn_mma    the attention on the mma.sync kernel at every shape (fast_attention.WGMMA False; default: the wgmma
              form where it takes the shape, 64 query rows at D 128 on sm_90)
  attn_wg_s3  the wgmma form with 3 K/V stages (fast_attention.STAGES 3; default 2)
  combine_two_pass  the attention's combine kernel in two passes (m, then (m, l) and o) at every split count
              (fast_attention.COMBINE_ONE_PASS False; default: one pass where one batch holds every split)
  split_od4   the 35B o and down GEMMs split over K in 4, sessions v7-v20's (fast_block.GEMM_SPLITS; default 2 since
              v21, whose A/B also ran o or down alone in 2: tree c59863a's split_o2 / split_d2)
  probe_no_qkv_post, probe_no_silu_mul, probe_no_post_norm  TIMING PROBES, WRONG RESULTS: the block without
              that glue kernel (fast_block.PROBE_SKIP), what a fusion removing it could save at most
(fb_resid_norm's block size is not switched here: 256 threads at H 5120 would leave its register
path; benchmarks/glue_probe.py and the round trace measure it.) Prints ms per replay, each
configuration against the first, the last one against the floors (weights + rings, and weights only,
at the measured copy bandwidth and at the issue's 4.1 TB/s), and whether the tokens equal the
first configuration's.

    python -m benchmarks.round_ab [--rounds 3] [--configs nosplit,v7] [--json out.json]
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics

CONFIGS = {
    "nosplit": {"kernels_cu.fast_block.GEMM_SPLITS": {}},
    "v7": {},
    "rowdot_k4": {"kernels_cu.fast_selector.ROWDOT_SMALL": "fast_rowdot_s_v",
                  "kernels_cu.fast_selector.ROWDOT_LARGE": "fast_rowdot_m_v"},
    "rowdot_k16": {"kernels_cu.fast_selector.ROWDOT_SMALL": "fast_rowdot_s_v",
                   "kernels_cu.fast_selector.ROWDOT_LARGE": "fast_rowdot_m16_v"},
    "tiles2": {"kernels_cu.fast_attention.MIN_TILES_PER_SPLIT": 2},
    "tiles1": {"kernels_cu.fast_attention.MIN_TILES_PER_SPLIT": 1},
    "head_gemmex": {"kernels_cu.fast_round.HEAD_LT": False},
    "head_unfused": {"kernels_cu.fast_head.ENABLED": False},
    "head_warp_rows": {"kernels_cu.fast_head.SELECT_DEFINES": (("HP_WARP_ROWS", 1),)},
    "head_lanes_all": {"kernels_cu.fast_head.WARP_FORM_MAX_ROWS": 0},
    "head_own_thr": {"kernels_cu.fast_head.SHARED_THRESHOLDS": False},
    "wgemm": {"kernels_cu.fast_wgemm.ENABLED": True},
    "wgemm_nopdl": {"kernels_cu.fast_wgemm.ENABLED": True, "kernels_cu.fast_wgemm.PDL": False},
    "attn_mma": {"kernels_cu.fast_attention.WGMMA": False},
    "attn_wg_s3": {"kernels_cu.fast_attention.WGMMA": True, "kernels_cu.fast_attention.STAGES": 3},
    "nopdl": {"kernels_cu.pdl.ENABLED": False},
    "nopdl_glue": {"kernels_cu.fast_block.PDL_GLUE": False},
    "no_launch_order": {"kernels_cu.pdl.LAUNCH_ORDER": False},
    "stages2": {"kernels_cu.fast_attention.STAGES": 2},
    "stages3": {"kernels_cu.fast_attention.STAGES": 3},
    "stages4": {"kernels_cu.fast_attention.STAGES": 4},
    "alias2": {"kernels_cu.fast_attention.ALIAS": True, "kernels_cu.fast_attention.STAGES": 2},
    "alias3": {"kernels_cu.fast_attention.ALIAS": True, "kernels_cu.fast_attention.STAGES": 3},
    "alias4": {"kernels_cu.fast_attention.ALIAS": True, "kernels_cu.fast_attention.STAGES": 4},
    "cublas_layers": {"kernels_cu.fast_gemv.GEMV": False},
    "gemv_nostage": {"kernels_cu.fast_gemv.STAGE_BYTES": 0},
    "gemv_waves1": {"kernels_cu.fast_gemv.MAX_WAVES": 1.0},
    "gemv_m8": {"kernels_cu.fast_gemv.MAX_M": 8},
    "gemv_nopdl": {"kernels_cu.fast_gemv.PDL": False},
    "gemv_noact": {"kernels_cu.fast_gemv.ACT": False},
    "gemv_stage128": {"kernels_cu.fast_gemv.STAGE_BYTES": 128 * 1024},
    "gemv_stage64": {"kernels_cu.fast_gemv.STAGE_BYTES": 64 * 1024},
    "early_table_all": {"kernels_cu.fast_block.EARLY_TABLE_MAX_ROWS": 1 << 30},
    "rn_block": {"kernels_cu.fast_block.RESID_NORM_PATH": "block"},
    "head_memset": {"kernels_cu.fast_head.CLEAN": False},
    "combine_two_pass": {"kernels_cu.fast_attention.COMBINE_ONE_PASS": False},
    "split_od4": {"kernels_cu.fast_block.GEMM_SPLITS": {(1280, 5120): 4, (5120, 17408): 2, (2048, 4096): 4,
                                                        (2048, 6144): 4}},
    "probe_no_qkv_post": {"kernels_cu.fast_block.PROBE_SKIP": frozenset({"qkv_post"})},
    "probe_no_silu_mul": {"kernels_cu.fast_block.PROBE_SKIP": frozenset({"silu_mul"})},
    "probe_no_post_norm": {"kernels_cu.fast_block.PROBE_SKIP": frozenset({"post_norm"})},
    "default": {},
}


def _target(path: str):
    mod, attr = path.rsplit(".", 1)
    return importlib.import_module(mod), attr


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shapes", default="1x8,8x16")
    ap.add_argument("--geometries", default="dflash2-27b,dflash-35b-a3b")
    ap.add_argument("--configs", default="nosplit,v7", help=f"of {', '.join(CONFIGS)}; the first is the baseline")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    names = args.configs.split(",")
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        raise SystemExit(f"--configs: unknown {unknown[0]!r}; known: {', '.join(CONFIGS)}")
    import cupy as cp
    import torch

    from benchmarks.gpu_bench import Timer, measure_ceilings, ring_bytes, round_drafter, round_inputs
    from conformance.geometry import GEOMETRIES, _capacity
    from reference.config import PRESETS

    timer = Timer(cp, torch)
    copy_bw = measure_ceilings(cp, torch, timer)["copy_bandwidth_TBps"] * 1e12
    configs = {n: CONFIGS[n] for n in names}
    base = names[0]
    paths = {p for over in configs.values() for p in over}
    defaults = {p: getattr(*_target(p)) for p in paths}
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    report = {"copy_TBps": copy_bw / 1e12, "cases": []}
    for geo in args.geometries.split(","):
        cfg = PRESETS[GEOMETRIES[geo]]
        fr, tw, tr, wbits, extra, weight_bytes = round_drafter(cp, torch, cfg)
        cap = _capacity(cfg, 4096)
        for b, w in shapes:
            kw, _ = round_inputs(cp, torch, cfg, b, w, 4096)
            times = {name: [] for name in configs}
            tokens = {}
            for _ in range(args.rounds):
                for name, over in configs.items():
                    for p, v in defaults.items():
                        setattr(*_target(p), over.get(p, v))
                    cp.cuda.Device().synchronize()
                    fr._ws.clear()  # a new workspace (the split outputs' shapes) and a new graph
                    ws = fr.workspace(b, w, cap)
                    fr.step(**kw, graph=False)  # copies the rings in
                    kw_ws = dict(kw, context_k=ws.ck, context_v=ws.cv)
                    for _ in range(2):
                        out = fr.step(**kw_ws)
                    tokens.setdefault(name, cp.asnumpy(out["tokens"]))
                    times[name].append(timer(lambda ws=ws: ws.graph.launch()))
            for p, v in defaults.items():
                setattr(*_target(p), v)
            rings = ring_bytes(cfg, b, cap)
            moved = weight_bytes + rings
            rec = {"geometry": geo, "B": b, "W": w, "weight_bytes": weight_bytes, "ring_bytes": rings,
                   "floor_ms_measured_bw": moved / copy_bw * 1e3, "floor_ms_4_1": moved / 4.1e12 * 1e3,
                   "floor_weights_ms_measured_bw": weight_bytes / copy_bw * 1e3,
                   "floor_weights_ms_4_1": weight_bytes / 4.1e12 * 1e3,
                   "ms": {n: statistics.median(t) for n, t in times.items()}, "all_ms": times,
                   f"tokens_equal_{base}": {n: bool((tokens[n] == tokens[base]).all()) for n in tokens},
                   "head_timings_us": fr.head_timings}  # 'M x N x K' -> us per call, the choice
            report["cases"].append(rec)
            print(json.dumps(rec), flush=True)
        fr.drop()
        fr.resident.clear()
        del fr, tw, tr, wbits, extra
        cp.get_default_memory_pool().free_all_blocks()
        torch.cuda.empty_cache()
    last = names[-1]
    print(f"\n{'round':<24}" + "".join(f"{n:>12}" for n in configs) + f"  {last}/{base}"
          + "  /floor(meas)  /floor(4.1)  /weights(meas)  /weights(4.1)")
    for r in report["cases"]:
        ms = r["ms"]
        label = f"{r['geometry']} B{r['B']} W{r['W']}"
        print(f"{label:<24}" + "".join(f"{ms[n]:12.3f}" for n in configs)
              + f"  {ms[last] / ms[base]:{len(last) + len(base) + 1}.3f}"
              + f"  {ms[last] / r['floor_ms_measured_bw']:12.2f}  {ms[last] / r['floor_ms_4_1']:11.2f}"
              + f"  {ms[last] / r['floor_weights_ms_measured_bw']:14.2f}  {ms[last] / r['floor_weights_ms_4_1']:13.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
