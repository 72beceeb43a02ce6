"""The reference's array backend: one reference, two array modules.

The float64 reference is written once. Its array math goes through ``xp``, which is NumPy
unless a caller selects CuPy (float64 on a GPU) with ``use("cupy")``:

    with backend.use("cupy"):
        out = backend.call(masked_block, **kwargs)   # NumPy in, NumPy out

Outside ``call`` ``xp`` is NumPy, so the harness code around it never meets a device array.

NumPy stays the reference of record: the committed vectors are generated and verified with it.
CuPy only makes the full-geometry run fast; on every committed vector it gives the same decisions
and represented outputs within float64 summation noise (tests/gpu/test_reference_backend.py).

What runs on the selected backend is opted in per function (``portable``): a reference function
written against ``xp`` only. ``call`` runs any other function on NumPy whatever is selected, so
an Op that is not portable (the candidate selector's walk: a sequential loop over vectors of 16,
launch-bound on a GPU) is never half on one module and half on the other.

``call`` is the Op boundary: the inputs go to the device once (ml_dtypes arrays, which CuPy does
not know, as float32: exact for BF16), the outputs come back as NumPy arrays, so the harness,
the bounds and the comparisons stay NumPy.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Mapping
from types import ModuleType

import ml_dtypes
import numpy as np

BACKENDS = ("numpy", "cupy")

# what ``call`` runs portable functions on (``use``), and the module ``xp`` is while one runs:
# outside ``call`` (the harness, the bounds, the comparisons) ``xp`` is NumPy whatever is selected
_selected: contextvars.ContextVar[ModuleType] = contextvars.ContextVar("dflash_array_backend", default=np)
_current: contextvars.ContextVar[ModuleType] = contextvars.ContextVar("dflash_array_active", default=np)
# inputs already on the device inside ``reuse_inputs``: (host array, device array) by the host array's memory
_reused: contextvars.ContextVar[dict | None] = contextvars.ContextVar("dflash_array_reused", default=None)


class BackendError(RuntimeError):
    """The selected array backend cannot run here (one line: why)."""


class _Selected:
    """``xp.<name>`` is the selected array module's ``<name>`` (numpy.concatenate or cupy.concatenate)."""

    def __getattr__(self, name: str):
        return getattr(_current.get(), name)

    def __repr__(self) -> str:
        return f"<array backend {_current.get().__name__}>"


xp = _Selected()


def module() -> ModuleType:
    """The array module ``xp`` is now (NumPy outside ``call``)."""
    return _current.get()


def selected() -> str:
    """The name of the array module ``call`` runs portable functions on."""
    return _selected.get().__name__


def load(which: str) -> ModuleType:
    """The array module called ``which``; BackendError (one line) when it cannot run here."""
    if which == "numpy":
        return np
    if which != "cupy":
        raise BackendError(f"{which!r}: the reference backends are {', '.join(BACKENDS)}")
    try:
        import cupy
    except Exception as exc:  # noqa: BLE001 - any import failure: the reason, in one line
        raise BackendError(f"cupy: CuPy is not importable ({type(exc).__name__}: {exc})") from None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001 - a driver/runtime error is the reason
        raise BackendError(f"cupy: no CUDA device ({type(exc).__name__}: {exc})") from None
    if count < 1:
        raise BackendError("cupy: no CUDA device (count 0)")
    return cupy


@contextlib.contextmanager
def use(which: str | ModuleType):
    """Select the array module (a name of BACKENDS, or a module with NumPy's API) that ``call`` runs
    portable functions on, for the block."""
    mod = load(which) if isinstance(which, str) else which
    token = _selected.set(mod)
    try:
        yield mod
    finally:
        _selected.reset(token)


@contextlib.contextmanager
def _active(mod: ModuleType):
    token = _current.set(mod)
    try:
        yield
    finally:
        _current.reset(token)


def portable(fn: Callable) -> Callable:
    """Mark a reference function as written against ``xp`` only: ``call`` may run it on any backend."""
    fn.array_portable = True
    return fn


def to_host(x):
    """NumPy copies of the arrays in x (a mapping, list, tuple or array); anything else as it is."""
    if isinstance(x, Mapping):
        return {k: to_host(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return type(x)(to_host(v) for v in x)
    return x.get() if hasattr(type(x), "__cuda_array_interface__") else x


@contextlib.contextmanager
def reuse_inputs():
    """Within the block, a host array moved to the device once (the same memory, shape, strides and
    dtype) is not moved again: each later ``call`` gets a device-to-device copy of it, so a call that
    writes into its inputs changes nothing the next one sees. For a block in which nobody writes the
    host arrays (one case's reference, magnitudes, baseline and teacher-forced reruns)."""
    token = _reused.set({})
    try:
        yield
    finally:
        _reused.reset(token)


def _move(x: np.ndarray, mod: ModuleType):
    if x.dtype == ml_dtypes.bfloat16:  # its bits are float32's top half: moved as 2 bytes, widened there
        return (mod.asarray(x.view(np.uint16)).astype(np.uint32) << 16).view(np.float32)
    if not x.dtype.isbuiltin:  # other ml_dtypes: exact in float32
        x = x.astype(np.float32)
    return mod.asarray(x)


def to_device(x, mod: ModuleType | None = None):
    """x's NumPy arrays as arrays of ``mod`` (the selected module): identity on NumPy. Arrays of a
    dtype the module lacks (ml_dtypes' bfloat16) go as float32, which holds every such value."""
    mod = mod or _selected.get()
    if mod is np:
        return x
    if isinstance(x, Mapping):
        return {k: to_device(v, mod) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return type(x)(to_device(v, mod) for v in x)
    if isinstance(x, np.ndarray):
        reused = _reused.get()
        if reused is None:
            return _move(x, mod)
        key = (x.__array_interface__["data"][0], x.shape, x.strides, x.dtype.str, mod.__name__)
        if key not in reused:
            reused[key] = (x, _move(x, mod))  # the host array is held: its memory cannot be reused meanwhile
        return reused[key][1].copy()
    return x


def call(fn: Callable, *args, **kwargs):
    """fn(*args, **kwargs) on the selected backend when fn is ``portable`` (else on NumPy), with
    NumPy arrays in and out."""
    mod = _selected.get()
    if mod is np or not getattr(fn, "array_portable", False):
        with _active(np):
            return fn(*args, **kwargs)
    with _active(mod):
        return to_host(fn(*to_device(args, mod), **to_device(kwargs, mod)))
