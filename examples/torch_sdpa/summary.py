"""One table over several `dflash-conformance run --json` reports (examples/third_party_check.sh).

    python3 -m examples.torch_sdpa.summary OUT/sdpa_math.json OUT/flashinfer.json ...

One row per implementation and Op: the verdict counts (PASS, ACCEPTABLE, FAIL, ERROR, NOT_IMPL),
the worst error as a fraction of the accuracy envelope, and the first FAIL or ERROR detail line of
that Op (with the pitfalls the diagnosis names). Each report's implementation, verdict and
environment (library versions, the SDPA backend, what FlashInfer JIT-compiled) head its rows. A
report that is missing or unreadable (a run that never started or was killed before writing) is
listed as such, so the table always names every run it was given.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

COLUMNS = ("PASS", "ACCEPTABLE", "FAIL", "ERROR", "NOT_IMPLEMENTED")
HEAD = ("implementation", "Op", "cases", "PASS", "ACCEPT", "FAIL", "ERROR", "NOT_IMPL", "worst/env",
        "first FAIL/ERROR")
ENV_KEYS = ("library", "sdpa_backend", "torch", "flashinfer", "cuda", "cudnn", "gpu", "head_norm", "jit_compiled")
DETAIL_WIDTH = 200


def first_failure(results: list, op: str) -> str:
    for r in results:
        if r.get("op") == op and r.get("result") in ("FAIL", "ERROR"):
            detail = " ".join(str(r.get("detail", "")).split())
            matches = (r.get("diagnosis") or {}).get("matches") or []
            named = f" [diagnosis: {', '.join(str(m) for m in matches[:3])}]" if matches else ""
            text = f"{r['result']} {r.get('case', '?').split('/', 1)[-1]}{named}: {detail}"
            return text if len(text) <= DETAIL_WIDTH else text[:DETAIL_WIDTH - 3] + "..."
    return ""


def frac(x) -> str:
    if x is None:
        return "-"
    try:
        return f"{float(x):.3g}"
    except (TypeError, ValueError):
        return str(x)


def report_rows(path: Path) -> tuple[list[str], list[tuple]]:
    """(header lines, table rows) for one JSON report."""
    label = path.stem
    try:
        report = json.loads(path.read_text())
        summary = report["summary"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return [f"{label}: no readable report ({type(exc).__name__}: {exc})"], [(label, "-", "-") + ("-",) * 7]
    env = report.get("environment") or {}
    env_text = ", ".join(f"{k} {env[k]}" for k in ENV_KEYS if k in env and env[k] not in (None, ""))
    complete = "complete" if report.get("complete", summary.get("complete")) else "INCOMPLETE"
    head = [(f"{label}: {report.get('implementation', '?')}: verdict {summary.get('verdict')}, {complete}, "
             f"{summary.get('reported')} of {summary.get('planned')} cases reported")]
    if env_text:
        head.append(f"    {env_text}")
    if env.get("environment_error"):
        head.append(f"    environment_error {env['environment_error']}")
    results = report.get("results") or []
    rows = []
    for op, counts in (summary.get("ops") or {}).items():
        n = sum(int(counts.get(c, 0)) for c in COLUMNS)
        rows.append((label, op, str(n)) + tuple(str(counts.get(c, 0)) for c in COLUMNS)
                    + (frac(counts.get("worst_envelope_frac")), first_failure(results, op)))
    if not rows:
        rows.append((label, "-", "0") + ("0",) * 5 + ("-", "no case reported"))
    return head, rows


def render(paths) -> str:
    heads, rows = [], []
    for p in paths:
        h, r = report_rows(Path(p))
        heads += h
        rows += r
    widths = [max(len(HEAD[i]), *(len(row[i]) for row in rows)) for i in range(len(HEAD) - 1)]
    lines = heads + [""]

    def fmt(row) -> str:
        return "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))) \
            + "  " + row[-1]

    lines.append(fmt(HEAD))
    lines.append("-" * (sum(widths) + 2 * len(widths) + len(HEAD[-1])))
    lines += [fmt(row) for row in rows]
    return "\n".join(lines)


def main(argv=None) -> int:
    paths = sys.argv[1:] if argv is None else argv
    if not paths:
        print("usage: python3 -m examples.torch_sdpa.summary REPORT.json [REPORT.json ...]", file=sys.stderr)
        return 2
    print(render(paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
