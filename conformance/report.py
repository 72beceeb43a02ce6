"""Reports of a run: the console table, JSON and JUnit XML.

Every report names the implementation and (JSON) the environment the result
depends on: library versions, platform, the command line, and whatever the
implementation's ``environment()`` adds (the CUDA backend: compile options,
device, CUDA and CuPy versions), as Vulkan CTS logs do.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import platform
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from importlib import metadata
from pathlib import Path

from conformance.compare import CaseResult, Result

COLUMNS = (Result.PASS, Result.ACCEPTABLE, Result.FAIL, Result.ERROR, Result.NOT_IMPLEMENTED)


def failed(results: list[CaseResult]) -> bool:
    return any(r.result.failed for r in results)


def by_op(results: list[CaseResult]) -> dict[str, list[CaseResult]]:
    groups = defaultdict(list)
    for r in results:
        groups[r.op].append(r)
    return dict(sorted(groups.items()))


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def environment(impl=None, command: str | None = None) -> dict:
    env = {"python": sys.version.split()[0], "platform": platform.platform(), "command": command or " ".join(sys.argv),
           "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    for dist in ("numpy", "ml_dtypes", "safetensors", "dflash-conformance"):
        env[dist] = _version(dist)
    extra = getattr(impl, "environment", None)
    if callable(extra):
        try:
            env.update(extra())
        except Exception as exc:  # noqa: BLE001 - a broken environment() must not lose the results
            env["environment_error"] = f"{type(exc).__name__}: {exc}"
    return env


def _number(x):
    """JSON has no inf/NaN: such values are written as strings."""
    if x is None or math.isfinite(x):
        return x
    return str(x)


def write_json(path: Path, results: list[CaseResult], implementation: str, env: dict, vectors_dir: Path,
               manifest: dict, manifest_sha256: str) -> None:
    body = {
        "implementation": implementation,
        "environment": env,
        "vectors": {"dir": str(vectors_dir), "manifest_sha256": manifest_sha256,
                    "generator_version": manifest.get("generator_version"),
                    "contract_version": manifest.get("contract_version")},
        "summary": {res.name: sum(r.result == res for r in results) for res in Result},
        "results": [{"op": r.op, "case": r.case, "result": r.result.name, "detail": r.detail, "flags": list(r.flags),
                     "worst_ulp": _number(r.worst_ulp), "ulp_bound": _number(r.ulp_bound),
                     "worst_norm": _number(r.worst_norm), "norm_bound": _number(r.norm_bound),
                     "seconds": round(r.seconds, 6)} for r in results],
    }
    Path(path).write_text(json.dumps(body, indent=1) + "\n")


def write_junit(path: Path, results: list[CaseResult], implementation: str) -> None:
    """One <testsuite> per Op, one <testcase classname="dflash.<op>" name="<case id>"> per case."""
    root = ET.Element("testsuites", name="dflash-conformance")
    totals = defaultdict(int)
    for op, rs in by_op(results).items():
        counts = {"tests": len(rs), "failures": sum(r.result == Result.FAIL for r in rs),
                  "errors": sum(r.result == Result.ERROR for r in rs),
                  "skipped": sum(r.result == Result.NOT_IMPLEMENTED for r in rs)}
        suite = ET.SubElement(root, "testsuite", name=op, time=f"{sum(r.seconds for r in rs):.3f}",
                              **{k: str(v) for k, v in counts.items()})
        props = ET.SubElement(suite, "properties")
        ET.SubElement(props, "property", name="implementation", value=implementation)
        for r in rs:
            case = ET.SubElement(suite, "testcase", classname=f"dflash.{op}", name=r.case, time=f"{r.seconds:.3f}")
            if r.result == Result.FAIL:
                ET.SubElement(case, "failure", message=r.detail, type="FAIL").text = r.detail
            elif r.result == Result.ERROR:
                ET.SubElement(case, "error", message=r.detail, type="ERROR").text = r.detail
            elif r.result == Result.NOT_IMPLEMENTED:
                ET.SubElement(case, "skipped", message=r.detail or "NOT_IMPLEMENTED")
            elif r.result == Result.ACCEPTABLE:
                ET.SubElement(case, "system-out").text = f"ACCEPTABLE: {r.detail}"
        for k, v in counts.items():
            totals[k] += v
    for k, v in totals.items():
        root.set(k, str(v))
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)


def _fmt(x, bound) -> str:
    if x is None:
        return "-"
    return f"{x:.3g} (≤ {bound:.3g})" if bound is not None else f"{x:.3g}"


def print_table(results: list[CaseResult], implementation: str, console) -> None:
    """Failing cases one line each, then the per-Op table, then the totals line (last)."""
    from rich.table import Table

    for r in results:
        if r.result.failed:
            console.print(f"[bold red]{r.result.name}[/] {r.case}: {r.detail}", highlight=False, soft_wrap=True)
    table = Table(title=f"dflash-conformance: {implementation}")
    table.add_column("Op")
    table.add_column("cases", justify="right")
    for res in COLUMNS:
        table.add_column(res.name if res != Result.NOT_IMPLEMENTED else "NOT_IMPL", justify="right")
    table.add_column("worst ULP (bound)", justify="right")
    table.add_column("worst normwise (bound)", justify="right")
    for op, rs in by_op(results).items():
        rep = [r for r in rs if r.worst_ulp is not None]
        u = max(rep, key=lambda r: r.worst_ulp, default=None)
        n = max(rep, key=lambda r: r.worst_norm, default=None)
        counts = [str(sum(r.result == res for r in rs)) for res in COLUMNS]
        style = "red" if any(r.result.failed for r in rs) else None
        table.add_row(op, str(len(rs)), *counts, _fmt(u and u.worst_ulp, u and u.ulp_bound),
                      _fmt(n and n.worst_norm, n and n.norm_bound), style=style)
    console.print(table)
    total = ", ".join(f"{sum(r.result == res for r in results)} {res.name}" for res in COLUMNS)
    if failed(results):
        verdict = "[bold red]FAILED[/]"
    elif all(r.result == Result.NOT_IMPLEMENTED for r in results):
        verdict = "[bold yellow]NOTHING IMPLEMENTED[/]"
    else:
        verdict = "[bold green]PASSED[/]"
    console.print(f"{verdict}: {len(results)} cases: {total}; implementation: {implementation}", highlight=False)
