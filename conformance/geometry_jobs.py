"""``dflash-conformance geometry --jobs N``: the full-geometry run as N processes at once.

The float64 reference of a full-geometry case takes minutes and runs mostly on one core, so the
run (22 cases at the default B and W) is split into independent parts (``geometry.parts``: one per
geometry where N is at most the number of geometries, else one per geometry and (B, W) proposal
path) and each part runs as its own ``dflash-conformance geometry``
process, at most N at a time, with N-th of the cores for its BLAS threads (unless the caller set
OMP_NUM_THREADS / OPENBLAS_NUM_THREADS / MKL_NUM_THREADS). A part draws the same seeded weights
as a single run, so the cases and their bytes are the same. Each part's lines are printed as they
come, prefixed with the part; its JSON report is read back and the reports are merged, in the
single run's order, into one result list (the table, the exit status and ``--json``).

Nothing is passed silently: a part that exits without a complete report adds an ERROR naming the
part, its exit status and its last line of output.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from conformance import report
from conformance.compare import CaseResult, Result

BLAS_THREADS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def label(part: dict) -> str:
    b = "" if part["batches"] is None else \
        f" B{','.join(map(str, part['batches']))} W{','.join(map(str, part['widths']))}"
    return f"{part['geometry']}{b}"


def part_argv(part: dict, *, impl: str | None, context: int, reduced: bool, json_path: Path,
              reference_backend: str = "numpy") -> list[str]:
    """The dflash-conformance arguments of one part."""
    argv = ["geometry", "--part", "--geometry", part["geometry"], "--context", str(context), "--ops", *part["ops"],
            "--json", str(json_path)]
    if part["batches"] is not None:
        argv += ["--batch", *map(str, part["batches"]), "--width", *map(str, part["widths"])]
    if impl:
        argv += ["--impl", impl]
    if reduced:
        argv.append("--reduced")
    if reference_backend != "numpy":
        argv += ["--reference-backend", reference_backend]
    return argv


def _env(jobs: int) -> dict:
    env = dict(os.environ)
    threads = str(max(1, (os.cpu_count() or 1) // jobs))
    for key in BLAS_THREADS:
        env.setdefault(key, threads)
    return env


def _read(json_path: Path) -> dict:
    """A part's JSON report ({} where there is none or it does not parse)."""
    try:
        return json.loads(json_path.read_text())
    except (OSError, ValueError):
        return {}


def run(parts: list[dict], jobs: int, *, impl: str | None, context: int, reduced: bool,
        log=print, reference_backend: str = "numpy") -> tuple[list[CaseResult], str | None, dict]:
    """Run the parts, at most ``jobs`` at once; (the merged results in part order, the implementation's
    name and the first part's environment record, as the parts reported them)."""
    child_env = _env(jobs)
    lock = threading.Lock()
    outcome: dict[int, tuple[int, str]] = {}
    procs: list[subprocess.Popen] = []

    def one(i: int, part: dict, json_path: Path) -> None:
        cmd = [sys.executable, "-m", "conformance.cli",
               *part_argv(part, impl=impl, context=context, reduced=reduced, json_path=json_path,
                         reference_backend=reference_backend)]
        tag = f"[{label(part)}] "
        last = ""
        try:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=child_env,
                                    bufsize=1)
        except OSError as exc:  # reported as the part's ERROR below
            outcome[i] = (-1, f"cannot start {sys.executable}: {exc}")
            return
        procs.append(proc)
        for line in proc.stdout:  # the part prints no table (--part): the merged one comes at the end
            line = line.rstrip("\n")
            if line.strip():
                last = line
            with lock:
                log(tag + line)
        outcome[i] = (proc.wait(), last)

    with tempfile.TemporaryDirectory(prefix="dflash-geometry-") as tmp:
        paths = [Path(tmp) / f"part{i}.json" for i in range(len(parts))]
        pool = ThreadPoolExecutor(max_workers=max(1, jobs))
        try:
            for future in [pool.submit(one, i, part, paths[i]) for i, part in enumerate(parts)]:
                future.result()
        except BaseException:  # interrupted: no part outlives the run
            pool.shutdown(wait=False, cancel_futures=True)
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
            raise
        pool.shutdown()
        results, name, env = [], None, {}
        for i, part in enumerate(parts):
            body = _read(paths[i])
            got = [report.record_result(r) for r in body.get("results", [])]
            results += got
            name = name or body.get("implementation")
            env = env or body.get("environment", {})
            status, last = outcome.get(i, (-1, ""))
            if not body.get("complete"):
                results.append(CaseResult(
                    op=part["ops"][0], case=f"geometry-part/{label(part).replace(' ', '_')}", result=Result.ERROR,
                    detail=f"part {label(part)} exited with status {status} without a complete report "
                           f"({len(got)} case(s) reported); its last line: {last[:200]}"))
    return results, name, env


def timed_run(jobs: int, limit: float, impl: str = "kernels_cu.fast:FastCudaBackend",
              extra: tuple[str, ...] = ("--reference-backend", "cupy"), log_path: str | None = None) -> dict:
    """The full-geometry run as a user runs it (``dflash-conformance geometry`` in a subprocess; by
    default both geometries, the fast mode, the CuPy float64 reference): wall seconds from start to
    report and the verdict counts (``benchmarks/gpu_bench.py --geometry``). A run cut short or
    without a complete report says so (``complete`` False), never reads as a pass. ``log_path``: where the
    run's output (every part's per-case lines and times) is written."""
    with tempfile.TemporaryDirectory() as tmp:
        report_path = os.path.join(tmp, "geometry.json")
        cmd = [sys.executable, "-m", "conformance.cli", "geometry", "--impl", impl, *extra, "--jobs", str(jobs),
               "--json", report_path]
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=limit)
            rc, text = proc.returncode, proc.stdout + proc.stderr
            tail = text.strip().splitlines()[-1:]
        except subprocess.TimeoutExpired as exc:
            rc, tail = None, [f"stopped after {limit:.0f} s"]
            text = "".join(x.decode(errors="replace") if isinstance(x, bytes) else (x or "")
                           for x in (exc.stdout, exc.stderr)) + tail[0] + "\n"
        if log_path:
            Path(log_path).write_text(text)
        seconds = time.perf_counter() - t0
        counts, complete = {}, False
        if os.path.exists(report_path):
            with open(report_path) as f:
                rep = json.load(f)
            complete = bool(rep.get("complete"))
            for case in rep.get("results", []):
                counts[case["result"]] = counts.get(case["result"], 0) + 1
    return {"command": " ".join(["dflash-conformance", *cmd[3:-2]]), "seconds": seconds, "exit_status": rc,
            "complete": complete, "verdicts": counts, "last_line": tail[0] if tail else ""}
