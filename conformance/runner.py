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

import contextlib
import copy
import ctypes
import functools
import importlib
import inspect
import math
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import ml_dtypes
import numpy as np

from conformance import compare, registry, vectors
from conformance.compare import CaseResult, Result
from conformance.registry import REPRESENTED, OpSpec
from conformance.vectors import InputError, Vector
from reference import numerics

DEFAULT_TIMEOUT = 60.0
BF16 = np.dtype(ml_dtypes.bfloat16)
TRACE_LIMIT = 20_000  # characters of traceback / captured output kept per case


class BadOutput(Exception):
    """The implementation returned something the comparison cannot use (an ERROR)."""


class CaseTimeout(BaseException):
    """Raised by SIGALRM; a BaseException so an implementation's ``except Exception`` cannot swallow it."""


@dataclass
class RunResult(CaseResult):
    """A CaseResult with what a report needs beyond the verdict."""

    trace: str = ""  # the implementation's traceback, or the worker's last output when it died
    output: str = ""  # what the implementation printed during the case (isolated runs)
    expected_failure: str | None = None  # --expect: the reason this case is known to fail
    rerun: str = ""  # a command that reruns just this case (set by the CLI)
    # diagnose (issue 10): catalog pitfalls whose one-bug reference reproduces a FAIL, best first
    diagnosis: list = field(default_factory=list)
    diagnosis_note: str = ""


def finite_timeout(seconds: float | None) -> float | None:
    """None for no limit (None, 0, inf)."""
    if seconds is None or not seconds or math.isinf(seconds):
        return None
    return float(seconds)


@contextlib.contextmanager
def deadline(seconds: float | None):
    seconds = finite_timeout(seconds)
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
    if not isinstance(target, str):
        raise InputError(f"--impl: expected package.module:attribute, got {target!r}")
    mod_name, sep, attr = target.partition(":")
    if not sep or not mod_name or not attr:
        raise InputError(f"--impl: expected package.module:attribute, got {target!r}")
    if os.getcwd() not in sys.path:  # as `python -m` would: the current project's modules are importable
        sys.path.append(os.getcwd())
    try:
        obj = importlib.import_module(mod_name)
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise InputError(f"--impl: cannot import {mod_name}: {_one_line(exc)}") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise InputError(f"--impl: {mod_name} has no attribute {attr!r}") from None
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                raise
            raise InputError(f"--impl: {mod_name}:{attr} raised {_one_line(exc)}") from None
    if inspect.isclass(obj) or inspect.isfunction(obj) or inspect.ismethod(obj) or inspect.isbuiltin(obj):
        try:
            obj = obj()
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                raise
            raise InputError(f"--impl: {target}() raised {_one_line(exc)}") from None
    return obj


def impl_name(impl, fallback: str | None = None) -> str:
    try:
        name = getattr(impl, "name", None)
    except Exception:  # noqa: BLE001 - a property that raises: fall back
        name = None
    return _text(name) if name else (fallback or type(impl).__qualname__)


def _text(x) -> str:
    return x.decode("utf-8", "replace") if isinstance(x, (bytes, bytearray)) else str(x)


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, SystemExit):
        text = f"SystemExit({exc.code!r}): the implementation called sys.exit"
    else:
        msg = str(exc).strip()
        text = f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__
    lines = text.strip().splitlines() or [type(exc).__name__]
    first = lines[0] + (" [...]" if len(lines) > 1 else "")
    return first if len(first) <= 300 else first[:297] + "..."


def _trace(exc: BaseException) -> str:
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return text[-TRACE_LIMIT:]


# ----------------------------------------------------------------------------- outputs to NumPy

class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    pass


_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                             ("deleter", ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor)))]

# DLPack type codes: 0 int, 1 uint, 2 float, 4 bfloat, 6 bool
_DL_DTYPES = {(0, 8): np.int8, (0, 16): np.int16, (0, 32): np.int32, (0, 64): np.int64,
              (1, 8): np.uint8, (1, 16): np.uint16, (1, 32): np.uint32, (1, 64): np.uint64,
              (2, 16): np.float16, (2, 32): np.float32, (2, 64): np.float64, (4, 16): BF16, (6, 8): np.bool_}
_DL_HOST = (1, 3)  # kDLCPU, kDLCUDAHost (pinned host memory)


def read_dlpack_capsule(capsule) -> np.ndarray:
    """A copy of a host DLPack tensor (an unversioned ``dltensor`` capsule), for the
    dtypes NumPy's own DLPack reader refuses (bfloat16). The capsule is consumed."""
    api = ctypes.pythonapi
    api.PyCapsule_IsValid.restype, api.PyCapsule_IsValid.argtypes = ctypes.c_int, [ctypes.py_object, ctypes.c_char_p]
    api.PyCapsule_GetPointer.restype = ctypes.c_void_p
    api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    api.PyCapsule_SetName.restype, api.PyCapsule_SetName.argtypes = ctypes.c_int, [ctypes.py_object, ctypes.c_char_p]
    if not api.PyCapsule_IsValid(capsule, b"dltensor"):
        raise BadOutput("__dlpack__ returned no (unused) 'dltensor' capsule")
    ptr = api.PyCapsule_GetPointer(capsule, b"dltensor")
    managed = _DLManagedTensor.from_address(ptr)
    t = managed.dl_tensor
    code = (t.dtype.code, t.dtype.bits)
    if t.device.device_type not in _DL_HOST:
        raise BadOutput(f"a DLPack tensor on device type {t.device.device_type}: reading it needs CuPy in the "
                        "implementation's environment (pip install cupy-cuda12x), or return host arrays")
    if code not in _DL_DTYPES or t.dtype.lanes != 1:
        raise BadOutput(f"a DLPack tensor of type code {code[0]}, {code[1]} bits, {t.dtype.lanes} lanes: "
                        "not a dtype the harness reads")
    dt = np.dtype(_DL_DTYPES[code])
    ndim = int(t.ndim)
    shape = tuple(int(t.shape[i]) for i in range(ndim))
    if t.strides:
        strides = tuple(int(t.strides[i]) for i in range(ndim))
    else:
        strides, step = [], 1
        for n in reversed(shape):
            strides.insert(0, step)
            step *= max(n, 1)
        strides = tuple(strides)
    size = math.prod(shape)
    out = np.empty(shape, dt)
    if size:
        lo = sum(s * (n - 1) for s, n in zip(strides, shape) if s < 0)
        hi = sum(s * (n - 1) for s, n in zip(strides, shape) if s > 0)
        base = int(t.data or 0) + int(t.byte_offset)
        buf = (ctypes.c_char * ((hi - lo + 1) * dt.itemsize)).from_address(base + lo * dt.itemsize)
        flat = np.frombuffer(buf, dt)
        view = np.lib.stride_tricks.as_strided(flat[-lo:] if lo else flat, shape,
                                               tuple(s * dt.itemsize for s in strides))
        out[...] = view
    api.PyCapsule_SetName(capsule, b"used_dltensor")
    if managed.deleter:
        managed.deleter(ctypes.cast(ctypes.c_void_p(ptr), ctypes.POINTER(_DLManagedTensor)))
    return out


_TORCH_BITS = {"torch.bfloat16": ("int16", BF16), "torch.float16": ("int16", np.dtype(np.float16)),
               "torch.float8_e4m3fn": ("uint8", np.dtype(ml_dtypes.float8_e4m3fn)),
               "torch.float8_e5m2": ("uint8", np.dtype(ml_dtypes.float8_e5m2)),
               "torch.float8_e4m3fnuz": ("uint8", np.dtype(ml_dtypes.float8_e4m3fnuz)),
               "torch.float8_e5m2fnuz": ("uint8", np.dtype(ml_dtypes.float8_e5m2fnuz))}


def _torch_to_numpy(t) -> np.ndarray:
    torch = sys.modules["torch"]
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if getattr(t, "is_conj", lambda: False)():
        t = t.resolve_conj()
    if getattr(t, "is_neg", lambda: False)():
        t = t.resolve_neg()
    name = str(t.dtype)
    if name in _TORCH_BITS:  # by bit pattern: NumPy has no such dtype, or must not round through one
        bits, dt = _TORCH_BITS[name]
        return t.contiguous().view(getattr(torch, bits)).numpy().copy().view(dt)
    if name in ("torch.uint16", "torch.uint32", "torch.uint64"):
        signed = {"torch.uint16": "int16", "torch.uint32": "int32", "torch.uint64": "int64"}[name]
        return t.contiguous().view(getattr(torch, signed)).numpy().copy().view(name.replace("torch.", ""))
    return t.contiguous().numpy().copy()


def to_numpy(x) -> np.ndarray:
    """A NumPy array from any output the harness reads (BadOutput, one line, if none)."""
    if isinstance(x, np.ndarray):
        return x
    if type(x).__module__.split(".")[0] == "torch" and hasattr(x, "detach"):
        return _torch_to_numpy(x)
    if hasattr(x, "__cuda_array_interface__"):
        try:
            import cupy
        except ImportError:
            raise BadOutput(f"a {type(x).__name__} with __cuda_array_interface__: reading device memory needs "
                            "CuPy in the implementation's environment (pip install cupy-cuda12x), or return "
                            "host arrays") from None
        return cupy.asnumpy(cupy.asarray(x))
    if hasattr(x, "__dlpack__") and not hasattr(x, "__array__"):
        dev = (1, 0)
        if hasattr(x, "__dlpack_device__"):
            dev = tuple(x.__dlpack_device__())
        if int(dev[0]) not in _DL_HOST:
            try:
                import cupy
            except ImportError:
                raise BadOutput(f"a {type(x).__name__} on DLPack device {dev}: reading device memory needs CuPy "
                                "in the implementation's environment (pip install cupy-cuda12x), or return host "
                                "arrays") from None
            return cupy.asnumpy(cupy.from_dlpack(x))
        try:
            return np.from_dlpack(x)
        except (BufferError, RuntimeError, TypeError, ValueError):  # e.g. bfloat16: NumPy's reader refuses it
            return read_dlpack_capsule(x.__dlpack__())
    return np.asarray(x)


def host_outputs(raw, names) -> tuple[dict[str, np.ndarray], list[str]]:
    """(the named outputs as host NumPy arrays, every key returned); BadOutput when unusable."""
    if not isinstance(raw, Mapping):
        raise BadOutput(f"returned {type(raw).__name__}, expected a dict of outputs")
    keys = sorted(_text(k) for k in raw)
    arrays = {}
    for name in names:
        if name not in raw:
            continue
        try:
            arr = to_numpy(raw[name])
        except BadOutput as exc:
            raise BadOutput(f"{name}: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - an unreadable output is the implementation's ERROR
            raise BadOutput(f"{name}: cannot read a {type(raw[name]).__name__} as an array ({_one_line(exc)})") \
                from None
        if arr.dtype == object:
            raise BadOutput(f"{name}: a {type(raw[name]).__name__} of Python objects (dtype object), expected numbers")
        arrays[name] = np.array(arr, copy=True)
    return arrays, keys


def value_formats(o, spec: OpSpec | None = None) -> tuple[str, ...]:
    """The formats a represented output's values must belong to: its storage format and,
    where the registry says its values follow another (context V), that one too."""
    values = getattr(o, "values", None)
    if values is None and spec is not None:
        try:
            values = getattr(spec.output(o.name), "values", None)
        except KeyError:
            values = None
    return tuple(dict.fromkeys(f for f in (o.fmt, values) if f))


FORMAT_NAMES = {"bf16": "BF16", "fp16": "FP16", "fp32": "FP32"}


def _at(index) -> str:
    return "[" + ", ".join(str(int(i)) for i in index) + "]"


def check_outputs(vec: Vector, arrays: Mapping[str, np.ndarray], keys, spec: OpSpec | None = None
                  ) -> tuple[dict[str, np.ndarray], str | None]:
    """(outputs ready to compare, a FAIL detail or None). BadOutput (an ERROR) for a
    missing output, a wrong dtype kind or shape; a FAIL for values outside the storage format."""
    out = {}
    for name, o in vec.outputs.items():
        if name not in arrays:
            raise BadOutput(f"no output {name!r} (returned {list(keys)})")
        arr = arrays[name]
        want = vec.expected[name]
        if o.cls == REPRESENTED:
            if o.fmt == "bf16" and arr.dtype == np.uint16:
                arr = arr.view(BF16)
            ok = (arr.dtype.kind == "f" and arr.dtype.itemsize <= 8) or arr.dtype == BF16
        else:
            ok = arr.dtype.kind in "iub"
        if not ok:
            raise BadOutput(f"{name}: dtype {arr.dtype} for a {o.cls} output")
        if arr.shape != want.shape:
            raise BadOutput(f"{name}: shape {list(arr.shape)}, expected {list(want.shape)}")
        out[name] = arr
    for name, o in vec.outputs.items():
        if o.cls != REPRESENTED:
            continue
        bad = _storage_violation(name, out[name], value_formats(o, spec), vec.masks.get(name))
        if bad:
            return out, bad
    return out, None


# dtypes that hold only values of the format (BF16 and FP16 values are FP32 values; BF16 ones are not all FP16)
_NATIVE = {"bf16": (BF16,), "fp16": (np.dtype(np.float16),), "fp32": (np.dtype(np.float32), np.dtype(np.float16), BF16)}


def _storage_violation(name: str, arr: np.ndarray, fmts, mask) -> str | None:
    x = None
    for fmt in fmts:
        if arr.dtype in _NATIVE.get(fmt, ()):
            continue  # the dtype can hold nothing else (bf16 values are fp32 values, ...)
        if x is None:
            x = np.asarray(arr, np.float64)
        with np.errstate(all="ignore"):
            r = numerics.round_to(x, fmt)
        bad = ~((r == x) | np.isnan(x))
        if mask is not None:
            bad &= np.broadcast_to(np.asarray(mask, bool), bad.shape)
        if bad.any():
            at = tuple(np.argwhere(bad)[0])
            what = "its storage format" if fmt == fmts[0] else "the format its values follow"
            return (f"{name}: {int(bad.sum())} element(s) are not {FORMAT_NAMES.get(fmt, fmt)} values ({what}); "
                    f"first at {_at(at)}: {float(x[at])!r} (returned as {arr.dtype}; round once, to nearest even, "
                    f"to {FORMAT_NAMES.get(fmt, fmt)})")
    return None


# ----------------------------------------------------------------------------- calling the implementation

@dataclass
class Outcome:
    """What one call of an implementation gave: ``kind`` is "ok", "notimpl" or "error"."""

    kind: str
    arrays: dict = field(default_factory=dict)
    keys: list = field(default_factory=list)
    detail: str = ""
    trace: str = ""
    seconds: float = 0.0
    output: str = ""


def _inputs_for(impl, tensors: Mapping, params: Mapping) -> dict:
    if getattr(impl, "array_module", "numpy") == "cupy":
        import cupy

        arrays = {k: cupy.asarray(v.view(np.uint16) if v.dtype == BF16 else v) for k, v in tensors.items()}
    else:
        arrays = {k: np.array(v, copy=True) for k, v in tensors.items()}
    return {**arrays, **copy.deepcopy(dict(params))}


def call_method(impl, op: str, tensors: Mapping, params: Mapping, names, timeout: float | None = None,
                catch_interrupt: bool = False) -> Outcome:
    """Call ``impl.<op>`` once and bring its outputs to the host (here or in the worker)."""
    try:
        method = getattr(impl, op, None)
    except Exception:  # noqa: BLE001 - a __getattr__ that raises something else: no method
        method = None
    if not callable(method):
        return Outcome("notimpl", detail=f"the implementation has no method {op}")
    start = time.perf_counter()
    try:
        with deadline(timeout):
            raw = method(**_inputs_for(impl, tensors, params))
            arrays, keys = host_outputs(raw, names)
        return Outcome("ok", arrays, keys, seconds=time.perf_counter() - start)
    except CaseTimeout:
        return Outcome("error", detail=f"timed out after {timeout:g} s", seconds=time.perf_counter() - start)
    except BadOutput as exc:
        return Outcome("error", detail=str(exc), seconds=time.perf_counter() - start)
    except NotImplementedError as exc:
        return Outcome("notimpl", detail=_one_line(exc), seconds=time.perf_counter() - start)
    except KeyboardInterrupt as exc:
        if not catch_interrupt:
            raise  # in-process, this is the user's Ctrl-C
        return Outcome("error", detail=_one_line(exc), trace=_trace(exc), seconds=time.perf_counter() - start)
    except BaseException as exc:  # noqa: BLE001 - whatever the implementation raises is its ERROR
        return Outcome("error", detail=_one_line(exc), trace=_trace(exc), seconds=time.perf_counter() - start)


class InProcess:
    """The implementation called in this process (``isolate=False``)."""

    isolated = False

    def __init__(self, impl, name: str | None = None):
        self.impl = impl
        self.name = impl_name(impl, name)

    def invoke(self, vec: Vector, timeout: float | None) -> Outcome:
        return call_method(self.impl, vec.op, vec.inputs, vec.params, list(vec.outputs), timeout)

    def environment(self) -> dict:
        extra = getattr(self.impl, "environment", None)
        if not callable(extra):
            return {}
        try:
            return jsonable_env(extra())
        except Exception as exc:  # noqa: BLE001 - a broken environment() must not lose the results
            return {"environment_error": _one_line(exc)}

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def jsonable_env(env) -> dict:
    """An implementation's environment() made JSON-safe: bytes decoded, other values as text."""
    if not isinstance(env, Mapping):
        return {"environment_error": f"environment() returned {type(env).__name__}, expected a dict"}
    return {_text(k): _jsonable(v) for k, v in env.items()}


def _jsonable(v, depth: int = 0):
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else str(v)
    if isinstance(v, (bytes, bytearray)):
        return _text(v)
    if isinstance(v, np.generic):
        return _jsonable(v.item(), depth)
    if depth < 4 and isinstance(v, Mapping):
        return {_text(k): _jsonable(x, depth + 1) for k, x in v.items()}
    if depth < 4 and isinstance(v, (list, tuple)):
        return [_jsonable(x, depth + 1) for x in v]
    try:
        return str(v)
    except Exception:  # noqa: BLE001
        return f"<unprintable {type(v).__name__}>"


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
