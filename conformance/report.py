"""Reports of a run: the console table, JSON and JUnit XML.

Every report names the implementation and (JSON) the environment the result
depends on: library versions, platform, the command line, and whatever the
implementation's ``environment()`` adds (the CUDA backend: compile options,
device, CUDA and CuPy versions), as Vulkan CTS logs do.

Reports cannot be lost: ``Reports`` checks the output paths (creating parent
directories) before the first case and rewrites each file atomically as results
arrive, marked ``"complete": false`` (JSON) and with a ``dflash.run/incomplete``
error test case (JUnit) until the run ends, so a run cut short (killed, out of
time, interrupted) leaves valid reports of what it did.

The JSON summary says so beside its counts, where a script that reads only the
counts cannot miss it: ``complete``, ``verdict`` (``verdict()``: INCOMPLETE,
BAD_VECTORS, FAILED, NOTHING_IMPLEMENTED, NO_CASES or PASSED; a CI gate passes on
PASSED only, or also on NOTHING_IMPLEMENTED), ``planned`` (the cases the run
selected) and ``NOT_RUN`` (those of them it never ran: not reported before the
run stopped, or reported as an ERROR "not run: ..." when ``--deadline`` passed;
None where the number planned is not known).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import platform
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from importlib import metadata
from pathlib import Path

from conformance.compare import CaseResult, Result
from conformance.vectors import InputError

COLUMNS = (Result.PASS, Result.ACCEPTABLE, Result.FAIL, Result.ERROR, Result.NOT_IMPLEMENTED)
ACCEPTABLE_FLAGS = ("precision", "ambiguous")


NOT_RUN_PREFIX = "not run:"  # the detail of a case the run skipped (runner.run_suite, --deadline)
BAD_VECTOR_PREFIX = "bad vector file:"  # the detail of a case whose vector file is broken (runner.run_suite)


def expectation(r) -> str | None:
    return getattr(r, "expected_failure", None)


def not_run(results, planned: int | None) -> int | None:
    """Cases planned but never run: not reported at all, or reported as not run (--deadline)."""
    if planned is None:
        return None
    return max(0, planned - len(results)) + sum(r.detail.startswith(NOT_RUN_PREFIX) for r in results)


def bad_vectors(results) -> int:
    """Cases whose vector file could not be used (broken suite data: exit status 3)."""
    return sum(r.detail.startswith(BAD_VECTOR_PREFIX) for r in results)


def verdict(results, strict: bool = False, complete: bool = True) -> str:
    """The run's verdict in one word (JSON summary; the console's last line says it too)."""
    if not complete:
        return "INCOMPLETE"
    if bad_vectors(results):
        return "BAD_VECTORS"
    if failed(results, strict):
        return "FAILED"
    if results and all(r.result == Result.NOT_IMPLEMENTED for r in results):
        return "NOTHING_IMPLEMENTED"
    if not results:
        return "NO_CASES"
    return "PASSED"


def failed(results: list[CaseResult], strict: bool = False) -> bool:
    """Whether the run fails: a FAIL or ERROR that no expectation names; with ``strict``
    also an ACCEPTABLE or an expected failure that now passes."""
    for r in results:
        if r.result.failed and not expectation(r):
            return True
        if strict and (r.result == Result.ACCEPTABLE or (expectation(r) and not r.result.failed
                                                         and r.result != Result.NOT_IMPLEMENTED)):
            return True
    return False


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


def environment(impl=None, command: str | None = None, extra: dict | None = None) -> dict:
    """The run's environment; ``impl.environment()`` (in-process) or ``extra`` (from a worker)
    adds to it, made JSON-safe (bytes decoded, other values as text)."""
    from conformance.invoke import InProcess, jsonable_env

    env = {"python": sys.version.split()[0], "platform": platform.platform(), "command": command or " ".join(sys.argv),
           "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    for dist in ("numpy", "ml_dtypes", "safetensors", "dflash-conformance"):
        env[dist] = _version(dist)
    if impl is not None:
        env.update(InProcess(impl).environment())
    if extra:
        env.update(jsonable_env(extra))
    return env


def _number(x):
    """JSON has no inf/NaN: such values are written as strings."""
    if x is None:
        return None
    try:
        x = float(x)
    except (TypeError, ValueError):
        return str(x)
    return x if math.isfinite(x) else str(x)


def acceptable_by_flag(results) -> dict[str, int]:
    """ACCEPTABLE cases counted by flag (a case with both flags counts under each)."""
    counts = Counter()
    for r in results:
        if r.result == Result.ACCEPTABLE:
            for f in getattr(r, "acceptable_flags", ()) or ("unflagged",):
                counts[f] += 1
    return {f: counts[f] for f in (*ACCEPTABLE_FLAGS, *sorted(set(counts) - set(ACCEPTABLE_FLAGS))) if counts[f]}


def acceptable_text(results) -> str:
    n = sum(r.result == Result.ACCEPTABLE for r in results)
    flags = acceptable_by_flag(results)
    return f"{n} ({', '.join(f'{k} {v}' for k, v in flags.items())})" if flags else str(n)


def totals_parts(results) -> list[str]:
    """"306 PASS", "3 ACCEPTABLE (precision 2, ambiguous 1)", ..."""
    parts = []
    for res in COLUMNS:
        n = sum(r.result == res for r in results)
        flags = acceptable_by_flag(results) if res == Result.ACCEPTABLE else {}
        parts.append(f"{n} {res.name}" + (f" ({', '.join(f'{k} {v}' for k, v in flags.items())})" if flags else ""))
    return parts


def worst_frac(results, key: str):
    vals = [getattr(r, key, None) for r in results]
    vals = [float(v) for v in vals if v is not None]
    return max(vals) if vals else None


def _frac(x) -> str:
    return "-" if x is None else f"{x:.3g}"


def case_record(r) -> dict:
    rec = {"op": r.op, "case": r.case, "result": r.result.name, "detail": r.detail, "flags": list(r.flags),
           "acceptable_flags": list(getattr(r, "acceptable_flags", ()) or ()),
           "worst_ulp": _number(r.worst_ulp), "ulp_bound": _number(r.ulp_bound),
           "worst_norm": _number(r.worst_norm), "norm_bound": _number(r.norm_bound),
           "tight_frac": _number(getattr(r, "tight_frac", None)),
           "envelope_frac": _number(getattr(r, "envelope_frac", None)),
           "seconds": round(float(r.seconds or 0.0), 6)}
    for key in ("trace", "output", "expected_failure", "rerun"):
        if getattr(r, key, None):
            rec["traceback" if key == "trace" else key] = getattr(r, key)
    if getattr(r, "diagnosis_note", ""):  # diagnose: catalog pitfalls reproducing a FAIL, best first
        rec["diagnosis"] = {"note": r.diagnosis_note, "matches": list(getattr(r, "diagnosis", []) or []),
                            "hypotheses": list(getattr(getattr(r, "diagnosis", None), "hypotheses", []) or [])}
    return rec


def record_result(rec: dict) -> CaseResult:
    """case_record's inverse (a part's report read back: dflash-conformance geometry --jobs): the
    CaseResult fields, and the traceback, output, expected failure and rerun line where recorded.
    Numbers written as text (inf, nan) read back as floats."""
    def num(key):
        v = rec.get(key)
        return None if v is None else float(v)

    r = CaseResult(op=rec["op"], case=rec["case"], result=Result[rec["result"]], detail=rec.get("detail", ""),
                   flags=tuple(rec.get("flags", ())), worst_ulp=num("worst_ulp"), ulp_bound=num("ulp_bound"),
                   worst_norm=num("worst_norm"), norm_bound=num("norm_bound"), seconds=float(rec.get("seconds", 0.0)),
                   acceptable_flags=tuple(rec.get("acceptable_flags", ())), tight_frac=num("tight_frac"),
                   envelope_frac=num("envelope_frac"))
    for key, attr in (("traceback", "trace"), ("output", "output"), ("expected_failure", "expected_failure"),
                      ("rerun", "rerun")):
        if rec.get(key):
            setattr(r, attr, rec[key])
    return r


def summary(results, complete: bool = True, planned: int | None = None, strict: bool = False) -> dict:
    body = {"verdict": verdict(results, strict, complete), "complete": complete, "planned": planned,
            "reported": len(results), "NOT_RUN": not_run(results, planned)}
    body.update({res.name: sum(r.result == res for r in results) for res in Result})
    body["bad_vector_files"] = bad_vectors(results)
    body["acceptable_by_flag"] = acceptable_by_flag(results)
    body["expected_failures"] = sum(bool(expectation(r)) and r.result.failed for r in results)
    body["unexpected_passes"] = sum(bool(expectation(r)) and r.result in (Result.PASS, Result.ACCEPTABLE)
                                    for r in results)
    from conformance.diagnose import summary as diagnosis_summary

    body["diagnosis"] = [{"pitfall": p, "failing_cases": n} for p, n in diagnosis_summary(results)]
    body["ops"] = {op: {**{res.name: sum(r.result == res for r in rs) for res in COLUMNS},
                        "acceptable_by_flag": acceptable_by_flag(rs),
                        "worst_tight_frac": _number(worst_frac(rs, "tight_frac")),
                        "worst_envelope_frac": _number(worst_frac(rs, "envelope_frac"))}
                   for op, rs in by_op(results).items()}
    return body


def _atomic_write(path: Path, data: bytes) -> None:
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=str(path.parent))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def json_bytes(results, implementation: str, env: dict, vectors_dir, manifest: dict, manifest_sha256: str,
               complete: bool = True, run: dict | None = None, planned: int | None = None,
               strict: bool = False) -> bytes:
    """The JSON report. ``planned``: the cases the run selected (None: not known; where the run
    completed, the cases reported)."""
    if planned is None and complete:
        planned = len(results)
    body = {
        "implementation": implementation,
        "complete": complete,
        "environment": env,
        "vectors": {"dir": str(vectors_dir), "manifest_sha256": manifest_sha256,
                    "generator_version": manifest.get("generator_version"),
                    "contract_version": manifest.get("contract_version")},
        "run": run or {},
        "summary": summary(results, complete, planned, strict),
        "results": [case_record(r) for r in results],
    }
    return (json.dumps(body, indent=1, default=str) + "\n").encode()


def write_json(path: Path, results: list[CaseResult], implementation: str, env: dict, vectors_dir: Path,
               manifest: dict, manifest_sha256: str, complete: bool = True, run: dict | None = None,
               planned: int | None = None, strict: bool = False) -> None:
    _atomic_write(Path(path), json_bytes(results, implementation, env, vectors_dir, manifest, manifest_sha256,
                                         complete, run, planned, strict))


def _xml_text(s: str) -> str:
    """XML 1.0 cannot hold most control characters: such characters become U+FFFD."""
    return "".join(c if c in "\t\n\r" or " " <= c <= "\ud7ff" or "\ue000" <= c <= "\ufffd"
                   or "\U00010000" <= c <= "\U0010ffff" else "\ufffd" for c in str(s))


def junit_bytes(results, implementation: str, complete: bool = True, strict: bool = False,
                total: int | None = None) -> bytes:
    """One <testsuite> per Op, one <testcase classname="dflash.<op>" name="<case id>"> per case; a
    diagnosed FAIL carries its ranked hypotheses as properties and in the failure text."""
    from conformance.diagnose import finalize

    finalize(results)  # the run-level ranking and symptoms
    root = ET.Element("testsuites", name="dflash-conformance")
    totals = defaultdict(int)
    groups = by_op(results)
    if not complete:
        groups["run"] = []
    for op, rs in groups.items():
        exp = [r for r in rs if expectation(r) and r.result.failed]
        xpass = [r for r in rs if strict and expectation(r) and r.result in (Result.PASS, Result.ACCEPTABLE)]
        counts = {"tests": len(rs), "failures": sum(r.result == Result.FAIL and r not in exp for r in rs) + len(xpass),
                  "errors": sum(r.result == Result.ERROR and r not in exp for r in rs),
                  "skipped": sum(r.result == Result.NOT_IMPLEMENTED for r in rs) + len(exp)}
        if op == "run" and not complete:
            counts = {"tests": 1, "failures": 0, "errors": 1, "skipped": 0}
        suite = ET.SubElement(root, "testsuite", name=op, time=f"{sum(float(r.seconds or 0) for r in rs):.3f}",
                              **{k: str(v) for k, v in counts.items()})
        props = ET.SubElement(suite, "properties")
        ET.SubElement(props, "property", name="implementation", value=_xml_text(implementation))
        if op == "run" and not complete:
            case = ET.SubElement(suite, "testcase", classname="dflash.run", name="incomplete", time="0")
            missing = not_run(results, total)
            msg = (f"the run did not finish: {missing} of {total} case(s) not run" if missing is not None else
                   f"the run did not finish: {len(results)} case(s) reported")
            ET.SubElement(case, "error", message=msg, type="INCOMPLETE").text = msg
        for r in rs:
            case = ET.SubElement(suite, "testcase", classname=f"dflash.{op}", name=_xml_text(r.case),
                                 time=f"{float(r.seconds or 0):.3f}")
            detail = _xml_text(r.detail)
            long = detail + (f"\n\n{_xml_text(r.trace)}" if getattr(r, "trace", "") else "")
            rerun = getattr(r, "rerun", "")
            if rerun:
                long += f"\n\nrerun: {rerun}"
            if getattr(r, "diagnosis_note", "") and r.result == Result.FAIL:  # diagnose: the likely bug first
                detail = _xml_text(f"{r.detail} | {r.diagnosis_note}")
                long = detail + long[len(_xml_text(r.detail)):]
                hyps = list(getattr(getattr(r, "diagnosis", None), "hypotheses", []) or [])
                if hyps:
                    props = ET.SubElement(case, "properties")
                    for i, h in enumerate(hyps, 1):
                        ET.SubElement(props, "property", name=f"hypothesis.{i}", value=_xml_text(
                            f"[{h['kind']}, confidence {h['confidence']:.2f}] {h['text']} -- {h['evidence']}"))
                    long += "\n\nhypotheses:\n" + "\n".join(
                        _xml_text(f"{i}. [{h['kind']}, confidence {h['confidence']:.2f}] {h['text']} -- {h['evidence']}")
                        for i, h in enumerate(hyps, 1))
            if r in exp:
                ET.SubElement(case, "skipped", message=_xml_text(f"expected {r.result.name}: {expectation(r)}")
                              ).text = long
            elif r in xpass:
                ET.SubElement(case, "failure", message=_xml_text(f"expected to fail ({expectation(r)}) but "
                                                                 f"{r.result.name}"), type="XPASS").text = long
            elif r.result == Result.FAIL:
                ET.SubElement(case, "failure", message=detail, type="FAIL").text = long
            elif r.result == Result.ERROR:
                ET.SubElement(case, "error", message=detail, type="ERROR").text = long
            elif r.result == Result.NOT_IMPLEMENTED:
                ET.SubElement(case, "skipped", message=detail or "NOT_IMPLEMENTED")
            elif r.result == Result.ACCEPTABLE:
                flags = ", ".join(getattr(r, "acceptable_flags", ()) or ())
                ET.SubElement(case, "system-out").text = f"ACCEPTABLE{f' ({flags})' if flags else ''}: {detail}"
            if getattr(r, "output", ""):
                ET.SubElement(case, "system-err").text = _xml_text(r.output)
        for k, v in counts.items():
            totals[k] += v
    for k, v in totals.items():
        root.set(k, str(v))
    return ET.tostring(root, encoding="utf-8", xml_declaration=True)


def write_junit(path: Path, results: list[CaseResult], implementation: str, complete: bool = True,
                strict: bool = False, total: int | None = None) -> None:
    _atomic_write(Path(path), junit_bytes(results, implementation, complete, strict, total))


class Reports:
    """The JSON and JUnit reports of one run, written as results arrive.

    ``check()`` creates the parent directories and writes the (empty, incomplete)
    reports before the first case: a path that cannot be written is bad input,
    found before any time is spent. ``add(result)`` rewrites them (at most every
    ``interval`` seconds, and at once for a FAIL or ERROR); ``close(complete)``
    writes them a last time."""

    def __init__(self, json_path=None, junit_path=None, implementation: str = "", env: dict | None = None,
                 vectors_dir="", manifest: dict | None = None, manifest_sha256: str = "", total: int = 0,
                 run: dict | None = None, strict: bool = False, interval: float = 0.5):
        self.json_path = Path(json_path) if json_path else None
        self.junit_path = Path(junit_path) if junit_path else None
        self.implementation, self.env = implementation, env or {}
        self.vectors_dir, self.manifest, self.sha = vectors_dir, manifest or {}, manifest_sha256
        self.total, self.run, self.strict, self.interval = total, run or {}, strict, interval
        self.results: list = []
        self._last = 0.0
        self._dirty = False
        self._lock = threading.RLock()
        self._closed = threading.Event()
        self._thread = None

    def check(self) -> None:
        for opt, path in (("--json", self.json_path), ("--junit", self.junit_path)):
            if path is None:
                continue
            if path.is_dir():
                raise InputError(f"{opt}: {path} is a directory")
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise InputError(f"{opt}: cannot create the directory {path.parent}: {exc.strerror or exc}") from None
        for opt, path, write in (("--json", self.json_path, self._json), ("--junit", self.junit_path, self._junit)):
            if path is not None:
                try:
                    write(False)
                except OSError as exc:
                    raise InputError(f"{opt}: cannot write {path}: {exc.strerror or exc}") from None

    def _json(self, complete: bool) -> None:
        self.run["cases_reported"] = len(self.results)
        self.run["cases_selected"] = self.total
        write_json(self.json_path, self.results, self.implementation, self.env, self.vectors_dir, self.manifest,
                   self.sha, complete, self.run, self.total, self.strict)

    def _junit(self, complete: bool) -> None:
        write_junit(self.junit_path, self.results, self.implementation, complete, self.strict, self.total)

    def write(self, complete: bool) -> None:
        with self._lock:
            self._dirty = False
            if self.json_path:
                self._json(complete)
            if self.junit_path:
                self._junit(complete)
            self._last = time.monotonic()

    def add(self, result) -> None:
        with self._lock:
            self.results.append(result)
            self._dirty = True
            if result.result.failed or time.monotonic() - self._last >= self.interval:
                self.write(False)
        if self._thread is None and (self.json_path or self.junit_path):
            # results that arrive just before a long case reach the disk while it runs
            self._thread = threading.Thread(target=self._flusher, daemon=True)
            self._thread.start()

    def _flusher(self) -> None:
        while not self._closed.wait(self.interval):
            with self._lock:
                if self._dirty and not self._closed.is_set():
                    try:
                        self.write(False)
                    except OSError:
                        pass  # the last write (close) reports it

    def close(self, complete: bool) -> None:
        self._closed.set()
        with self._lock:
            self.write(complete)


# ----------------------------------------------------------------------------- console

def failure_line(r, rerun: str | None = None) -> str:
    text = f"{r.result.name} {r.case}: {r.detail}"
    if expectation(r):
        text = f"{r.result.name} (expected: {expectation(r)}) {r.case}: {r.detail}"
    if getattr(r, "diagnosis_note", ""):
        text = f"{text} | {r.diagnosis_note}"
    rerun = rerun or getattr(r, "rerun", "")
    return f"{text} | rerun: {rerun}" if rerun else text


def grouped_failures(results, per_detail: int = 3, limit: int = 60) -> list[str]:
    """One line per FAIL/ERROR; a detail shared by more than ``per_detail`` cases (an
    implementation that cannot start, a deadline) is shown ``per_detail`` times and then counted."""
    seen = Counter()
    lines, hidden = [], Counter()
    for r in results:
        if not r.result.failed:
            continue
        key = (r.result, r.detail)
        seen[key] += 1
        if seen[key] > per_detail or len(lines) >= limit:
            hidden[key] += 1
            continue
        lines.append(failure_line(r))
    for (res, detail), n in hidden.items():
        if seen[(res, detail)] > per_detail:
            lines.append(f"... and {n} more {res.name} with the same detail: {detail}")
    rest = sum(n for (res, detail), n in hidden.items() if seen[(res, detail)] <= per_detail)
    if rest:
        lines.append(f"... and {rest} more FAIL/ERROR line(s): see the JSON or JUnit report")
    return lines


def print_table(results: list[CaseResult], implementation: str, console, failures: bool = True,
                strict: bool = False, notes: list[str] | None = None, complete: bool = True) -> None:
    """Failing cases (grouped, one line each; ``failures=False`` where they were printed as they
    happened), then the per-Op table, then the totals line (last), which starts with ``verdict()``."""
    from rich.table import Table

    if failures:
        for line in grouped_failures(results):
            console.print(line, highlight=False, soft_wrap=True, markup=False, style="bold red")
    table = Table(title=f"dflash-conformance: {implementation}")
    table.add_column("Op")
    table.add_column("cases", justify="right")
    for res in COLUMNS:
        table.add_column(res.name if res != Result.NOT_IMPLEMENTED else "NOT_IMPL", justify="right")
    table.add_column("worst ULP (bound)", justify="right")
    table.add_column("worst normwise (bound)", justify="right")
    table.add_column("worst/tight", justify="right")
    table.add_column("worst/envelope", justify="right")
    for op, rs in by_op(results).items():
        rep = [r for r in rs if r.worst_ulp is not None]
        u = max(rep, key=lambda r: r.worst_ulp, default=None)
        n = max(rep, key=lambda r: r.worst_norm if r.worst_norm is not None else -1, default=None)
        counts = [acceptable_text(rs) if res == Result.ACCEPTABLE else str(sum(r.result == res for r in rs))
                  for res in COLUMNS]
        style = "red" if failed(rs, strict) else None
        table.add_row(op, str(len(rs)), *counts, _fmt(u and u.worst_ulp, u and u.ulp_bound),
                      _fmt(n and n.worst_norm, n and n.norm_bound), _frac(worst_frac(rs, "tight_frac")),
                      _frac(worst_frac(rs, "envelope_frac")), style=style)
    console.print(table)
    for line in notes or ():
        console.print(line, highlight=False, soft_wrap=True, markup=False)
    total = ", ".join(totals_parts(results))
    word = verdict(results, strict, complete)
    colour = {"PASSED": "green", "NOTHING_IMPLEMENTED": "yellow", "NO_CASES": "yellow"}.get(word, "red")
    shown = f"[bold {colour}]{word.replace('_', ' ')}[/]"
    console.print(f"{shown}: {len(results)} cases: {_escape(total)}; implementation: {_escape(implementation)}",
                  highlight=False, soft_wrap=True)


def _escape(s: str) -> str:
    from rich.markup import escape

    return escape(str(s))


def _fmt(x, bound) -> str:
    if x is None:
        return "-"
    return f"{x:.3g} (≤ {bound:.3g})" if bound is not None else f"{x:.3g}"
