"""The fast attention's combine kernel, this tree's against another source's, on the same partials
(H200 probe, issue 12): outputs bit for bit, and microseconds per call.

    python -m benchmarks.combine_ab --before PATH [--json out.json]

PATH is a fast_attention.cu to compare with (e.g. `git show bc06c16:kernels_cu/fast_attention.cu`).
This tree's combine is launched as attention_fast does (fast_attention.combine_batch: the instance by
the split count); the other source's likewise, or its largest batch where it has no instance that large.
Both are built with this tree's NVRTC options (kernels_cu.loader) and -DFA_SINGLE for D 128. The
partials are random: o ~ N(0, 1), m ~ U(-8, 8) with a tenth of them -inf (a split that saw no key of
the row), l ~ U(0.5, 64), one set per shape, at the rows and split counts of the round's attention
calls (B1 W8: 8 (27B) and 16 (35B) splits; B8 W16: 4), and at 1-33 splits at B1 W8. Times: a CUDA
graph of 20 launches, median of the replays (benchmarks/graph_timer.py; the partials stay in L2, as
they are when the main kernel has just written them). Prints one line per case, then a table.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

HQ, HK, D = 32, 8, 128
CASES = [  # (label, B, W, live rows, splits)
    ("27B B1 W8", 1, 8, 8, 8), ("35B B1 W8", 1, 8, 8, 16), ("27B B8 W16", 8, 16, 16, 4), ("35B B8 W16", 8, 16, 13, 4),
    ("B1 W8 ns1", 1, 8, 8, 1), ("B1 W8 ns7", 1, 8, 8, 7), ("B1 W8 ns9", 1, 8, 8, 9), ("B1 W8 ns33", 1, 8, 8, 33),
]


def _combine(cp, source: str):
    """ns -> the source's combine kernel for ns splits: fast_attn_combine_d128_c{combine_batch(ns)}
    where the source has those (this tree's), else its one fast_attn_combine_d128."""
    from kernels_cu.fast_attention import combine_batch
    from kernels_cu.loader import KERNEL_DIR, NVRTC_OPTIONS

    opts = (*NVRTC_OPTIONS, f"-I{KERNEL_DIR}", "-DFA_SINGLE", f"-DFA_DP={D}", "-DFA_MT=4", "-DFA_F32=0",
            "-DFA_NS=2")  # the main kernel's stage count (sources since session v9 need it; older ones ignore it)
    mod = cp.RawModule(code=source, options=opts)
    batched = "FA_COMBINE_CB" in source  # the instances by batch (session v8 on)
    if not batched:
        return lambda ns: mod.get_function(f"fast_attn_combine_d{D}")
    # this tree's batch for ns, or the source's largest where it has no such instance (before v20: no c16)
    have = [int(c) for c in re.findall(r"FA_COMBINE_CB\(DPV, (\d+)\)", source)]
    return lambda ns: mod.get_function(f"fast_attn_combine_d{D}_c{min(combine_batch(ns), max(have))}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="a fast_attention.cu to compare with")
    ap.add_argument("--replays", type=int, default=25)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    import cupy as cp
    import numpy as np

    from benchmarks.graph_timer import graph_us
    from kernels_cu.loader import KERNEL_DIR

    kernels = {"before": _combine(cp, Path(args.before).read_text()),
               "now": _combine(cp, (KERNEL_DIR / "fast_attention.cu").read_text())}
    rng = np.random.default_rng(12)
    stream = cp.cuda.Stream(non_blocking=True)
    report = []
    for label, b, w, live_rows, ns in CASES:
        rows = b * HK * w * (HQ // HK)
        m = rng.uniform(-8, 8, (ns, rows)).astype(np.float32)
        m[rng.random((ns, rows)) < 0.1] = -np.inf
        ml = np.stack([m, rng.uniform(0.5, 64, (ns, rows)).astype(np.float32)], -1)
        part_o = cp.asarray(rng.standard_normal((ns, rows, D), dtype=np.float32))
        part_ml = cp.asarray(ml)
        live = cp.asarray(np.full(b, live_rows, np.int32))
        outs, us = {}, {}
        for name, pick in kernels.items():
            fn = pick(ns)
            o32 = cp.full((b, w, HQ, D), np.nan, np.float32)
            o16 = cp.full((b, w, HQ, D), 0xAAAA, np.uint16)

            kargs = (part_o, part_ml, live, np.int32(b), np.int32(w), np.int32(HQ), np.int32(HK), np.int32(D),
                     np.int32(ns), o32, o16)

            def launch(_j, fn=fn, grid=(-(-rows // 4),), kargs=kargs):
                fn(grid, (128,), kargs)

            us[name] = graph_us(cp, stream, launch, calls=20, replays=args.replays)
            outs[name] = (cp.asnumpy(o32), cp.asnumpy(o16))
        same = bool(np.array_equal(outs["before"][0].view(np.uint32), outs["now"][0].view(np.uint32))
                    and np.array_equal(outs["before"][1], outs["now"][1]))
        rec = {"case": label, "B": b, "W": w, "splits": ns, "rows": rows, "us": us, "bits_equal": same}
        report.append(rec)
        print(json.dumps(rec), flush=True)
    print(f"\n{'case':<14}{'splits':>7}{'before us':>11}{'now us':>9}  bits equal")
    for r in report:
        print(f"{r['case']:<14}{r['splits']:>7}{r['us']['before']:>11.2f}{r['us']['now']:>9.2f}  {r['bits_equal']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0 if all(r["bits_equal"] for r in report) else 1


if __name__ == "__main__":
    raise SystemExit(main())
