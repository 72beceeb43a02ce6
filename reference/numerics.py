"""Represented number formats (CONTRACTS C1).

The reference computes in float64 and rounds only at the represented points the
spec names. Rounding is round-to-nearest-even of the exact float64 value, done
once. ``ml_dtypes`` casts float64 -> bfloat16 through float32, which rounds
twice (1 + 2**-8 + 2**-40 becomes 1.0 instead of 1.0078125), so the rounding
here is done on the float64 value directly: split x = m * 2**e exactly with
``frexp``, scale by a power of two (exact), round half-to-even with ``rint``,
scale back. Overflow goes to +-inf, subnormals are kept, NaN stays NaN.

``to_bf16`` / ``to_fp16`` / ``to_fp32`` return float64 arrays holding
representable values; ``storage`` gives the ml_dtypes / numpy storage array
(exact, because the values are already representable).
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from reference.backend import xp


@dataclass(frozen=True)
class Format:
    name: str
    precision: int  # significant bits, implicit bit included
    emin: int  # exponent of the smallest normal: 2**emin
    max_finite: float
    dtype: type

    @property
    def min_quantum(self) -> float:
        """Spacing of the subnormals (and of the smallest binade)."""
        return 2.0 ** (self.emin - self.precision + 1)


BF16 = Format("bf16", 8, -126, float(ml_dtypes.finfo(ml_dtypes.bfloat16).max), ml_dtypes.bfloat16)
FP16 = Format("fp16", 11, -14, 65504.0, np.float16)
FP32 = Format("fp32", 24, -126, float(np.finfo(np.float32).max), np.float32)
FORMATS = {f.name: f for f in (BF16, FP16, FP32)}


def get_format(fmt: str | Format) -> Format:
    if isinstance(fmt, Format):
        return fmt
    try:
        return FORMATS[fmt]
    except KeyError:
        raise ValueError(f"unknown number format {fmt!r}; known: {sorted(FORMATS)}") from None


def quantum(x, fmt: str | Format) -> np.ndarray:
    """Spacing of ``fmt`` at |x| (ulp of the binade holding x; subnormal floor)."""
    f = get_format(fmt)
    x = xp.asarray(x, dtype=np.float64)
    _, e = xp.frexp(xp.where(xp.isfinite(x), x, 0.0))
    # |x| in [2**(e-1), 2**e): the binade's spacing is 2**(e - precision).
    q = xp.ldexp(1.0, (e - f.precision).astype(np.int32))  # frexp's exponents are int32 on both backends
    return xp.maximum(q, f.min_quantum)


def round_to(x, fmt: str | Format) -> np.ndarray:
    """Round float64 values to ``fmt`` (RNE, once); returns float64."""
    f = get_format(fmt)
    x = xp.asarray(x, dtype=np.float64)
    q = quantum(x, f)
    with np.errstate(over="ignore", invalid="ignore"):
        y = xp.rint(x / q) * q  # x / q is exact: q is a power of two
        # the overflow threshold: values that round to 2**(emax+1) become inf
        y = xp.where(xp.abs(y) > f.max_finite, xp.copysign(np.inf, x), y)
    return xp.where(xp.isfinite(x), y, x)


def to_bf16(x) -> np.ndarray:
    return round_to(x, BF16)


def to_fp16(x) -> np.ndarray:
    return round_to(x, FP16)


def to_fp32(x) -> np.ndarray:
    return round_to(x, FP32)


def bf16_to_fp16(x) -> np.ndarray:
    """FP16_RNE of a BF16 value: exact in FP16's normal range, rounds to a
    subnormal below it, overflows to inf above 65504 (the context V contract)."""
    return to_fp16(to_bf16(x))


def context_v(v_raw) -> np.ndarray:
    """Stored context V: FP16_RNE(BF16(v_raw)) (C1)."""
    return bf16_to_fp16(v_raw)


def storage(x, fmt: str | Format) -> np.ndarray:
    """The storage array (ml_dtypes.bfloat16 / float16 / float32) of x rounded to fmt."""
    f = get_format(fmt)
    return round_to(x, f).astype(f.dtype)


def ulp_error(out, ref, fmt: str | Format) -> np.ndarray:
    """Elementwise |out - ref| in units of fmt's spacing at ref (float64).

    Matching infinities (same sign) and matching NaNs count as 0; any other
    non-finite mismatch is inf.
    """
    f = get_format(fmt)
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(out - ref) / quantum(ref, f)
    both_nan = np.isnan(out) & np.isnan(ref)
    same_inf = np.isinf(out) & np.isinf(ref) & (np.sign(out) == np.sign(ref))
    err = np.where(both_nan | same_inf, 0.0, err)
    return np.where(np.isnan(err), np.inf, err)


def normwise_error(out, ref) -> float:
    """||out - ref||_2 / ||ref||_2 over finite reference entries (0 if ref is 0)."""
    out = np.asarray(out, dtype=np.float64).ravel()
    ref = np.asarray(ref, dtype=np.float64).ravel()
    fin = np.isfinite(ref)
    if not np.all(np.isfinite(out[fin])):  # a non-finite output where the reference is finite
        return float("inf")
    num = float(np.linalg.norm(out[fin] - ref[fin]))
    den = float(np.linalg.norm(ref[fin]))
    if den == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return num / den


def ordered_bits(x, fmt: str | Format) -> np.ndarray:
    """Map representable values to integers whose differences are ULP counts."""
    f = get_format(fmt)
    width = np.dtype(f.dtype).itemsize * 8
    bits = np.asarray(storage(x, f)).view(np.dtype(f"uint{width}")).astype(np.int64)
    sign = np.int64(1) << (width - 1)
    return np.where(bits & sign, -(bits & (sign - 1)), bits)


def ulp_distance(a, b, fmt: str | Format) -> np.ndarray:
    """Integer ULP distance between two values of fmt (both rounded to fmt first)."""
    return np.abs(ordered_bits(a, fmt) - ordered_bits(b, fmt))
