"""The figures of docs/reports/fuzz.md, generated:

    python tools/fuzz_report.py [--controls N] [--baseline N] [--mutants N] [--seed S] [--out docs/reports/fuzz.md]

1. legitimate variants (conformance/controls/variants.py) and the float32 baseline: up to --controls examples per
   Op, every example judged on every variant (one strategy run per Op); every FAIL/ERROR is listed with its
   parameters (no shrinking here: the run goes on to count them all);
2. the float32 baseline alone: up to --baseline examples per Op;
3. every mutant of the catalog and the round mutants (conformance.mutants: MUTANTS, ROUND_MUTANTS):
   fuzz alone, up to --mutants examples on its Op, shrunk; caught or not, examples to the first failure, the
   triggering parameters.
In-process (the worker adds nothing to what is measured here), fixed seed.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import hypothesis
import numpy as np

from conformance import fuzz, registry
from conformance import mutants as catalog
from conformance.baseline import Float32Baseline

BAD = ("FAIL", "ERROR")
AUDIT = [
    ("asymmetric seeds (1, 2^32+7, 2^63+5): key words swapped", ("`seeds()`: edges 1, 2^32+7, 2^63+5 and any 64-bit "
     "seed, per row (selector, accept, tree)"), "rng_key, rng_key-speculative_accept, rng_key-tree_verify"),
    ("residual_sum_zero with an FP32-normalized q", "speculative_accept `design=residual_zero`",
     "residual_sum_zero"),
    ("NaN-score top-k", "candidate_topk `kind=nan_scores`, `nan_rows` anywhere", "nan_scores"),
    ("GQA head mapping / RoPE layout", ("`hk` 1..3, `hq` = hk x {1, 2, 4}, D 8..64 (attention, layer, block, "
     "context)"), "gqa_head_mapping (x3), rope_interleaved (x3)"),
    ("masked_block with several KV heads", "masked_block `hk` 1..3", ("gqa_head_mapping-masked_block, "
     "rope_interleaved-masked_block")),
    ("tiny-RMS draft_layer rows (eps dominates)", "draft_layer `tiny_rows`, feature_capture `tiny_rows`",
     "(no mutant: judged by the baseline and the legitimate variants)"),
    ("penalties at T != 1 in speculative_accept", ("speculative_accept `temperature` per row 0.3..1.7 with "
     "repetition/frequency/presence penalties; `design=repeats`"), "history_not_updated, penalties_last_token_only"),
    ("BF16 near ties (proposal_head) and softcap BF16 ties (candidate_topk)", ("`near_ties`; "
     "`transform=softcap_transformed/softcap_saturated`"), "bf16_logits, bf16_tie"),
]


def controls(specs, n, seed, impls, log, ops=None):
    rows, failures = [], []
    for op in sorted(ops or fuzz.STRATEGIES):
        judges = [(name, fuzz.judge_with(impl, specs)) for name, impl in impls]
        counts = defaultdict(Counter)
        t = time.monotonic()

        def judge(case, judges=judges, counts=counts):
            out = []
            for name, j in judges:
                r = j(case)
                counts[name][r.result.name] += 1
                if r.result.name in BAD:
                    out.append((name, r))
            return out

        def record(found, op=op):
            for name, r in found:
                failures.append((op, name, r.case, r.detail))
            return False

        run = fuzz.fuzz_op(op, judge, max_examples=n, seed=seed, shrink=False, is_failure=record)
        secs = time.monotonic() - t
        bad = sum(counts[name][k] for name in counts for k in BAD)
        rows.append((op, run.examples, run.rejected, bad, secs))
        log(f"controls {op}: {run.examples} examples x {len(judges)} implementations, {bad} FAIL/ERROR ({secs:.0f} s)")
    return rows, failures


def mutants(specs, n, seed, log):
    out = []
    ms = list(catalog.MUTANTS) + list(catalog.ROUND_MUTANTS)
    for m in ms:
        failing = BAD + (("ACCEPTABLE",) if getattr(m, "expect", "fail") == "precision" else ())
        t = time.monotonic()
        run = fuzz.fuzz_op(m.op, fuzz.judge_with(m, specs), max_examples=n, seed=seed,
                           is_failure=lambda r, failing=failing: r.result.name in failing)
        secs = time.monotonic() - t
        f = run.found
        out.append((m, run, f, secs))
        log(f"mutant {m.key} ({m.op}): " + (f"caught at example {f.examples_to_first}, trigger "
                                             f"{fuzz.describe(f.trigger)}" if f else f"not caught in {run.examples}")
            + f" ({secs:.1f} s)")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--controls", type=int, default=2000)
    ap.add_argument("--baseline", type=int, default=2000)
    ap.add_argument("--mutants", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ops", default="", help="comma-separated Ops for the control runs (default: every Op)")
    ap.add_argument("--out", default=str(REPO / "docs" / "reports" / "fuzz.md"))
    args = ap.parse_args(argv)
    from conformance.controls.variants import VARIANTS

    specs = registry.ops()
    log = lambda line: print(line, flush=True)
    np.seterr(all="ignore")
    t0 = time.monotonic()
    impls = [("float32 baseline", Float32Baseline())] + [(v.key, v) for v in VARIANTS]
    ops = [o for o in args.ops.split(",") if o] or None
    ctl_rows, ctl_fail = controls(specs, args.controls, args.seed, impls, log, ops) if args.controls else ([], [])
    t1 = time.monotonic()
    base_rows, _ = controls(specs, args.baseline, args.seed + 1, impls[:1], log) if args.baseline else ([], [])
    t2 = time.monotonic()
    mut = mutants(specs, args.mutants, args.seed, log) if args.mutants else []
    t3 = time.monotonic()

    cmd = "python tools/fuzz_report.py " + " ".join(argv if argv is not None else sys.argv[1:])
    lines = ["# Property-based conformance: `dflash-conformance fuzz`", "",
             (f"Generated by `{cmd.strip()}` on {datetime.date.today()} ({platform.platform()}, Python "
             f"{platform.python_version()}, hypothesis {hypothesis.__version__}, NumPy {np.__version__}); seed "
             f"{args.seed}; in-process; machine: 2 cores, no GPU. Strategies: `conformance/strategies/` "
             "(`STRATEGIES`, what each sweeps in its `covers`)."), ""]
    if ctl_rows:
        lines += [f"## Legitimate variants: up to {args.controls} examples per Op", "",
                  (f"Each example judged on the float32 baseline and every one of the {len(impls) - 1} legitimate "
                  f"variants of conformance/controls/variants.py ({len(impls)} implementations). Wall time "
                  f"{t1 - t0:.0f} s."), "",
                  "| Op | examples | draws rejected | FAIL/ERROR verdicts | wall (s) |", "|---|---:|---:|---:|---:|"]
        lines += [f"| {op} | {n} | {rej} | {bad} | {s:.0f} |" for op, n, rej, bad, s in ctl_rows]
        lines += ["", (f"Total: {sum(r[1] for r in ctl_rows)} examples, "
                      f"{sum(r[1] for r in ctl_rows) * len(impls)} verdicts, {len(ctl_fail)} FAIL/ERROR.")]
        if ctl_fail:
            by = Counter((op, name) for op, name, _, _ in ctl_fail)
            lines += ["", ("FAIL/ERROR verdicts of legitimate implementations (defects of the suite, or of the "
                          "variant, per C2 v2; not hidden):"), "",
                      "| Op | implementation | count | first case | detail |", "|---|---|---:|---|---|"]
            for (op, name), k in sorted(by.items()):
                case, detail = next((c, d) for o, nm, c, d in ctl_fail if (o, nm) == (op, name))
                lines.append(f"| {op} | {name} | {k} | `{case}` | {detail[:220].replace('|', '/')} |")
    if base_rows:
        lines += ["", f"## Float32 baseline alone: up to {args.baseline} examples per Op", "",
                  f"Wall time {t2 - t1:.0f} s.", "", "| Op | examples | draws rejected | FAIL/ERROR | wall (s) |",
                  "|---|---:|---:|---:|---:|"]
        lines += [f"| {op} | {n} | {rej} | {bad} | {s:.0f} |" for op, n, rej, bad, s in base_rows]
    if mut:
        caught = [x for x in mut if x[2] is not None]
        firsts = [f.examples_to_first for _, _, f, _ in caught]
        lines += ["", f"## Mutants: fuzz alone, up to {args.mutants} examples on the mutant's Op", "",
                  (f"{len(caught)} of {len(mut)} caught; median examples to the first failure "
                  f"{statistics.median(firsts) if firsts else 'n/a'} (max {max(firsts) if firsts else 'n/a'}); "
                  f"wall time {t3 - t2:.0f} s (shrinking included). A precision-only mutant "
                  "(`expect = precision`) counts as caught on ACCEPTABLE (as `--strict`). \"Trigger\": the "
                  "parameters of the shrunk example that differ from the simplest example of its branch."), "",
                  "| mutant | Op | caught at example | shrink steps | trigger | verdict |", "|---|---|---:|---:|---|---|"]
        for m, run, f, s in mut:
            if f is None:
                lines.append(f"| {m.key} | {m.op} | not caught ({run.examples} examples) | | | |")
            else:
                lines.append(f"| {m.key} | {m.op} | {f.examples_to_first} | {f.shrink_calls} | "
                             f"{fuzz.describe(f.trigger).replace('|', '/') or '(simplest example)'} | "
                             f"{f.result.result.name} |")
    lines += ["", "## Audit cases (the weak vectors) and the strategies that reach them", "",
              ("These are the weak vectors that the diagnosis work fixed (commit 4bb7a36), each with the strategy "
               "parameter that reaches its pitfall and the mutant above that shows it is reached."), "",
              "| audit case | strategy parameters | mutant caught by fuzz alone |", "|---|---|---|"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in AUDIT]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out} ({time.monotonic() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
