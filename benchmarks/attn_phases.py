"""Where the fast draft attention's time goes inside a block (H200 probe, issue 12): the kernel built
with -DFA_TIMING (kernels_cu/fast_attention.cu stamps the SM clock at each phase from thread 0 of every
block, and the global timer at entry), run at masked_block's four round shapes (BF16 bits, the round's
call), and per phase the mean and max over blocks of the cycles since the block's entry, with the
spread of block start times (global timer, ns) and the kernel's event time.

    python -m benchmarks.attn_phases [--wgmma on] [--json out.json]

Phases: 1 context tiles issued / pad zeroed (before the PDL wait), 7 the wait returned (session v21), 6 first
context tile in shared memory (q in registers), 2 context tiles done,
3 block tile done, 4 key slices merged, 5 outputs written. Timing build only; the stamps cost a few
instructions per phase.
"""

from __future__ import annotations

import argparse
import json
import sys

TIMING_BLOCKS = 4096  # fast_attention.cu FA_TIMING_BLOCKS: blocks whose stamps are kept
PHASES = [(1, "pre-wait"), (7, "waited"), (6, "tile 1 in smem"), (2, "ctx done"), (3, "block tile"), (4, "merged"),
          (5, "written")]


def _global(cp, mod, name):
    """A module's __device__ array: RawModule.get_global, or (an NVRTC module, the wgmma form's) the driver's
    pointer wrapped."""
    if hasattr(mod, "get_global"):
        return mod.get_global(name)
    ptr = mod.get_global_var(name)
    ptr = ptr[0] if isinstance(ptr, tuple) else ptr
    return cp.cuda.MemoryPointer(cp.cuda.UnownedMemory(int(ptr), TIMING_BLOCKS * 8 * 8, mod), 0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--wgmma", choices=["off", "on"], default="off",
                    help="fast_attention.WGMMA False / True (the wgmma form where it takes the shape)")
    args = ap.parse_args(argv)
    import cupy as cp
    import numpy as np
    import torch

    from benchmarks.bench_fast_attention import GEOMS, HK, HQ, SHAPES, D, make_inputs
    from kernels_cu import fast_attention as fa

    fa.EXTRA_OPTIONS = ("-DFA_TIMING",)
    fa.WGMMA = args.wgmma == "on"
    clock_hz = cp.cuda.Device().attributes["ClockRate"] * 1e3
    out = []
    for label, cap, window, tails in GEOMS:
        for b, w in SHAPES:
            x = make_inputs(cp, torch, b, w, cap, window, tails)
            common = (x["kc"], x["vc"], x["frontier"], x["live"], window)
            for _ in range(3):
                fa.attention_fast(*x["bits"], *common, f32_out=False, bf16_out=True)
            cp.cuda.runtime.deviceSynchronize()
            mt = fa._mt(min(w * HQ // HK, 64))
            stages = fa.stages_for()
            wg = fa.wg_for(fa._dp(D), D, mt, True, fa.alias_for(fa._dp(D)))
            mod = fa._module(fa._dp(D), mt, False, fa.EXTRA_OPTIONS, stages, wg=wg)
            clk, st = (_global(cp, mod, n) for n in ("fa_clock", "fa_start"))
            clk_a = cp.ndarray((TIMING_BLOCKS * 8,), dtype=np.uint64, memptr=clk)
            st_a = cp.ndarray((TIMING_BLOCKS,), dtype=np.uint64, memptr=st)
            clk_a.fill(0)
            st_a.fill(0)
            e0, e1 = cp.cuda.Event(), cp.cuda.Event()
            e0.record()
            fa.attention_fast(*x["bits"], *common, f32_out=False, bf16_out=True)
            e1.record()
            e1.synchronize()
            ms = cp.cuda.get_elapsed_time(e0, e1)
            c = clk_a.get().reshape(TIMING_BLOCKS, 8).astype(np.int64)
            s = st_a.get().astype(np.int64)
            used = c[:, 0] != 0
            n = int(used.sum())
            c, s = c[used], s[used]
            rel = {name: (c[:, p] - c[:, 0]) / clock_hz * 1e6 for p, name in PHASES}
            r = {"shape": f"{label} B{b} W{w}", "wgmma": wg, "blocks": n, "event_us": ms * 1e3,
                 "start_spread_us": float((s.max() - s.min()) / 1e3),
                 "mean_us": {k: float(v[v >= 0].mean()) if (v >= 0).any() else None for k, v in rel.items()},
                 "max_us": {k: float(v.max()) for k, v in rel.items()}}
            out.append(r)
            print(json.dumps(r), flush=True)
    print(f"\nus since block entry (mean / max over blocks); clock {clock_hz / 1e9:.2f} GHz")
    print(f"{'shape':30s} {'blocks':>6s} {'event':>6s} {'starts':>6s} " + " ".join(f"{n:>15s}" for _, n in PHASES))
    for r in out:
        cells = " ".join(f"{(r['mean_us'][n] or 0):7.1f}/{r['max_us'][n]:7.1f}" for _, n in PHASES)
        print(f"{r['shape']:30s} {r['blocks']:6d} {r['event_us']:6.1f} {r['start_spread_us']:6.1f} {cells}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
