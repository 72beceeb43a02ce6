"""Running an implementation over the vectors (CONTRACTS C9).

An implementation is an object with one method per Op, named as the Op, called
with keyword arguments named as the vector's inputs and params, returning a dict
named as the Op's outputs.

Where it runs. ``run_suite(..., isolate=True)`` (the CLI's default) runs the
implementation in a worker process (``conformance.worker``): the implementation
is imported there, only there (a GPU implementation owns its device in the
worker; the parent never imports CuPy), and the parent enforces each case's
deadline by killing the worker. An implementation that exits, crashes, is
killed by a signal or overruns its deadline is an ERROR for the case it held,
naming the cause, and the run goes on with a fresh worker. Teacher forcing and
the comparison run in the parent. ``isolate=False`` (the Python API's default,
and ``--in-process``) calls the implementation in this process: fast, but a
hang inside C code cannot be interrupted (the deadline is SIGALRM, main thread
only) and ``os._exit`` or a segfault ends the run.

Inputs. NumPy arrays, fresh copies per call (an implementation that writes into
its inputs cannot corrupt the vectors or the teacher-forced reference). With
``array_module = "cupy"`` on the object, tensors arrive as CuPy arrays instead;
CuPy has no bfloat16 dtype, so a BF16 input reaches a CuPy implementation as a
``uint16`` array of the same shape holding the BF16 bit patterns
(``x.view(cupy.uint16)`` semantics; use ``__nv_bfloat16`` bits on the device).
Params (ints, floats, strings, lists) are passed as decoded from the vector.

Outputs. Anything ``numpy.asarray`` reads; torch tensors of any dtype and
device (bfloat16 and float16 read by their bit pattern); any object with
``__dlpack__`` (host memory through NumPy's DLPack, or a small reader of the
DLPack capsule for dtypes NumPy lacks such as bfloat16; device memory through
CuPy) or ``__cuda_array_interface__`` (through CuPy). A ``uint16`` array for a
BF16 output is taken as BF16 bit patterns. Represented outputs must be floats,
decision and exact outputs integers, each of the reference's shape.

A represented output must hold values of its storage format: a float64 or
float32 array returned for a BF16 output must hold BF16 values (a value that
BF16 cannot represent is a FAIL naming the output and the first such element),
and likewise for FP16 and FP32. An output whose values follow another format
than its storage (``Output.values``: context V is stored FP16 but holds
FP16_RNE(BF16(v))) must hold values of both.

Results. No method: NOT_IMPLEMENTED, and so is a method that raises
``NotImplementedError`` (a variant the implementation does not support). Any
other exception (``SystemExit`` included), a missing output, a wrong shape or
dtype kind, or running past the per-case timeout: ERROR, its first line as the
detail and the whole traceback in ``trace`` (JSON and JUnit reports).
"""

from __future__ import annotations

import copy
import functools
import inspect
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from conformance import compare, registry, vectors
from conformance.compare import CaseResult, Result

# Calling an implementation lives in conformance.invoke; its names stay importable from the runner,
# where implementations, examples and kernels have always imported them (to_numpy, InProcess, ...).
from conformance.invoke import (  # noqa: F401
    BF16,
    TRACE_LIMIT,
    BadOutput,
    CaseTimeout,
    InProcess,
    Outcome,
    _DLManagedTensor,
    _inputs_for,
    _one_line,
    _trace,
    call_method,
    check_outputs,
    deadline,
    finite_timeout,
    host_outputs,
    impl_name,
    jsonable_env,
    load_impl,
    read_dlpack_capsule,
    to_numpy,
    value_formats,
)
from conformance.registry import OpSpec
from conformance.vectors import InputError, Vector

DEFAULT_TIMEOUT = 60.0


@dataclass
class RunResult(CaseResult):
    """A CaseResult with what a report needs beyond the verdict."""

    trace: str = ""  # the implementation's traceback, or the worker's last output when it died
    output: str = ""  # what the implementation printed during the case (isolated runs)
    expected_failure: str | None = None  # --expect: the reason this case is known to fail
    rerun: str = ""  # a command that reruns just this case (set by the CLI)
    # diagnose: catalog pitfalls whose one-bug reference reproduces a FAIL, best first
    diagnosis: list = field(default_factory=list)
    diagnosis_note: str = ""


def open_impl(impl, isolate: bool = False, specs: Mapping[str, OpSpec] | None = None, ops=(), load_timeout=None):
    """A handle with ``invoke(vec, timeout) -> Outcome``, ``environment()``, ``name`` and ``close()``.

    ``impl``: an object, or (isolated) a ``package.module:attribute`` string, or None for
    the default (the CUDA backend where CuPy and a GPU are present, else the float32
    baseline). An existing handle is returned as it is."""
    if hasattr(impl, "invoke") and hasattr(impl, "isolated"):
        return impl
    if not isolate:
        if impl is None:
            from conformance.worker import default_impl

            obj, why = default_impl(specs)
            handle = InProcess(obj)
            handle.why = why
            return handle
        if isinstance(impl, str):
            return InProcess(load_impl(impl), impl)
        return InProcess(impl)
    from conformance.worker import WorkerImpl

    return WorkerImpl(impl, specs=specs, ops=ops, load_timeout=load_timeout)


# ----------------------------------------------------------------------------- one case

@functools.lru_cache(maxsize=1)
def _registry_specs() -> dict:
    try:
        return registry.ops()
    except Exception:  # noqa: BLE001 - a broken case module must not stop a run of other Ops
        return {}


def judge(vec: Vector, outcome: Outcome, force: Callable | None = None, independent=(),
          spec: OpSpec | None = None, diagnoser=None) -> RunResult:
    """The verdict on one call's outcome: storage format, then the comparison (C2)."""
    res = RunResult(vec.op, vec.case, Result.PASS, flags=tuple(vec.flags), seconds=outcome.seconds,
                    output=outcome.output)
    if outcome.kind == "notimpl":
        res.result, res.detail = Result.NOT_IMPLEMENTED, outcome.detail
        return res
    if outcome.kind != "ok":
        res.result, res.detail, res.trace = Result.ERROR, outcome.detail, outcome.trace
        return res
    try:
        out, storage_fail = check_outputs(vec, outcome.arrays, outcome.keys, spec)
    except BadOutput as exc:
        res.result, res.detail = Result.ERROR, str(exc)
        return res
    if storage_fail:
        res.result, res.detail = Result.FAIL, storage_fail
        _diagnose(res, vec, out, diagnoser)
        return res

    def fresh_kwargs():
        return {**{k: np.array(v, copy=True) for k, v in vec.inputs.items()}, **copy.deepcopy(vec.params)}

    try:
        extra = {"spec": spec} if _compare_takes_spec() else {}
        verdict = compare.compare(vec.outputs, vec.expected, out, vec.masks, vec.bounds, force, fresh_kwargs,
                                  independent, **extra)
    except Exception as exc:  # noqa: BLE001 - a vector the comparison cannot use (bounds, masks) is reported
        res.result, res.detail, res.trace = Result.ERROR, f"cannot compare: {_one_line(exc)}", _trace(exc)
        return res
    res.result, res.detail = verdict.result, verdict.detail
    for k, v in verdict.numbers.items():
        setattr(res, k, v)
    flags = getattr(verdict, "flags", None)
    if flags and not getattr(res, "acceptable_flags", ()):
        res.acceptable_flags = tuple(flags)
    _diagnose(res, vec, out, diagnoser)
    return res


def _diagnose(res: RunResult, vec: Vector, out, diagnoser) -> None:
    """On a FAIL, the catalog pitfalls that reproduce the outputs (conformance.diagnose)."""
    if diagnoser is None or res.result != Result.FAIL:
        return
    d = diagnoser(vec, out)
    res.diagnosis, res.diagnosis_note = d["matches"], d["note"]


@functools.lru_cache(maxsize=1)
def _compare_takes_spec() -> bool:
    try:
        return "spec" in inspect.signature(compare.compare).parameters
    except (TypeError, ValueError):
        return False


def run_case(impl, vec: Vector, timeout: float | None = DEFAULT_TIMEOUT, force: Callable | None = None,
             independent=(), *, spec: OpSpec | None = None) -> RunResult:
    """Run one case on ``impl`` (an implementation object, or a handle from ``open_impl``)."""
    handle = impl if hasattr(impl, "invoke") and hasattr(impl, "isolated") else InProcess(impl)
    if spec is None:
        spec = _registry_specs().get(vec.op)
    return judge(vec, handle.invoke(vec, finite_timeout(timeout)), force, independent, spec)


# ----------------------------------------------------------------------------- the suite

def load_selection(vectors_dir: Path, ops_pattern: str | None = None) -> tuple[dict, list[dict]]:
    """(manifest, selected entries); InputError for a missing manifest or an empty selection."""
    manifest = vectors.read_manifest(Path(vectors_dir))
    by_case = {e["case"]: e for e in manifest["files"]}
    chosen = vectors.select(ops_pattern, sorted(by_case), f"{vectors_dir}/{vectors.MANIFEST}")
    return manifest, [by_case[c] for c in chosen]


def shard(entries: list[dict], index: int, count: int) -> list[dict]:
    """The entries of shard ``index`` (1-based) of ``count``: a split by a hash of the case
    id, so a case stays in its shard whatever else is selected or added."""
    return [e for e in entries if int(vectors.sha256(e["case"].encode())[:12], 16) % count == index - 1]


def read_entry(vectors_dir: Path, entry: dict) -> Vector:
    """One vector, checked against its manifest sha256 (a changed file is broken suite data,
    ``vectors.DataError``, not a FAIL)."""
    path = Path(vectors_dir) / entry["path"]
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise vectors.DataError(f"{path}: {exc.strerror or exc}") from None
    if vectors.sha256(data) != entry["sha256"]:
        raise vectors.DataError(f"{path}: sha256 differs from {vectors.MANIFEST} (run dflash-conformance verify)")
    try:
        vec = vectors.parse_vector(data, str(path))
    except InputError as exc:
        raise vectors.DataError(str(exc)) from None
    if vec.case != entry["case"] or vec.op != entry["op"]:
        raise vectors.DataError(f"{path}: holds case {vec.case!r} of Op {vec.op!r}, "
                                f"the manifest says {entry['case']!r}")
    return vec


def _entry_error(entry: dict, detail: str) -> RunResult:
    case = str(entry.get("case", entry.get("path", "?")))
    return RunResult(str(entry.get("op", case.split("/")[0])), case, Result.ERROR, detail)


def run_suite(impl, vectors_dir, ops_pattern: str | None = None, progress=None,
              timeout: float | None = DEFAULT_TIMEOUT, specs: Mapping[str, OpSpec] | None = None, *,
              isolate: bool = False, deadline_s: float | None = None, on_result: Callable | None = None,
              entries: list[dict] | None = None, diagnose: bool = False) -> list[RunResult]:
    """Run ``impl`` over the selected vectors. ``progress(done, total, case_id)`` is called
    before each case and ``on_result(result)`` after it. ``specs`` (default: the registry)
    supplies each Op's ``force``. ``isolate``: in a worker process (see the module doc);
    ``impl`` may then be a ``package.module:attribute`` string. ``deadline_s``: an overall
    limit; cases not started by then are ERRORs that say so. ``entries``: the manifest
    entries to run (default: those ``ops_pattern`` selects). A vector file that cannot be
    read is an ERROR for its case; the run goes on. ``diagnose``: each FAIL names the catalog
    pitfalls that reproduce it (``conformance.diagnose``)."""
    if entries is None:
        _, entries = load_selection(Path(vectors_dir), ops_pattern)
    all_specs = specs if specs is not None else registry.ops()
    results = []
    timeout = finite_timeout(timeout)
    stop_at = time.monotonic() + deadline_s if finite_timeout(deadline_s) else None
    handle = open_impl(impl, isolate, specs, ops=sorted({e["op"] for e in entries}))
    diagnoser = None
    if diagnose:
        from conformance.diagnose import Diagnoser

        diagnoser = diagnose if callable(diagnose) else Diagnoser()  # a Diagnoser may be shared between runs
    owned = handle is not impl
    try:
        for i, entry in enumerate(entries):
            if progress:
                progress(i, len(entries), entry["case"])
            left = None if stop_at is None else stop_at - time.monotonic()
            if left is not None and left <= 0:
                res = _entry_error(entry, f"not run: the overall deadline of {deadline_s:g} s was reached")
            else:
                try:
                    vec = read_entry(Path(vectors_dir), entry)
                except InputError as exc:
                    res = _entry_error(entry, f"bad vector file: {exc}")
                else:
                    spec = all_specs.get(vec.op)
                    limit = timeout if left is None else min(timeout or left, left)
                    res = judge(vec, handle.invoke(vec, limit), spec.force if spec else None,
                                spec.independent if spec else (), spec, diagnoser)
                    if left is not None and limit < (timeout or math.inf) and res.detail.startswith("timed out"):
                        res.detail = f"timed out: the overall deadline of {deadline_s:g} s was reached"
            results.append(res)
            if on_result:
                on_result(res)
    finally:
        if owned:
            handle.close()
    if progress:
        progress(len(entries), len(entries), "done")
    return results
