"""How well the diagnosis names a bug it was not built from: writes docs/reports/diagnosis.md.

    python tools/diagnosis_report.py [--vectors vectors] [--out docs/reports/diagnosis.md]
                                     [--variants a,b,...] [--jobs N] [--skip-torch]

(a) leave-one-out: every mutant runs over its Op's vectors with its own entry removed from the
    catalog; is its family still named first (by another variant of the family)?
(b) every mutant planted on every legitimate precision variant of the control set
    (conformance.controls.variants): still named first?
(c) the PyTorch example engine with one slip of each family written in torch
    (examples/torch_engine/planted.py; tools/diagnosis_torch.py measures it), where torch is
    installed; the report says so where it is not.

Planting a mutant on an engine E: where the mutant is exactly the reference on changed inputs (an
``_ArgsMutant`` whose Op method is not overridden: a window S+1, a swapped seed), E itself runs on
those inputs, its own rounding throughout. Otherwise the bug's effect is carried over: represented
outputs are E's plus (mutant - float32 baseline), rounded to their storage format (non-finite values
the mutant's own); decisions and exact outputs the mutant's where it differs from the baseline, E's
elsewhere. Named first: the top hypothesis (a match, the closest mutant, or a family hypothesis) is of the planted
mutant's family, or a mutant of that family is tied first with identical outputs on the case.
Top 3: the family among the first three hypotheses. Wrong: another family named first.

Also measured (no false accusation): every legitimate variant over every vector (no FAIL may name
a pitfall) and bugs outside every family (a constant scale, a reversed top-k, an offset K cache:
a structural hypothesis or "no catalogued pitfall", never a pitfall's name).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from conformance import mutants, registry  # noqa: E402
from conformance.baseline import Float32Baseline  # noqa: E402
from conformance.compare import Result  # noqa: E402
from conformance.diagnose import Diagnoser, family, hypotheses, summary  # noqa: E402
from conformance.diagnosis.match import pure_args  # noqa: E402
from conformance.runner import run_suite  # noqa: E402
from reference import numerics  # noqa: E402

TARGET_FIRST, TARGET_TOP3 = 0.90, 0.95
_BASE = Float32Baseline()


def _numpy(out) -> dict:
    res = {}
    for k, v in dict(out).items():
        if hasattr(v, "detach"):  # a torch tensor: as the harness reads it back
            from conformance.runner import to_numpy

            v = to_numpy(v)
        res[k] = np.asarray(v)
    return res


class Planted:
    """Engine ``engine`` with mutant ``mutant``'s bug planted in the mutant's Op (module doc)."""

    def __init__(self, mutant, engine):
        self.mutant, self.engine = mutant, engine
        self.name = f"{mutant.key} on {getattr(engine, 'name', type(engine).__name__)}"

    def __getattr__(self, op):
        if op.startswith("_") or op != self.mutant.op:
            raise AttributeError(op)
        m, e, spec = self.mutant, self.engine, registry.get(op)

        def method(**kw):
            def cp():
                return {k: (np.array(x, copy=True) if isinstance(x, np.ndarray) else x) for k, x in kw.items()}

            if pure_args(m):
                return _numpy(getattr(e, op)(**m.change(cp())))
            with np.errstate(all="ignore"):
                mo, bo, eo = (_numpy(getattr(x, op)(**cp())) for x in (m, _BASE, e))
            out = {}
            for o in spec.outputs:
                a, b, c = mo[o.name], bo[o.name], eo[o.name]
                if a.shape != c.shape or a.shape != b.shape:
                    out[o.name] = a
                elif o.cls == registry.REPRESENTED:
                    a64, b64, c64 = (np.asarray(x).astype(np.float64) for x in (a, b, c))
                    with np.errstate(all="ignore"):
                        x = c64 + (a64 - b64)
                    keep = np.isfinite(x) & np.isfinite(a64)
                    out[o.name] = numerics.storage(np.where(keep, x, a64), o.fmt)
                else:
                    out[o.name] = np.where(a != b, a, c)
            return out

        method.__name__ = op
        return method


def _tops(r) -> list:
    """The families named first on a result: the top hypothesis's, and every match tied with it."""
    hs = hypotheses(r)
    fams = [hs[0]["family"]] if hs and hs[0].get("family") else []
    d = getattr(r, "diagnosis", None) or []
    if d and hs and hs[0]["kind"] == "match":
        fams += [x["family"] for x in d if x.get("tie")]
    return fams


def score(results, fam: str) -> dict:
    fails = [r for r in results if r.result == Result.FAIL]
    summary(fails)  # run-level ranking of ties, symptoms
    first = sum(fam in _tops(r) for r in fails)
    top3 = sum(fam in [h.get("family") for h in hypotheses(r)[:3]] + _tops(r) for r in fails)
    wrong = [r for r in fails if _tops(r) and fam not in _tops(r)]
    same = sum(bool(r.diagnosis) and r.diagnosis[0].get("exact", False) for r in wrong)
    by_family = sum(hypotheses(r)[0]["kind"] == "family" for r in wrong if hypotheses(r))
    # named first by a reading of a structural signature (diagnosis.mechanism), not by a variant
    read = sum(fam in _tops(r) and bool(hypotheses(r)) and "reading" in hypotheses(r)[0] for r in fails)
    return {"fails": len(fails), "first": first, "top3": top3, "wrong": len(wrong), "wrong_exact": same,
            "wrong_family": by_family, "read": read}


def _examples(results, fam, n=1) -> list[str]:
    return [f"{r.case}: {r.diagnosis_note[:160]}" for r in results if r.result == Result.FAIL and fam not in _tops(r)][:n]


def measure(engine_name: str | None, vectors: str, leave_one_out: bool = False) -> tuple[str, list[dict]]:
    """One engine (None: the mutants themselves), every fail-type mutant planted on it."""
    rows = []
    engine = None
    if engine_name:
        from conformance.controls.variants import BY_NAME

        engine = BY_NAME[engine_name]
    shared = None if leave_one_out else Diagnoser(max_cases=10**9)
    for m in mutants.MUTANTS:
        if m.expect != "fail":
            continue
        diag = Diagnoser(max_cases=10**9, catalog=[x for x in mutants.MUTANTS if x is not m]) if leave_one_out \
            else shared
        impl = m if engine is None else Planted(m, engine)
        try:
            res = run_suite(impl, Path(vectors), ops_pattern=m.op, diagnose=diag)
        except Exception as exc:  # noqa: BLE001 - reported as a row, the measurement goes on
            rows.append({"mutant": m.key, "family": family(m), "error": f"{type(exc).__name__}: {exc}"})
            continue
        s = score(res, family(m))
        others = [x for x in mutants.MUTANTS if x is not m and x.op == m.op and family(x) == family(m)]
        rows.append({"mutant": m.key, "family": family(m), "op": m.op, "siblings": len(others), **s,
                     "example": _examples(res, family(m))})
    return engine_name or "mutants", rows


def _rate(a, b) -> str:
    return f"{a}/{b} ({100.0 * a / b:.1f}%)" if b else "-"


def _totals(rows) -> dict:
    t = defaultdict(int)
    for r in rows:
        for k in ("fails", "first", "top3", "wrong", "wrong_exact", "wrong_family", "read"):
            t[k] += r.get(k, 0)
    return t


def _family_table(rows, loo: bool = False) -> list[str]:
    fam = defaultdict(lambda: defaultdict(int))
    for r in rows:
        if "error" in r:
            continue
        f = fam[r["family"]]
        for k in ("fails", "first", "top3", "wrong", "read"):
            f[k] += r[k]
        f["mutants"] += 1
        f["siblings"] = max(f["siblings"], r["siblings"])
    out = ["| family | mutants | FAILs | named first | top 3 | wrong name first |"
           + (" of the named first: by a reading | variants left |" if loo else ""),
           "|---|---|---|---|---|---|" + ("---|---|" if loo else "")]
    for name, f in sorted(fam.items()):
        out.append(f"| {name} | {f['mutants']} | {f['fails']} | {_rate(f['first'], f['fails'])} | "
                   f"{_rate(f['top3'], f['fails'])} | {f['wrong']} |"
                   + (f" {f['read']} | {f['siblings']} |" if loo else ""))
    return out


def _verdict_line(t) -> str:
    ok = t["fails"] and t["first"] / t["fails"] >= TARGET_FIRST and t["top3"] / t["fails"] >= TARGET_TOP3
    return (f"named first {_rate(t['first'], t['fails'])}, top 3 {_rate(t['top3'], t['fails'])}, another family "
            f"named first {t['wrong']} — target (first >= 90%, top 3 >= 95%) {'met' if ok else 'NOT met'}")


def _out_of_family(vectors: str) -> list[str]:
    from conformance.controls.engine import F32, Engine

    class ScaledAttention(Engine):
        name = "attention output x 1.02"

        def draft_attention(self, **kw):
            out = np.asarray(super().draft_attention(**kw)["out"]).astype(np.float32) * F32(1.02)
            return {"out": numerics.storage(out.astype(np.float64), "bf16")}

    class ReversedTopk(Engine):
        name = "top-k in ascending order"

        def candidate_topk(self, **kw):
            out = super().candidate_topk(**kw)
            return {"scores": out["scores"][..., ::-1].copy(), "ids": out["ids"][..., ::-1].copy()}

    class OffsetK(Engine):
        name = "K cache + 0.5"

        def context_kv(self, **kw):
            out = super().context_kv(**kw)
            k = np.asarray(out["k_cache"]).astype(np.float64) + 0.5
            return {**out, "k_cache": numerics.storage(k, "bf16")}

    lines = ["| bug outside every family | FAILs | a pitfall or family named | structural hypothesis first | none |",
             "|---|---|---|---|---|"]
    for impl, op in ((ScaledAttention(), "draft_attention"), (ReversedTopk(), "candidate_topk"),
                     (OffsetK(), "context_kv")):
        res = [r for r in run_suite(impl, Path(vectors), ops_pattern=op, diagnose=True) if r.result == Result.FAIL]
        summary(res)
        named = sum(any(h.get("pitfall") or h.get("family") for h in hypotheses(r)) or bool(r.diagnosis) for r in res)
        struct = sum(bool(hypotheses(r)) and hypotheses(r)[0]["kind"] == "structure" for r in res)
        none = sum(not hypotheses(r) for r in res)
        lines.append(f"| {impl.name} ({op}) | {len(res)} | {named} | {struct} | {none} |")
    return lines


def _controls(vectors: str) -> list[str]:
    from conformance.controls.variants import VARIANTS

    fails = named = 0
    for v in VARIANTS:
        res = run_suite(v, Path(vectors), diagnose=True)
        fails += sum(r.result.failed for r in res)
        named += sum(bool(r.diagnosis) or any(h.get("pitfall") or h.get("family") for h in hypotheses(r))
                     for r in res)
    return [f"Every legitimate variant ({len(VARIANTS)}) over every vector: {fails} FAIL/ERROR, {named} result(s) "
            "naming a pitfall. ACCEPTABLE cases are never diagnosed; tests/diagnosis/test_no_false_accusation.py "
            "also asks the analysis about each ACCEPTABLE case directly and requires no pitfall named."]


def _timing(vectors: str, want: int = 50) -> list[str]:
    """What the diagnosis adds to a run with ``want`` FAILs: mutants in catalog order, each with its own
    entry removed (no match: the closest-mutant and family searches run too, the slow path), run with
    and without the diagnosis, until ``want`` FAILs are diagnosed."""
    import os

    plain = diag = 0.0
    fails = 0
    for m in mutants.MUTANTS:
        if m.expect != "fail" or fails >= want:
            continue
        t = time.perf_counter()
        res = run_suite(m, Path(vectors), ops_pattern=m.op)
        plain += time.perf_counter() - t
        n = sum(r.result == Result.FAIL for r in res)
        if not n:
            continue
        d = Diagnoser(max_cases=want - fails, catalog=[x for x in mutants.MUTANTS if x is not m])
        t = time.perf_counter()
        run_suite(m, Path(vectors), ops_pattern=m.op, diagnose=d)
        diag += time.perf_counter() - t
        fails += min(n, d.done)
    return [f"Cost: runs with {fails} FAILs diagnosed (the catalog's mutants in order, each without its own entry, "
            f"so the closest-mutant and family searches run) took {diag:.1f} s with the diagnosis and {plain:.1f} s "
            f"without: the diagnosis added {diag - plain:.1f} s on this machine ({os.cpu_count()} cores, one used)."]


def _planted_torch(vectors: str) -> str:
    """Section (c): tools/diagnosis_torch.py over every planted family (ImportError without torch)."""
    import platform

    sys.path.insert(0, str(ROOT / "tools"))
    import diagnosis_torch
    import torch
    from examples.torch_engine.planted import PLANTED

    t0 = time.perf_counter()
    rows = [diagnosis_torch.measure(cls, Path(vectors)) for cls in PLANTED.values()]
    print(f"(c) {len(rows)} planted torch engines: {time.perf_counter() - t0:.0f} s", flush=True)
    return diagnosis_torch.render(rows, "python tools/diagnosis_torch.py", time.perf_counter() - t0,
                                  f"{platform.machine()} CPU, torch {torch.__version__}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vectors", default=str(ROOT / "vectors"))
    ap.add_argument("--out", default=str(ROOT / "docs/reports/diagnosis.md"))
    ap.add_argument("--variants", help="comma-separated control variants for (b) (default: all)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--skip-torch", action="store_true")
    args = ap.parse_args(argv)
    from conformance.controls.variants import VARIANTS

    names = args.variants.split(",") if args.variants else [v.key for v in VARIANTS]
    t0 = time.perf_counter()
    loo = measure(None, args.vectors, leave_one_out=True)[1]
    print(f"(a) leave-one-out: {time.perf_counter() - t0:.0f} s", flush=True)
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        planted = dict(pool.map(measure, names, [args.vectors] * len(names)))
    print(f"(b) {len(names)} variants: {time.perf_counter() - t0:.0f} s", flush=True)
    torch_section, torch_why = None, ""
    if args.skip_torch:
        torch_why = "skipped (--skip-torch)"
    else:
        try:
            torch_section = _planted_torch(args.vectors)
        except ImportError:
            torch_why = "not run here: torch is not installed on the machine that wrote this report"
    lines = ["# Diagnosis: naming a bug the catalog was not built from", "",
             f"Generated by `python tools/diagnosis_report.py {' '.join(argv if argv is not None else sys.argv[1:])}` "
             f"({time.perf_counter() - t0:.0f} s). Method: the tool's docstring. A FAIL counts once per case.", "",
             *_timing(args.vectors), ""]
    t = _totals(loo)
    alone = sum(r.get("siblings", 0) == 0 for r in loo)
    lines += ["## (a) Leave-one-out", "",
              "Each mutant runs over its Op's vectors with its own catalog entry removed. Its family can then be "
              "named two ways: by another variant of the family on the same Op (a match, the closest mutant, or a "
              "family hypothesis: its variants change the same rows in the same direction, or the same elements "
              "beyond chance, conformance/diagnosis/family.py), or by a *reading*: a structural signature of the "
              "difference that is on its own the family's mechanism (a window edge or the ring read off by one, a "
              "GQA head map, a causal row extent, cache rows in other slots, a seed's words swapped, a column "
              "rotation, a norm off by sqrt(n), a truncating store, V off its BF16 grid, K rotated keeping its "
              "norm, ties reordered, the conv's tap layout: conformance/diagnosis/mechanism.py). Many signatures "
              "are reruns of the reference on a transformed input (a field off by one, a seed's word lost, block "
              "ids misread, a parameter left at its neutral value, RoPE on interleaved pairs, the selector's "
              "candidates in reverse rank order) or with one of its rules written another way (the Philox "
              "counter's layout, the accept test's comparison, the correction's distribution, the bonus row, the "
              "selector's walk, the preview's cut, the norm's formula, the attention's window, the top-k's ranked "
              "values, tree_verify's residual between siblings, top-p's boundary): a search over the ways each "
              "mechanism is commonly written. Catalogued mutants are "
              "written the same ways, so for many mutants the reading is the mutant's own transform found by "
              "that search, not a generalization from its siblings; the column `by a reading` counts how many "
              "named-first FAILs came that way. "
              "Neither way may name another family (`wrong name first`); \"no catalogued pitfall\" is the honest "
              "answer where neither applies.", "",
              f"Overall: {_verdict_line(t)}; {t['read']} of the {t['first']} named first by a reading.", "",
              f"{alone} of {len(loo)} mutants have no other variant of their family on their Op in this catalog: "
              f"only a reading can name them. Of the "
              f"{t['wrong']} FAILs where another family is named first, {t['wrong_exact']} are bit-identical to that "
              f"family's mutant on the case (the case cannot tell the two bugs apart), {t['wrong_family']} are a family "
              "hypothesis (another family's variants change the same rows in the same direction, or the same elements, "
              "clearly more than "
              "the planted family's), the rest conform to another family's mutant within the allowance or are its "
              "closest.", ""] + _family_table(loo, loo=True) + [""]
    allp = [r for rows in planted.values() for r in rows]
    t = _totals(allp)
    lines += ["## (b) Every mutant on every legitimate precision variant", "",
              f"Overall ({len(planted)} variants x {len(allp) // max(len(planted), 1)} mutants): {_verdict_line(t)}.", "",
              "| variant | FAILs | named first | top 3 | another family first |", "|---|---|---|---|---|"]
    for name, rows in planted.items():
        tv = _totals(rows)
        lines.append(f"| {name} | {tv['fails']} | {_rate(tv['first'], tv['fails'])} | {_rate(tv['top3'], tv['fails'])} "
                     f"| {tv['wrong']} |")
    lines += ["", "Per family, over every variant:", ""] + _family_table(allp) + [""]
    misses = [(name, r) for name, rows in planted.items() for r in rows if r.get("fails") and r["first"] < r["fails"]]
    if misses:
        lines += ["Where a planted mutant was not named first (one example each):", ""]
        lines += [f"- {name} / {r['mutant']}: {r['first']}/{r['fails']}; {r['example'][0] if r['example'] else ''}"
                  for name, r in misses[:40]]
        lines += [f"- ... {len(misses) - 40} more" if len(misses) > 40 else ""]
    if torch_section is None:
        lines += ["## (c) The PyTorch example engine with each family's bug planted", "",
                  f"{torch_why.capitalize()}. Run `python tools/diagnosis_report.py` where torch is installed "
                  "(examples/torch_engine imports it) to fill this section.", ""]
    else:
        lines += [torch_section]
    lines += ["## No false accusation", ""] + _controls(args.vectors) + ["", *_out_of_family(args.vectors), ""]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out} ({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
