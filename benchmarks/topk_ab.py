"""A/B of the split top-k's kernels (kernels_cu.fast: TOPK_VEC / TOPK_MERGE_WARP / a bound buffer, against
the v5 kernels) and of their in-block merge (topk_plan) in one process (H200 probe, issue 12): for
each row count and k, the selection timed every way on the same logits, and the ids and scores of
all compared.

    python -m benchmarks.topk_ab [--rows 1,7,15,32,33,64,120] [--k 1,16] [--blocks 2112,528] [--json out.json]

Columns: kernel set (warp: the v5 kernels | vec: fast_topk_partial_vec | bound: vec after
fast_topk_bound, what the Ops run), u / m (lists unmerged / merged in the block), _N: the target block
count of the vec / bound rows (TOPK_VEC_TARGET_BLOCKS; default: the committed value); the warp rows run
at TOPK_TARGET_BLOCKS.
"""

from __future__ import annotations

import argparse
import json
import sys


def _name(kern: str, merged: bool, blocks: int) -> str:
    return f"{kern}_{'m' if merged else 'u'}" + ("" if kern == "warp" else f"_{blocks}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,7,15,32,33,64,120")
    ap.add_argument("--k", default="1,16")
    ap.add_argument("--vocab", type=int, default=248320)
    ap.add_argument("--blocks", default=None, help="TOPK_TARGET_BLOCKS values to time the vec kernel at")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    import cupy as cp
    import numpy as np
    import torch

    import kernels_cu.fast as fast
    from benchmarks.gpu_bench import Timer

    timer = Timer(cp, torch)
    saved = (fast.TOPK_MERGE_IN_BLOCK_MAX_ROWS, fast.TOPK_MERGE_MIN_K, fast.TOPK_VEC, fast.TOPK_MERGE_WARP,
             fast.TOPK_TARGET_BLOCKS, fast.TOPK_VEC_TARGET_BLOCKS)
    blocks = [int(v) for v in args.blocks.split(",")] if args.blocks else [saved[5]]
    variants = [("warp", merged, saved[4]) for merged in (False, True)]  # the warp kernels at their own default
    variants += [(kern, merged, nb) for kern in ("vec", "bound") for nb in blocks for merged in (False, True)]
    out = []
    try:
        for m in (int(v) for v in args.rows.split(",")):
            logits = cp.random.default_rng(m).standard_normal((m, args.vocab), dtype=np.float32) * 4
            for k in (int(v) for v in args.k.split(",")):
                r = {"rows": m, "k": k}
                res = {}
                for kern, merged, nb in variants:
                    fast.TOPK_VEC = fast.TOPK_MERGE_WARP = kern != "warp"
                    bound = cp.empty(m, dtype=np.uint64) if kern == "bound" else None
                    fast.TOPK_TARGET_BLOCKS = fast.TOPK_VEC_TARGET_BLOCKS = nb
                    fast.TOPK_MERGE_IN_BLOCK_MAX_ROWS, fast.TOPK_MERGE_MIN_K = (1 << 30, 1) if merged else (0, 1 << 30)
                    plan = fast.topk_plan(m, args.vocab, k)
                    partial = cp.empty((m, plan[4], k), dtype=np.uint64)
                    scores, ids = cp.empty((m, k), dtype=np.float32), cp.empty((m, k), dtype=np.int32)

                    def call():
                        fast.topk_into(logits, None, args.vocab, k, 0.0, 0.0, partial, scores, ids, bound)

                    call()
                    name = _name(kern, merged, nb)
                    res[name] = (scores.copy(), ids.copy())
                    r[name + "_ms"] = round(timer(call), 4)
                ref = res["warp_u"]  # every variant against the v5 kernels' result
                r["same_ids"] = all(bool(cp.array_equal(ref[1], v[1])) for v in res.values())
                r["same_scores"] = all(bool(cp.array_equal(ref[0], v[0])) for v in res.values())
                fast.TOPK_MERGE_IN_BLOCK_MAX_ROWS, fast.TOPK_MERGE_MIN_K = saved[:2]
                fast.TOPK_TARGET_BLOCKS, fast.TOPK_VEC_TARGET_BLOCKS = saved[4:6]
                r["committed_merges"] = fast.topk_plan(m, args.vocab, k)[3]
                out.append(r)
                print(json.dumps(r), flush=True)
    finally:
        (fast.TOPK_MERGE_IN_BLOCK_MAX_ROWS, fast.TOPK_MERGE_MIN_K, fast.TOPK_VEC, fast.TOPK_MERGE_WARP,
         fast.TOPK_TARGET_BLOCKS, fast.TOPK_VEC_TARGET_BLOCKS) = saved
    names = [_name(kern, merged, nb) for kern, merged, nb in variants]
    print("\nms per call, L2 flushed before each")
    print(f"{'rows':>5} {'k':>3} " + " ".join(f"{n:>11}" for n in names) + f" {'committed':>9} same")
    for r in out:
        print(f"{r['rows']:5d} {r['k']:3d} " + " ".join(f"{r[n + '_ms']:11.4f}" for n in names)
              + f" {'merged' if r['committed_merges'] else 'unmerged':>9} {r['same_ids'] and r['same_scores']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0 if all(r["same_ids"] and r["same_scores"] for r in out) else 1


if __name__ == "__main__":
    sys.exit(main())
