"""Where the fused head's time goes (kernels_cu/fast_head.cu; probe, issue 12): either kernel alone over the 27B head
(248320 x 5120 BF16, 2.54 GB) built with other stage counts and with its probe switches (HT_PROBE_NO_MMA: the stream
without the tensor cores; HT_PROBE_NO_EPILOGUE: without the selection, the accumulators summed so that ptxas keeps the
wgmma chain (before session v18 it dropped it); HT_PROBE_CLOCKS: cycle counts; HP_SEED_BISECT: the warp form's first
thresholds by bisection; HP_WARP_ROWS: the ping-pong kernel's v14 selection, a warp a hidden row; HP_SET / HP_AHEAD:
the lane form's float4 a set and sets loaded ahead; HP_PROBE_NO_CAND: its scan without the candidates, wrong lists;
HP_PAIR 1: two candidates a lane a step; HP_TILE_COMPACT 0: no tile-end compaction; HP_PROBE_X_EVERY: x loaded at
every stage's first use, then every n-th stage only, wrong logits; HP_SHARED_THR 0: each block's own thresholds only),
timed by CUDA events (median). ``--sustain S`` also runs each variant back to back for S seconds while nvidia-smi
samples the SM clock, the power draw and the clock-event reasons (medians and the reasons seen, per variant). Variants
named pingpong* / pp_* build fast_head_topk_pp, the others fast_head_topk.

    python -m benchmarks.fast_head_probe [--only pingpong,pp_clocks] [--sustain 2] [--json out.json]

Columns: variant, hidden rows, ms, GB/s of head bytes, fraction of 4.1 TB/s.
"""

from __future__ import annotations

import argparse
import json
import sys

VARIANTS = [  # (label, rows, defines)
    ("base", 7, ()),
    ("stages2", 7, (("HT_STAGES", 2),)),
    ("stages6", 7, (("HT_STAGES", 6),)),
    ("stages3", 7, (("HT_STAGES", 3),)),
    ("stream", 7, (("HT_PROBE_NO_MMA", 1), ("HT_PROBE_NO_EPILOGUE", 1))),
    ("no_seed", 7, (("HT_NO_SEED", 1),)),
    ("base", 120, ()),
    ("no_seed", 120, (("HT_NO_SEED", 1),)),
    ("stages3", 120, (("HT_STAGES", 3),)),
    ("no_epilogue", 120, (("HT_PROBE_NO_EPILOGUE", 1),)),
    ("no_mma", 120, (("HT_PROBE_NO_MMA", 1),)),
    ("stream", 120, (("HT_PROBE_NO_MMA", 1), ("HT_PROBE_NO_EPILOGUE", 1))),
    ("with_dump", 120, (("HT_DUMP", 1),)),
    ("pingpong", 7, ()),
    ("pingpong", 15, ()),
    ("pingpong", 56, ()),
    ("pingpong", 120, ()),
    ("pingpong", 128, ()),
    ("pp_stages3", 120, (("HP_STAGES", 3),)),
    ("pp_nomma_clocks", 120, (("HT_PROBE_NO_MMA", 1), ("HT_PROBE_CLOCKS", 1))),
    ("pp_no_epilogue", 120, (("HT_PROBE_NO_EPILOGUE", 1),)),
    ("pp_stream", 120, (("HT_PROBE_NO_MMA", 1), ("HT_PROBE_NO_EPILOGUE", 1))),
    ("pp_clocks", 120, (("HT_PROBE_CLOCKS", 1),)),
    ("pp_warp_rows", 7, (("HP_WARP_ROWS", 1),)),
    ("pp_warp_rows", 120, (("HP_WARP_ROWS", 1),)),
    ("pp_warp_rows_clocks", 120, (("HP_WARP_ROWS", 1), ("HT_PROBE_CLOCKS", 1))),
    ("pp_set2", 120, (("HP_SET", 2), ("HP_AHEAD", 4))),
    ("pp_nocand_clocks", 120, (("HP_PROBE_NO_CAND", 1), ("HT_PROBE_CLOCKS", 1))),
    ("pp_nocand", 120, (("HP_PROBE_NO_CAND", 1),)),
    ("pp_no_epilogue_clocks", 120, (("HT_PROBE_NO_EPILOGUE", 1), ("HT_PROBE_CLOCKS", 1))),
    ("pp_pair", 120, (("HP_PAIR", 1),)),
    ("pp_tc0", 7, (("HP_TILE_COMPACT", 0),)),
    ("pp_tc0", 120, (("HP_TILE_COMPACT", 0),)),
    ("pp_tc0_clocks", 120, (("HP_TILE_COMPACT", 0), ("HT_PROBE_CLOCKS", 1))),
    ("pp_ahead1", 120, (("HP_AHEAD", 1),)),
    ("pp_ahead3", 120, (("HP_AHEAD", 3),)),
    ("pp_bisect", 120, (("HP_SEED_BISECT", 1), ("HP_WARP_ROWS", 1))),
    ("pp_bisect_clocks", 120, (("HP_SEED_BISECT", 1), ("HP_WARP_ROWS", 1), ("HT_PROBE_CLOCKS", 1))),
    ("clocks", 7, (("HT_PROBE_CLOCKS", 1),)),
    ("clocks", 120, (("HT_PROBE_CLOCKS", 1),)),
    # session v18: where the rows' cost comes from (x's L2 traffic, the selection's effect on the clocks)
    ("pp_clocks", 7, (("HT_PROBE_CLOCKS", 1),)),
    ("pp_stream", 7, (("HT_PROBE_NO_MMA", 1), ("HT_PROBE_NO_EPILOGUE", 1))),
    ("pp_no_epilogue", 7, (("HT_PROBE_NO_EPILOGUE", 1),)),
    ("pp_xhalf", 120, (("HP_PROBE_X_EVERY", 2),)),
    ("pp_xquarter", 120, (("HP_PROBE_X_EVERY", 4),)),
    ("pp_xhalf_clocks", 120, (("HP_PROBE_X_EVERY", 2), ("HT_PROBE_CLOCKS", 1))),
    ("pp_xhalf_no_epilogue", 120, (("HP_PROBE_X_EVERY", 2), ("HT_PROBE_NO_EPILOGUE", 1))),
    ("pp_xonce", 120, (("HP_PROBE_X_EVERY", 1 << 30),)),
    ("pp_xonce_no_epilogue", 120, (("HP_PROBE_X_EVERY", 1 << 30), ("HT_PROBE_NO_EPILOGUE", 1))),
    ("pp_own_thr", 7, (("HP_SHARED_THR", 0),)),
    ("pp_own_thr", 120, (("HP_SHARED_THR", 0),)),
    ("pp_own_thr", 128, (("HP_SHARED_THR", 0),)),
    ("pp_own_thr_clocks", 120, (("HP_SHARED_THR", 0), ("HT_PROBE_CLOCKS", 1))),
]
CLOCKS = ("total", "epilogue", "seed", "passes", "values_past_prefilter", "scan", "tiles", "compaction")
# the ping-pong kernel's, per consumer warpgroup (fast_head_topk_pp under HT_PROBE_CLOCKS)
PP_CLOCKS = ("total", "main_turn_wait", "main_loop", "select_turn_wait", "staging", "select", "tiles", "compactions")
PP_CLOCK_WORDS = 40  # fast_head.cu HP_PC: 8 sums, then 8 tiles x (main start, main end, selection start, end)


def pp_timeline(c) -> dict:
    """From the ping-pong kernel's event clocks [blocks, 2, 40]: the first tiles of each block in tile order (warpgroup
    tile % 2, its tile // 2), the mean over blocks of each one's main loop, selection, and the gap before its main
    loop starts after the previous tile's ended (the stream idles there unless stages are ahead), in cycles."""
    import numpy as np

    ev = c[:, :, 8:].reshape(c.shape[0], 2, 8, 4)  # block, warpgroup, its tile, event
    rows = []
    for j in range(1, 12):
        wg, i = j % 2, j // 2
        prev = ev[:, (j - 1) % 2, (j - 1) // 2]
        cur = ev[:, wg, i]
        ok = (cur[:, 1] > 0) & (prev[:, 1] > 0)
        if not ok.any():
            break
        rows.append({"tile": j, "main": float(np.mean(cur[ok, 1] - cur[ok, 0])),
                     "select": float(np.mean(cur[ok, 3] - cur[ok, 2])),
                     "gap_before_main": float(np.mean(cur[ok, 0] - prev[ok, 1]))})
    t0 = ev[:, 0, 0]
    return {"tile0_main": float(np.mean(t0[:, 1] - t0[:, 0])), "tile0_select": float(np.mean(t0[:, 3] - t0[:, 2])),
            "tiles": rows}


SMI_FIELDS = "clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active"


def sustained(cp, launch, seconds: float) -> dict:
    """The variant launched back to back (no L2 flush) for about ``seconds`` while ``nvidia-smi`` samples every 50 ms:
    the median SM and memory clocks (MHz), power (W) and temperature over the samples taken while it ran, the
    clock-event reason masks seen, and the mean time a launch (host clock over the whole run, synchronised)."""
    import statistics
    import subprocess
    import time

    launch()
    cp.cuda.Device().synchronize()
    t = time.perf_counter()
    launch()
    cp.cuda.Device().synchronize()
    batch = max(1, int(0.05 / max(time.perf_counter() - t, 1e-5)))
    try:
        smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits",
                                "-lms", "50"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    except OSError as e:
        return {"error": f"nvidia-smi: {e}"}
    time.sleep(0.3)  # its first samples, before the load, are dropped below by time
    t0 = time.perf_counter()
    n = 0
    while time.perf_counter() - t0 < seconds:
        for _ in range(batch):
            launch()
        n += batch
        cp.cuda.Device().synchronize()
    dt = time.perf_counter() - t0
    smi.terminate()
    text, _ = smi.communicate(timeout=10)
    rows = [line.split(",") for line in text.strip().splitlines()]
    rows = [[c.strip() for c in row] for row in rows if len(row) == 5]
    keep = rows[len(rows) // 4:]  # the load's steady part: the first quarter covers the start
    def med(i):
        vals = []
        for row in keep:
            try:
                vals.append(float(row[i]))
            except ValueError:
                pass
        return statistics.median(vals) if vals else float("nan")
    return {"samples": len(keep), "sm_mhz": med(0), "mem_mhz": med(1), "watts": med(2), "temp_c": med(3),
            "reasons": sorted({row[4] for row in keep}), "ms_per_launch": dt / n * 1e3, "launches": n}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--vocab", type=int, default=248320)
    ap.add_argument("--hidden", type=int, default=5120)
    ap.add_argument("--only", default=None, help="run only the variants whose label is in this comma list")
    ap.add_argument("--rows", default=None, help="only these hidden-row counts (comma list)")
    ap.add_argument("--sustain", type=float, default=0.0,
                    help="seconds of back-to-back launches per variant under nvidia-smi sampling (0: none)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    import cupy as cp
    import numpy as np

    from benchmarks.gpu_bench import Timer
    from kernels_cu import fast_head as fh

    timer = Timer(cp, None)  # CUDA events, L2 flushed before each call, median

    vr, h = args.vocab, args.hidden
    rng = cp.random.default_rng(0)
    w = (rng.standard_normal((vr, h), dtype=cp.float32) * h**-0.5).view(cp.uint32)
    w = (w >> 16).astype(cp.uint16)
    out = []
    for label, m, defines in VARIANTS:
        if args.only and label not in args.only.split(","):
            continue
        if args.rows and str(m) not in args.rows.split(","):
            continue
        n = fh.n_for(m)
        pp = label.startswith(("pingpong", "pp_"))
        stages = dict(defines).get("HP_STAGES", fh.pp_stages(n)) if pp else dict(defines).get("HT_STAGES", fh.STAGES)
        smem = fh.smem_bytes_pp(n, stages) if pp else fh.smem_bytes(n, stages)
        _, fn = fh._kernel(n, tuple(defines), smem, pp)
        x = (rng.standard_normal((m, h), dtype=cp.float32).view(cp.uint32) >> 16).astype(cp.uint16)
        partial = cp.zeros((m, fh.grid(vr), 16), np.uint64)
        clock_shape = (fh.grid(vr), 2, PP_CLOCK_WORDS) if pp else (fh.grid(vr), 1, len(CLOCKS))  # per warpgroup
        clocks = cp.zeros(clock_shape, np.uint64) if label.endswith("clocks") else None
        launch = (lambda fn=fn, x=x, partial=partial, smem=smem, n=n, clocks=clocks, pp=pp:
                  fh.launch(fn, n, x, w, vr, 16, partial, clocks, smem, fh.PP_THREADS if pp else fh.THREADS))
        ms = timer(launch, warmup=1, reps=args.reps)
        gbs = vr * h * 2 / ms / 1e6
        r = {"variant": label, "rows": m, "n": n, "stages": stages, "smem": smem, "ms": ms, "GBps": gbs,
             "of_4100": gbs / 4100}
        if clocks is not None:  # per-block means of thread 0's counts (HT_PROBE_CLOCKS), cycles or counts
            mean = cp.asnumpy(clocks).astype(np.float64).mean(axis=0)
            if pp:  # per warpgroup, and the main loops' timeline
                r["clocks_mean"] = [{name: float(v) for name, v in zip(PP_CLOCKS, wg[:8])} for wg in mean]
                r["timeline"] = pp_timeline(cp.asnumpy(clocks).astype(np.int64))
            else:
                r["clocks_mean"] = {name: float(v) for name, v in zip(CLOCKS, mean[0])}
                r["epilogue_fraction"] = float(mean[0, 1] / mean[0, 0])
        if args.sustain > 0:  # the maps made once: no host copy between the back-to-back launches
            maps, threads = fh.device_maps(x, w), fh.PP_THREADS if pp else fh.THREADS

            def again():  # run within this iteration, so the loop's current values are the ones meant
                fh.launch(fn, n, x, w, vr, 16, partial, clocks, smem, threads, maps)  # noqa: B023

            r["smi"] = sustained(cp, again, args.sustain)
        out.append(r)
        print(json.dumps(r), flush=True)
    print(f"\n{'variant':<20} {'rows':>4} {'st':>3} {'ms':>7} {'GB/s':>7} {'/4.1TB/s':>8} {'MHz':>5} {'W':>4}"
          f" {'ms s':>6}")
    for r in out:
        smi = r.get("smi") or {}
        print(f"{r['variant']:<20} {r['rows']:>4} {r['stages']:>3} {r['ms']:>7.3f} {r['GBps']:>7.0f}"
              f" {r['of_4100']:>8.2f} {smi.get('sm_mhz', 0):>5.0f} {smi.get('watts', 0):>4.0f}"
              f" {smi.get('ms_per_launch', 0):>6.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
