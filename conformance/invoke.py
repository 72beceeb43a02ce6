"""Calling an implementation in this process: loading it (``package.module:attribute``), calling
one Op method with fresh copies of the inputs under a deadline, and reading what it returns back to
host NumPy arrays in the Op's storage formats. The runner (``conformance.runner``) judges what this
module brings back; the worker process (``conformance.worker``) uses it to call an isolated
implementation. The rules for inputs and outputs are in ``conformance.runner``'s documentation.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import importlib
import inspect
import math
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

from conformance.registry import REPRESENTED, OpSpec
from conformance.vectors import InputError, Vector
from reference import numerics

BF16 = np.dtype(ml_dtypes.bfloat16)
TRACE_LIMIT = 20_000  # characters of traceback / captured output kept per case


class BadOutput(Exception):
    """The implementation returned something the comparison cannot use (an ERROR)."""


class CaseTimeout(BaseException):
    """Raised by SIGALRM; a BaseException so an implementation's ``except Exception`` cannot swallow it."""


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
