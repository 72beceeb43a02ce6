"""Running an implementation over the vectors (CONTRACTS C9).

An implementation is an object with one method per Op, named as the Op, called
with keyword arguments named as the vector's inputs and params, returning a dict
named as the Op's outputs.

Inputs. NumPy arrays, fresh copies per call (an implementation that writes into
its inputs cannot corrupt the vectors or the teacher-forced reference). With
``array_module = "cupy"`` on the object, tensors arrive as CuPy arrays instead;
CuPy has no bfloat16 dtype, so a BF16 input reaches a CuPy implementation as a
``uint16`` array of the same shape holding the BF16 bit patterns
(``x.view(cupy.uint16)`` semantics; use ``__nv_bfloat16`` bits on the device).
Params (ints, floats, strings, lists) are passed as decoded from the vector.

Outputs. Anything ``numpy.asarray`` reads, or that exposes ``__dlpack__`` or
``__cuda_array_interface__`` (read back through CuPy). A ``uint16`` array for a
BF16 output is taken as BF16 bit patterns. Represented outputs must be floats,
decision and exact outputs integers, each of the reference's shape.

Results. No method: NOT_IMPLEMENTED, and so is a method that raises
``NotImplementedError`` (a variant the implementation does not support). Any
other exception, a missing output, a wrong shape or dtype kind, or running past
the per-case timeout: ERROR. The timeout uses SIGALRM, so it applies only on the
main thread of a POSIX process, and cannot interrupt a call blocked inside C code
until it returns to Python.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import inspect
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import ml_dtypes
import numpy as np

from conformance import compare, registry, vectors
from conformance.compare import CaseResult, Result
from conformance.registry import REPRESENTED, OpSpec
from conformance.vectors import InputError, Vector

DEFAULT_TIMEOUT = 60.0
BF16 = np.dtype(ml_dtypes.bfloat16)


class BadOutput(Exception):
    """The implementation returned something the comparison cannot use (an ERROR)."""


class CaseTimeout(BaseException):
    """Raised by SIGALRM; a BaseException so an implementation's ``except Exception`` cannot swallow it."""


@contextlib.contextmanager
def deadline(seconds: float | None):
    usable = seconds and hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    if not usable:
        yield
        return

    def expire(signum, frame):
        raise CaseTimeout

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def load_impl(target: str):
    """``package.module:attribute`` -> the implementation object. The attribute may be
    an instance, a class (instantiated without arguments) or a zero-argument factory."""
    mod_name, sep, attr = target.partition(":")
    if not sep or not mod_name or not attr:
        raise InputError(f"--impl: expected package.module:attribute, got {target!r}")
    if os.getcwd() not in sys.path:  # as `python -m` would: the current project's modules are importable
        sys.path.append(os.getcwd())
    try:
        obj = importlib.import_module(mod_name)
    except Exception as exc:  # noqa: BLE001 - any import failure is bad input, reported on one line
        raise InputError(f"--impl: cannot import {mod_name}: {type(exc).__name__}: {exc}".splitlines()[0]) from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise InputError(f"--impl: {mod_name} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if inspect.isclass(obj) or inspect.isfunction(obj) or inspect.ismethod(obj) or inspect.isbuiltin(obj):
        try:
            obj = obj()
        except Exception as exc:  # noqa: BLE001 - as above
            raise InputError(f"--impl: {target}() raised {type(exc).__name__}: {exc}".splitlines()[0]) from None
    return obj


def impl_name(impl, fallback: str | None = None) -> str:
    return getattr(impl, "name", None) or fallback or type(impl).__qualname__


def _one_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
    return text if len(text) <= 200 else text[:197] + "..."


def _inputs_for(impl, vec: Vector) -> dict:
    if getattr(impl, "array_module", "numpy") == "cupy":
        import cupy

        tensors = {k: cupy.asarray(v.view(np.uint16) if v.dtype == BF16 else v) for k, v in vec.inputs.items()}
    else:
        tensors = {k: np.array(v, copy=True) for k, v in vec.inputs.items()}
    return {**tensors, **copy.deepcopy(vec.params)}


def to_numpy(x) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "__cuda_array_interface__"):
        import cupy

        return cupy.asnumpy(cupy.asarray(x))
    if hasattr(x, "__dlpack__") and not hasattr(x, "__array__"):
        try:
            return np.from_dlpack(x)
        except (BufferError, RuntimeError, TypeError):  # a device array: through CuPy
            import cupy

            return cupy.asnumpy(cupy.from_dlpack(x))
    return np.asarray(x)


def _normalise(vec: Vector, raw) -> dict[str, np.ndarray]:
    """The implementation's outputs as NumPy arrays; BadOutput (one line) when unusable."""
    if not isinstance(raw, Mapping):
        raise BadOutput(f"returned {type(raw).__name__}, expected a dict of outputs")
    out = {}
    for name, o in vec.outputs.items():
        if name not in raw:
            raise BadOutput(f"no output {name!r} (returned {sorted(raw)})")
        arr = to_numpy(raw[name])
        want = vec.expected[name]
        if o.cls == REPRESENTED:
            if o.fmt == "bf16" and arr.dtype == np.uint16:
                arr = arr.view(BF16)
            ok = arr.dtype.kind == "f" or arr.dtype == BF16
        else:
            ok = arr.dtype.kind in "iub"
        if not ok:
            raise BadOutput(f"{name}: dtype {arr.dtype} for a {o.cls} output")
        if arr.shape != want.shape:
            raise BadOutput(f"{name}: shape {list(arr.shape)}, expected {list(want.shape)}")
        out[name] = arr
    return out


def run_case(impl, vec: Vector, timeout: float | None = DEFAULT_TIMEOUT, force: Callable | None = None,
             independent=()) -> CaseResult:
    res = CaseResult(vec.op, vec.case, Result.PASS, flags=tuple(vec.flags))
    method = getattr(impl, vec.op, None)
    if not callable(method):
        res.result, res.detail = Result.NOT_IMPLEMENTED, f"the implementation has no method {vec.op}"
        return res
    start = time.perf_counter()
    try:
        with deadline(timeout):
            out = _normalise(vec, method(**_inputs_for(impl, vec)))
    except CaseTimeout:
        res.result, res.detail = Result.ERROR, f"timed out after {timeout:g} s"
        return res
    except BadOutput as exc:
        res.result, res.detail = Result.ERROR, str(exc)
        return res
    except NotImplementedError as exc:
        res.result, res.detail = Result.NOT_IMPLEMENTED, _one_line(exc)
        return res
    except Exception as exc:  # noqa: BLE001 - whatever the implementation raises is its ERROR, not the harness's
        res.result, res.detail = Result.ERROR, _one_line(exc)
        return res
    finally:
        res.seconds = time.perf_counter() - start

    def fresh_kwargs():
        return {**{k: np.array(v, copy=True) for k, v in vec.inputs.items()}, **copy.deepcopy(vec.params)}

    verdict = compare.compare(vec.outputs, vec.expected, out, vec.masks, vec.bounds, force, fresh_kwargs, independent)
    res.result, res.detail = verdict.result, verdict.detail
    for k, v in verdict.numbers.items():
        setattr(res, k, v)
    return res


def load_selection(vectors_dir: Path, ops_pattern: str | None = None) -> tuple[dict, list[dict]]:
    """(manifest, selected entries); InputError for a missing manifest or an empty selection."""
    manifest = vectors.read_manifest(Path(vectors_dir))
    by_case = {e["case"]: e for e in manifest["files"]}
    chosen = vectors.select(ops_pattern, sorted(by_case), f"{vectors_dir}/{vectors.MANIFEST}")
    return manifest, [by_case[c] for c in chosen]


def read_entry(vectors_dir: Path, entry: dict) -> Vector:
    """One vector, checked against its manifest sha256 (a changed file is bad input, not a FAIL)."""
    path = Path(vectors_dir) / entry["path"]
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"{path}: {exc.strerror or exc}") from None
    if vectors.sha256(data) != entry["sha256"]:
        raise InputError(f"{path}: sha256 differs from {vectors.MANIFEST} (run dflash-conformance verify)")
    return vectors.parse_vector(data, str(path))


def run_suite(impl, vectors_dir, ops_pattern: str | None = None, progress=None,
              timeout: float | None = DEFAULT_TIMEOUT, specs: Mapping[str, OpSpec] | None = None) -> list[CaseResult]:
    """Run ``impl`` over the selected vectors. ``progress(done, total, case_id)`` is called
    before each case. ``specs`` (default: the
    registry) supplies each Op's ``force``."""
    _, entries = load_selection(Path(vectors_dir), ops_pattern)
    all_specs = specs if specs is not None else registry.ops()
    results = []
    for i, entry in enumerate(entries):
        if progress:
            progress(i, len(entries), entry["case"])
        vec = read_entry(Path(vectors_dir), entry)
        spec = all_specs.get(vec.op)
        results.append(run_case(impl, vec, timeout, spec.force if spec else None, spec.independent if spec else ()))
    if progress:
        progress(len(entries), len(entries), "done")
    return results
