"""Property-based conformance: ``dflash-conformance fuzz``.

The golden vectors are a fixed sample. ``fuzz`` draws cases from the whole parameter space of
every Op with hypothesis strategies, runs each through the same path as a vector (the float64
reference and the bounds derived from the float32 baseline: ``generate.case_vector``; the
implementation called and judged by ``runner.run_case``, C2 v2), and when an example FAILs (or
ERRORs) lets hypothesis shrink it to a minimal one, which is saved as a vector file (flag
``fuzz``) that ``dflash-conformance run --vectors DIR`` replays.

Strategies (``conformance.strategies``: ``STRATEGIES``, one module per Op) draw *parameters*
(shapes, head counts, positions, seeds, temperatures, filters, layouts and the pitfall designs of
the case generators), and build each example with the case generators' own building blocks
(``conformance/cases/<op>.py``: ``make``, ``_designed``, ``_planted`` ...). The data inside an example comes from
``registry.case_rng(case id)``, and the case id is a function of the drawn parameters: the
same parameters give the same bytes, and the same ``--seed`` the same run.

A shrunk failure names the parameters that trigger it: those that differ from the strategy's
simplest example (``minimal``), since hypothesis has shrunk every other one back to it.

Every strategy is bounded so that one example stays well under a few hundred milliseconds on
the float64 reference (widths up to 16, batches up to 4, vocabularies up to a few hundred rows).
"""

from __future__ import annotations

import fnmatch
import json
import random
import time
import zlib
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from conformance import vectors
from conformance.registry import Case
from conformance.strategies import FLAG, MISSING, STRATEGIES, Reject, Strategy, case_id, strategy

try:  # hypothesis is in the `test` extra; the CLI says so in one line when it is missing
    from hypothesis import HealthCheck, Phase, find, settings
    from hypothesis.errors import NoSuchExample

    HAVE_HYPOTHESIS = True
except ImportError:  # pragma: no cover - exercised by the CLI test with the import blocked
    HAVE_HYPOTHESIS = False


def _need():
    if not HAVE_HYPOTHESIS:
        raise ImportError(MISSING)


# ----------------------------------------------------------------------------- running

@dataclass
class Found:
    """A shrunk failure."""

    op: str
    case: Case
    params: dict
    result: Any  # RunResult of the shrunk example
    trigger: dict  # parameters that differ from the strategy's simplest example
    examples_to_first: int  # examples drawn up to and including the first failing one
    shrink_calls: int
    path: Path | None = None  # the saved vector, when saved


@dataclass
class OpRun:
    op: str
    examples: int = 0  # examples judged before the first failure (all of them when none failed)
    rejected: int = 0  # drawn parameters that gave no case (designed draws that did not come out)
    generator_errors: int = 0  # of those, a building block that raised (a strategy bug; should stay 0)
    counts: Counter = field(default_factory=Counter)  # verdicts of the judged examples (before shrinking)
    seconds: float = 0.0
    found: Found | None = None
    note: str = ""  # NOT_IMPLEMENTED, budget reached, generator errors


def _seed_for(seed: int, op: str) -> int:
    return (int(seed) * 1_000_003 + zlib.crc32(op.encode())) & 0xFFFFFFFFFFFF


def _settings(max_examples: int, shrink: bool):
    phases = [Phase.generate] + ([Phase.shrink] if shrink else [])
    return settings(max_examples=max_examples, database=None, deadline=None, derandomize=False,
                    suppress_health_check=list(HealthCheck), phases=phases, report_multiple_bugs=False)


_MINIMAL: dict[tuple, dict] = {}
BRANCHES = ("kind", "design", "variant")  # the first of these a strategy draws picks its branch


def minimal(op: str, branch: tuple | None = None) -> dict:
    """The strategy's simplest example (where hypothesis shrinks every parameter that does not matter),
    within ``branch`` = (key, value) when given (e.g. ("design", "history"))."""
    key = (op, branch)
    if key not in _MINIMAL:
        cond = (lambda p: True) if branch is None else (lambda p: p.get(branch[0]) == branch[1])
        try:
            _MINIMAL[key] = find(STRATEGIES[op].params(), cond, settings=_settings(500, True),
                                 random=random.Random(0))
        except NoSuchExample:
            _MINIMAL[key] = {}
    return _MINIMAL[key]


def _same(v, base) -> bool:
    if v == base:
        return True
    # a per-row list whose every row holds the simplest example's (single-row) value
    if isinstance(v, list) and isinstance(base, list) and base and all(x == base[0] for x in base):
        return all(x == base[0] for x in v)
    return False


def trigger_of(op: str, params: Mapping) -> dict:
    """The parameters of a shrunk example that differ from the simplest example of its branch:
    hypothesis has shrunk every other one back there, so these are what the failure needs."""
    branch = next(((k, params[k]) for k in BRANCHES if k in params), None)
    base = minimal(op, branch)
    out = {k: v for k, v in params.items() if k != "salt" and not _same(v, base.get(k))}
    if branch is not None and branch[1] != minimal(op).get(branch[0]):
        out = {branch[0]: branch[1], **out}
    return out


def describe(params: Mapping) -> str:
    return ", ".join(f"{k}={json.dumps(v, default=str)}" for k, v in params.items())


FAILED = ("FAIL", "ERROR")


def fuzz_op(op: str, judge: Callable[[Case], Any], *, max_examples: int = 100, seed: int = 0, shrink: bool = True,
            stop_at: float | None = None, is_failure: Callable[[Any], bool] | None = None,
            spec=None) -> OpRun:
    """Draw up to ``max_examples`` examples of ``op``; ``judge(case)`` returns a RunResult (or anything
    ``is_failure`` understands). The first failing example is shrunk and returned in ``found``.
    ``stop_at`` (time.monotonic()): no example is judged after it."""
    _need()
    strat = STRATEGIES[op]
    is_failure = is_failure or (lambda r: r.result.name in FAILED)
    run = OpRun(op)
    state = {"calls": 0, "first": None, "notimpl": False, "stopped": False}
    start = time.monotonic()

    def condition(p):
        if state["notimpl"] or (stop_at is not None and time.monotonic() > stop_at and state["first"] is None):
            state["stopped"] = state["stopped"] or not state["notimpl"]
            return False
        try:
            case = strat.case(p)
        except Reject:
            run.rejected += 1
            return False
        except Exception as exc:  # noqa: BLE001 - a strategy bug: counted and named, the run goes on
            run.rejected += 1
            run.generator_errors += 1
            if not run.note:
                run.note = f"generator error: {type(exc).__name__}: {exc}".splitlines()[0][:200]
            return False
        res = judge(case)
        state["calls"] += 1
        bad = bool(is_failure(res))
        if state["first"] is None:
            name = getattr(getattr(res, "result", None), "name", str(res))
            run.counts[name] += 1
            run.examples += 1
            if name == "NOT_IMPLEMENTED":
                state["notimpl"] = True
                run.note = f"NOT_IMPLEMENTED: {getattr(res, 'detail', '')}"
                return False
            if bad:
                state["first"] = state["calls"]
        return bad

    try:
        p = find(strat.params(), condition, settings=_settings(max_examples, shrink),
                 random=random.Random(_seed_for(seed, op)))
    except NoSuchExample:
        p = None
    run.seconds = time.monotonic() - start
    if state["stopped"] and not run.note:
        run.note = "budget reached"
    if p is None:
        return run
    case = strat.case(p)
    res = judge(case)
    run.found = Found(op, case, dict(p), res, trigger_of(op, p), state["first"] or 0,
                      state["calls"] - (state["first"] or 0))
    return run


def judge_with(handle, specs: Mapping, timeout: float | None = 60.0, diagnoser=None):
    """A ``judge(case)`` that judges ``handle`` (an implementation or a runner handle) on the case,
    through the same path as a vector: generate.case_vector, then runner.judge (C2 v2)."""
    from conformance import generate, runner

    def judge(case: Case):
        spec = specs[case.op]
        with np.errstate(all="ignore"):  # +inf hidden, NaN scores: the reference's own edge cases
            vec = generate.case_vector(spec, case)
        h = handle if hasattr(handle, "invoke") and hasattr(handle, "isolated") else runner.InProcess(handle)
        outcome = h.invoke(vec, runner.finite_timeout(timeout))
        return runner.judge(vec, outcome, spec.force, spec.independent, spec, diagnoser)

    return judge


def save(found: Found, out: Path, specs: Mapping) -> Path:
    """Write the shrunk case as a vector file under OUT/<op>/ and add it to OUT's manifest (kept
    entries of earlier runs), with a fuzz.json record of its parameters."""
    from conformance import generate

    out = Path(out)
    data = generate.case_bytes(specs[found.op], found.case)
    path = vectors.case_path(out, found.case.id)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    entries = []
    if (out / vectors.MANIFEST).is_file():
        try:
            entries = [e for e in vectors.read_manifest(out)["files"] if e["case"] != found.case.id]
        except vectors.InputError:
            entries = []
    entries.append({"path": vectors.case_path(Path("."), found.case.id).as_posix(), "sha256": vectors.sha256(data),
                    "op": found.op, "case": found.case.id, "flags": list(found.case.flags)})
    (out / vectors.MANIFEST).write_bytes(vectors.manifest_bytes(entries))
    record_path = out / "fuzz.json"
    try:
        records = json.loads(record_path.read_text()) if record_path.is_file() else {}
    except (OSError, ValueError):
        records = {}
    records[found.case.id] = {"op": found.op, "params": found.params, "trigger": found.trigger,
                              "result": found.result.result.name, "detail": found.result.detail}
    record_path.write_text(json.dumps(records, indent=1, sort_keys=True, default=str) + "\n")
    found.path = path
    return path


def select_ops(pattern: str | None, specs: Mapping) -> list[str]:
    names = [n for n in sorted(specs) if n in STRATEGIES]
    globs = vectors.split_globs(pattern)
    if not globs:
        return names
    chosen = [n for n in names if any(fnmatch.fnmatchcase(n, g) for g in globs)]
    bad = [g for g in globs if not any(fnmatch.fnmatchcase(n, g) for n in names)]
    if bad:
        raise vectors.InputError(f"--ops: {bad[0]!r} matches no Op with a fuzz strategy ({', '.join(names)})")
    return chosen


def run(impl, *, ops: list[str], max_examples: int, seed: int, timeout: float | None, budget_s: float | None,
        specs: Mapping, out: Path | None, log: Callable[[str], None] = print, diagnose: bool = True,
        rerun: Callable[[Found], str] | None = None, strict: bool = False) -> list[OpRun]:
    """Fuzz ``impl`` (an implementation object or a runner handle) over ``ops``; log per-Op lines."""
    diagnoser = None
    if diagnose:
        try:
            from conformance.diagnose import Diagnoser

            diagnoser = Diagnoser()
        except ImportError:  # pragma: no cover - diagnose is optional here
            diagnoser = None
    judge = judge_with(impl, specs, timeout, diagnoser)
    failing = FAILED + (("ACCEPTABLE",) if strict else ())
    stop_at = time.monotonic() + budget_s if budget_s else None
    runs = []
    t0 = time.monotonic()
    for op in ops:
        r = fuzz_op(op, judge, max_examples=max_examples, seed=seed, stop_at=stop_at,
                    is_failure=lambda res: res.result.name in failing)
        runs.append(r)
        verdicts = ", ".join(f"{n} {k}" for k, n in sorted(r.counts.items()))
        extra = f"; {r.rejected} draws rejected" if r.rejected else ""
        extra += f" ({r.note})" if r.note else ""
        if r.found is None:
            log(f"{op}: {r.examples} examples: {verdicts or 'none'}{extra} ({r.seconds:.1f} s)")
            continue
        f = r.found
        if out is not None:
            save(f, out, specs)
        log(f"{op}: {f.result.result.name} at example {f.examples_to_first} of {max_examples}, shrunk in "
            f"{f.shrink_calls} steps{extra} ({r.seconds:.1f} s)")
        log(f"  case {f.case.id}: {f.result.detail}")
        log(f"  triggered by: {describe(f.trigger) or '(the simplest example)'}")
        log(f"  parameters: {describe({k: v for k, v in f.params.items()})}")
        note = getattr(f.result, "diagnosis_note", "")
        if note:
            log(f"  diagnosis: {note}")
        if f.path is not None:
            log(f"  saved: {f.path}")
        if rerun is not None:
            log(f"  rerun: {rerun(f)}")
    total = sum(r.examples for r in runs)
    log(f"fuzz: {total} examples over {len(runs)} Op(s), seed {seed}, {time.monotonic() - t0:.1f} s wall; "
        f"{sum(r.found is not None for r in runs)} Op(s) with a failure")
    return runs


__all__ = [
    "FLAG",
    "HAVE_HYPOTHESIS",
    "MISSING",
    "STRATEGIES",
    "Reject",
    "Strategy",
    "case_id",
    "fuzz_op",
    "judge_with",
    "minimal",
    "run",
    "save",
    "select_ops",
    "strategy",
    "trigger_of",
]
