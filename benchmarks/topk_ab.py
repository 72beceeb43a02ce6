"""A/B of the split top-k's in-block merge (kernels_cu.fast.topk_plan) in one process (H200 probe,
issue 12): for each row count and k, the selection timed with the warp lists merged in the
partial block and without, on the same logits, and the two paths' ids and scores compared.

    python -m benchmarks.topk_ab [--rows 1,7,15,32,33,64,120] [--k 1,16] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,7,15,32,33,64,120")
    ap.add_argument("--k", default="1,16")
    ap.add_argument("--vocab", type=int, default=248320)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    import cupy as cp
    import numpy as np
    import torch

    import kernels_cu.fast as fast
    from benchmarks.gpu_bench import Timer

    timer = Timer(cp, torch)
    saved = fast.TOPK_MERGE_IN_BLOCK_MAX_ROWS, fast.TOPK_MERGE_MIN_K
    out = []
    try:
        for m in (int(v) for v in args.rows.split(",")):
            logits = cp.random.default_rng(m).standard_normal((m, args.vocab), dtype=np.float32) * 4
            for k in (int(v) for v in args.k.split(",")):
                r = {"rows": m, "k": k}
                res = {}
                for merged in (False, True):
                    fast.TOPK_MERGE_IN_BLOCK_MAX_ROWS, fast.TOPK_MERGE_MIN_K = (1 << 30, 1) if merged else (0, 1 << 30)
                    plan = fast.topk_plan(m, args.vocab, k)
                    partial = cp.empty((m, plan[4], k), dtype=np.uint64)
                    scores, ids = cp.empty((m, k), dtype=np.float32), cp.empty((m, k), dtype=np.int32)

                    def call():
                        fast.topk_into(logits, None, args.vocab, k, 0.0, 0.0, partial, scores, ids)

                    call()
                    res[merged] = (scores.copy(), ids.copy())
                    r["merged_ms" if merged else "unmerged_ms"] = round(timer(call), 4)
                    r["merged_plan" if merged else "unmerged_plan"] = plan[3]
                r["same_ids"] = bool(cp.array_equal(res[False][1], res[True][1]))
                r["same_scores"] = bool(cp.array_equal(res[False][0], res[True][0]))
                fast.TOPK_MERGE_IN_BLOCK_MAX_ROWS, fast.TOPK_MERGE_MIN_K = saved
                r["committed_merges"] = fast.topk_plan(m, args.vocab, k)[3]
                out.append(r)
                print(json.dumps(r), flush=True)
    finally:
        fast.TOPK_MERGE_IN_BLOCK_MAX_ROWS, fast.TOPK_MERGE_MIN_K = saved
    print(f"\n{'rows':>5} {'k':>3} {'unmerged ms':>12} {'merged ms':>10} {'merged/un':>9} {'committed':>10} same")
    for r in out:
        print(f"{r['rows']:5d} {r['k']:3d} {r['unmerged_ms']:12.4f} {r['merged_ms']:10.4f} "
              f"{r['merged_ms'] / r['unmerged_ms']:9.2f} {'merged' if r['committed_merges'] else 'unmerged':>10} "
              f"{r['same_ids'] and r['same_scores']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0 if all(r["same_ids"] and r["same_scores"] for r in out) else 1


if __name__ == "__main__":
    sys.exit(main())
