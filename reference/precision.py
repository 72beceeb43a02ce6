"""One code path, two precisions (CONTRACTS C2).

The reference runs in float64. The *baseline* runs the same functions the way a
production kernel does: float32 arithmetic inside each Op and BF16 at the
intermediate points an Op's registry entry allows. Its error against float64
sets the comparison bound for an implementation under test (at most 2x the
baseline's error, plus a one-ulp floor).

Reference functions call ``work(x)`` on their inputs (cast to the working
float type) and ``inter(x, name)`` at each named intermediate (identity in
float64; BF16 rounding in the baseline when ``name`` is allowed).
Represented outputs are always rounded with ``reference.numerics``.

The baseline is the same on every platform (CONTRACTS C8): its dot products
(``matmul``, ``einsum``) and transcendental functions (``exp``, ``log``, ``tanh``,
``cos``, ``sin``) are evaluated in float64 and rounded once to float32, so that
neither the local BLAS's summation order nor the SIMD libm that NumPy dispatches
to can move a bound derived from it. It models an FP32 kernel with correctly
rounded arithmetic; the envelope (C2 v2, ``reference.magnitude``) is what
admits the other legitimate orders and libms.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, field

import numpy as np

from reference import numerics
from reference.backend import xp


@dataclass(frozen=True)
class Policy:
    dtype: type = np.float64
    bf16_intermediates: frozenset = field(default_factory=frozenset)


FLOAT64 = Policy()
_current: contextvars.ContextVar[Policy] = contextvars.ContextVar("dflash_precision", default=FLOAT64)


def current() -> Policy:
    return _current.get()


@contextlib.contextmanager
def baseline(bf16_intermediates=()):
    """Run reference functions as the float32 baseline (C2)."""
    token = _current.set(Policy(np.float32, frozenset(bf16_intermediates)))
    try:
        yield
    finally:
        _current.reset(token)


def work(x) -> np.ndarray:
    """Cast an input to the working float type."""
    return xp.asarray(x, dtype=current().dtype)


def inter(x, name: str) -> np.ndarray:
    """A named intermediate: BF16-rounded in the baseline when allowed."""
    pol = current()
    if name in pol.bf16_intermediates:
        return numerics.to_bf16(x).astype(pol.dtype)
    return xp.asarray(x, dtype=pol.dtype)


def represent(x, fmt: str) -> np.ndarray:
    """A represented point of the spec (always rounded, in either precision)."""
    return numerics.round_to(x, fmt).astype(current().dtype)


def _f64_then_round(fn):
    def wrapped(*args, **kwargs):
        dtype = current().dtype
        if dtype == np.float64:
            return fn(*args, **kwargs)
        cast = [xp.asarray(a, np.float64) if isinstance(a, np.ndarray | xp.ndarray) or np.isscalar(a)
                and not isinstance(a, str) else a for a in args]
        return xp.asarray(fn(*cast, **kwargs)).astype(dtype)

    wrapped.__name__ = fn.__name__
    wrapped.__doc__ = f"numpy.{fn.__name__} in the working precision (baseline: float64, rounded once to float32)."
    return wrapped


def _matmul(a, b):
    return xp.asarray(a) @ xp.asarray(b)


def _on_backend(name: str):
    """xp.<name>, looked up when called (the backend is chosen per call)."""
    def fn(*args, **kwargs):
        return getattr(xp, name)(*args, **kwargs)

    fn.__name__ = name
    return fn


_matmul.__name__ = "matmul"
matmul = _f64_then_round(_matmul)
einsum = _f64_then_round(lambda spec, *ops: xp.einsum(spec, *ops, optimize=True))
einsum.__name__ = "einsum"
exp = _f64_then_round(_on_backend("exp"))
log = _f64_then_round(_on_backend("log"))
tanh = _f64_then_round(_on_backend("tanh"))
cos = _f64_then_round(_on_backend("cos"))
sin = _f64_then_round(_on_backend("sin"))
