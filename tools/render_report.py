"""Render JSON reports of `dflash-conformance run` / `geometry` as one Markdown report.

    python tools/render_report.py OUT.md TITLE REPORT.json [REPORT.json ...]

Each JSON becomes a section: where it ran (implementation, date, command,
device, driver, CUDA, CuPy, NumPy, compile options) and a per-Op table of
result counts (ACCEPTABLE by flag), worst ULP error (with its bound), worst normwise
error, and the worst error as a fraction of the tight bound and of the accuracy envelope.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

CLASSES = ("PASS", "ACCEPTABLE", "FAIL", "ERROR", "NOT_IMPLEMENTED")
ENV_KEYS = ("date", "command", "device", "compute_capability", "nvidia_driver", "cuda_driver_version",
            "cuda_runtime_version", "nvrtc", "cupy", "cupy_tf32", "fp_conversion_path",
            "numpy", "ml_dtypes", "safetensors", "python", "platform", "nvrtc_options", "cupy_appends")


def _ratio(worst, bound) -> float:
    return worst / bound if worst is not None and bound else 0.0


def _count(rs, cls: str) -> str:
    """The count of a class; ACCEPTABLE with its flags ("3 (precision 2, ambiguous 1)")."""
    n = sum(r["result"] == cls for r in rs)
    if cls != "ACCEPTABLE":
        return str(n)
    flags = defaultdict(int)
    for r in rs:
        if r["result"] == cls:
            for f in r.get("acceptable_flags") or ["unflagged"]:
                flags[f] += 1
    return f"{n} ({', '.join(f'{k} {v}' for k, v in sorted(flags.items()))})" if flags else str(n)


def _worst(rs, key: str) -> str:
    """The largest per-case fraction (worst error / tight bound or / envelope); "-" when none."""
    vals = []
    for r in rs:
        v = r.get(key)
        try:
            vals.append(float(v))
        except (TypeError, ValueError):
            continue
    return f"{max(vals):.3g}" if vals else "-"


def section(report: dict, source: str) -> list[str]:
    env = report.get("environment", {})
    lines = [f"### {source}", "", f"- implementation: `{report.get('implementation')}`"]
    lines += [f"- {k}: `{env[k]}`" for k in ENV_KEYS if k in env]
    if report.get("complete") is False:
        lines.append("- **incomplete run**: the report was written before the run finished")
    vec = report.get("vectors", {})
    if vec:
        lines.append(f"- vectors: `{vec.get('dir')}` (manifest sha256 `{vec.get('manifest_sha256') or '-'}`)")
    lines += ["", "| Op | cases | " + " | ".join(CLASSES) + " | worst ULP (bound) | worst normwise (bound) "
              "| worst/tight | worst/envelope |",
              "|---|---:|" + "---:|" * len(CLASSES) + "---:|---:|---:|---:|"]
    ops = defaultdict(list)
    for r in report["results"]:
        ops[r["op"]].append(r)
    for op, rs in sorted(ops.items()):
        counts = [_count(rs, c) for c in CLASSES]
        u = max(rs, key=lambda r: _ratio(r.get("worst_ulp"), r.get("ulp_bound")))
        n = max(rs, key=lambda r: _ratio(r.get("worst_norm"), r.get("norm_bound")))
        ulp = f"{u['worst_ulp']:g} ({u['ulp_bound']:g})" if u.get("worst_ulp") is not None else "-"
        norm = f"{n['worst_norm']:.3g} ({n['norm_bound']:.3g})" if n.get("worst_norm") is not None else "-"
        lines.append(f"| {op} | {len(rs)} | " + " | ".join(map(str, counts)) + f" | {ulp} | {norm} | "
                     f"{_worst(rs, 'tight_frac')} | {_worst(rs, 'envelope_frac')} |")
    total = [_count(report["results"], c) for c in CLASSES]
    lines += ["", "Totals: " + ", ".join(f"{c} {t}" for c, t in zip(CLASSES, total)), ""]
    bad = [r for r in report["results"] if r["result"] in ("FAIL", "ERROR", "NOT_IMPLEMENTED")]
    lines += [f"- {r['result']} `{r['case']}`: {r['detail']}" for r in bad]
    return lines + ([""] if bad else [])


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    out, title, sources = Path(argv[0]), argv[1], argv[2:]
    lines = [f"# {title}", "", ("Worst ULP and normwise columns show the case closest to its bound "
             "(largest error/bound ratio); bounds are derived per case (CONTRACTS C2)."), ""]
    for src in sources:
        lines += section(json.loads(Path(src).read_text()), Path(src).name)
    out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
