"""One-shot benchmark of the fast draft attention (kernels_cu/fast_attention.py, issue 12).

Runs benchmarks.gpu_bench.bench_draft_attention unchanged (same inputs, same torch SDPA, same floor,
same Timer: CUDA events, 3 warm-ups, median of 25, L2 flushed before each call) with the fast column
on ``FastCudaBackend`` (FastAttentionMixin composed), then the fast kernel alone under a few split
settings (BLOCKS_PER_SM x MIN_TILES_PER_SPLIT) to show how the heuristic was chosen.

    python -m benchmarks.bench_fast_attention [--json out.json] [--no-exact] [--no-sweep]

Prints the table last. Needs CuPy and PyTorch on a CUDA GPU.
"""

from __future__ import annotations

import argparse
import json
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--no-exact", action="store_true")
    ap.add_argument("--no-sweep", action="store_true")
    args = ap.parse_args(argv)
    from benchmarks import gpu_bench as gb

    cp, torch = gb._imports()
    from kernels_cu import fast_attention as fa
    from kernels_cu.backend import CudaBackend
    from kernels_cu.fast import FastCudaBackend

    class _B(FastCudaBackend):  # FastAttentionMixin composed in kernels_cu.fast
        pass

    timer = gb.Timer(cp, torch)
    ceil = gb.measure_ceilings(cp, torch, timer)
    floor_bw = ceil["copy_bandwidth_TBps"] * 1e12
    shapes = [(1, 8), (8, 16)]
    sweep = []
    if not args.no_sweep:
        default = (fa.BLOCKS_PER_SM, fa.MIN_TILES_PER_SPLIT)
        for bps, mts in [(1, 1), (1, 4), (2, 2), (4, 4)]:
            fa.BLOCKS_PER_SM, fa.MIN_TILES_PER_SPLIT = bps, mts
            rows = []
            gb.bench_draft_attention(cp, torch, timer, None, _B(), shapes, rows, floor_bw)
            for r in rows:
                r["setting"] = f"BLOCKS_PER_SM={bps} MIN_TILES_PER_SPLIT={mts}"
            sweep += rows
        fa.BLOCKS_PER_SM, fa.MIN_TILES_PER_SPLIT = default
    rows = []
    gb.bench_draft_attention(cp, torch, timer, None if args.no_exact else CudaBackend(), _B(), shapes, rows, floor_bw)
    assert fa.last_path() == "fast", fa.last_path()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ceilings": ceil, "rows": rows, "sweep": sweep,
                       "environment": {k: str(v) for k, v in _B().environment().items()}}, f, indent=1)
    if sweep:
        print("\nsplit sweep (fast ms / torch ms):")
        for r in sweep:
            print(f"  {r['setting']:40s} {r['shape']:28s} fast {r['fast_ms']:.4f}  torch {r['torch_ms']:.4f}")
    print(f"\ncopy {ceil['copy_bandwidth_TBps']:.2f} TB/s; defaults BLOCKS_PER_SM={fa.BLOCKS_PER_SM} "
          f"MIN_TILES_PER_SPLIT={fa.MIN_TILES_PER_SPLIT}")
    print(gb.table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
