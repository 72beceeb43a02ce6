"""Where the fused combine's time goes (session v20; H200): the attention of masked_block at the 35B geometry
(S 4096, BF16 bits, the default form) as one graph replay, its splits merged four ways:
  kernel   the combine kernel (fast_attention.FUSED_COMBINE False)
  fused    the last split block merges (the default)
  count    counted, but the last block returns without merging (-DFA_FC_PROBE=1: wrong outputs)
  none     neither counted nor merged (-DFA_FC_PROBE=2: wrong outputs; the split kernel alone)
  nofence  the merge without its acquire fence (-DFA_FC_PROBE=3)
  noload   the merge without its loads of the partial o (-DFA_FC_PROBE=5: wrong outputs)
  mma, mma_kernel  fused and kernel on the mma.sync kernel (WGMMA False)
Prints graph us (benchmarks.gpu_bench.Timer: L2 flushed, median) and the kernels' own durations from a CUPTI
trace (benchmarks.bench_fast_attention.cupti_us).

    python -m benchmarks.fused_combine_probe [--shapes 1x8,8x16] [--splits N]
"""

from __future__ import annotations

import argparse
import functools
import json


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="1x8,8x16")
    ap.add_argument("--splits", type=int, default=None)
    args = ap.parse_args(argv)
    from benchmarks import bench_fast_attention as bfa
    from benchmarks import gpu_bench as gb

    cp, torch = gb._imports()
    from kernels_cu import fast_attention as fa

    timer = gb.Timer(cp, torch)
    variants = {"kernel": {"FUSED_COMBINE": False}, "fused": {},
                "count": {"EXTRA_OPTIONS": ("-DFA_FC_PROBE=1",)}, "none": {"EXTRA_OPTIONS": ("-DFA_FC_PROBE=2",)},
                "nofence": {"EXTRA_OPTIONS": ("-DFA_FC_PROBE=3",)}, "noload": {"EXTRA_OPTIONS": ("-DFA_FC_PROBE=5",)},
                "mma": {"WGMMA": False}, "mma_kernel": {"WGMMA": False, "FUSED_COMBINE": False}}
    table = []
    for shape in args.shapes.split(","):
        b, w = (int(v) for v in shape.split("x"))
        x = bfa.make_inputs(cp, torch, b, w, 4096, 4096, True)
        call = functools.partial(fa.attention_fast, *x["bits"], x["kc"], x["vc"], x["frontier"], x["live"], 4096,
                                 f32_out=False, bf16_out=True)
        for name, settings in variants.items():
            settings = {"SPLITS": args.splits, **settings}
            ms, _, (g, s) = bfa.with_settings(fa, settings, lambda: bfa.time_graph(cp, timer, lambda: call()[1]))
            k_us, kernels = bfa.cupti_us(cp, torch, g, s)
            r = {"shape": shape, "variant": name, "graph_us": round(ms * 1e3, 2), "kernels_us": round(k_us, 2),
                 "kernels": kernels, "combine": fa.last_combine()}
            print(json.dumps(r), flush=True)
            table.append(r)
    print(f"{'shape':8} {'variant':8} {'graph us':>9} {'kernels us':>11}")
    for r in table:
        line = f"{r['shape']:8} {r['variant']:8} {r['graph_us']:9.2f} {r['kernels_us']:11.2f}"
        print(f"{line}  {' | '.join(r['kernels'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
