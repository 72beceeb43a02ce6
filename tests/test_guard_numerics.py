"""Guards of reference/numerics.py (CONTRACTS C1) that survive regenerating the vectors (issue 14).

The golden vectors are made by the reference, so a rounding bug followed by ``generate`` agrees
with itself. These tests do not: every expected value is either written by hand (the derivation
next to it: the two neighbours of an exact half-way point and which of them has an even last
significand bit) or comes from an oracle outside ``reference`` that rounds once and correctly
(NumPy's float64 -> float32 and float64 -> float16 casts; ``ml_dtypes`` float32 -> bfloat16, one
rounding because its input is already float32).

Spacings used below (precision p significant bits, spacing 2^(e - p + 1) in [2^e, 2^(e+1))):
    BF16  p = 8:   2^-7 in [1, 2), smallest subnormal 2^-133, max (2 - 2^-7) 2^127 = 255 * 2^120
    FP16  p = 11:  2^-10 in [1, 2), smallest subnormal 2^-24,  max 65504 = 2047 * 2^5
    FP32  p = 24:  2^-23 in [1, 2), smallest subnormal 2^-149, max (2 - 2^-23) 2^127
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reference import numerics
from reference.numerics import round_to, storage, to_bf16, to_fp16, to_fp32

INF = math.inf

# (input, correctly rounded result) pairs, each derived by hand.
BF16_HAND = [
    # 1 + 2^-8 is half-way between 1 (significand ...0000000, even) and 1 + 2^-7 (...0000001, odd): 1
    (1 + 2.0**-8, 1.0),
    # 1 + 3*2^-8 is half-way between 1 + 2^-7 (odd) and 1 + 2^-6 (...0000010, even): 1 + 2^-6
    (1 + 3 * 2.0**-8, 1 + 2.0**-6),
    # 1 + 5*2^-8: between 1 + 2^-6 (even) and 1 + 3*2^-7 (odd): 1 + 2^-6 (down this time)
    (1 + 5 * 2.0**-8, 1 + 2.0**-6),
    # just above / below the half-way point: no tie, nearest wins (the float32 double-rounding
    # pitfall of C1: 1 + 2^-8 + 2^-40 through float32 becomes 1 + 2^-8, then 1.0)
    (1 + 2.0**-8 + 2.0**-40, 1 + 2.0**-7),
    (1 + 2.0**-8 - 2.0**-40, 1.0),
    # in [256, 512) the spacing is 2: 257 lies between 256 (even) and 258 (= 256 + 1*2, odd) -> 256;
    # 259 between 258 (odd) and 260 (= 256 + 2*2, even) -> 260
    (257.0, 256.0),
    (259.0, 260.0),
    # subnormals: q = 2^-133. 0.5 q between 0 (even) and q (odd) -> 0; 1.5 q between q (odd) and
    # 2q (even) -> 2q = 2^-132; 2.5 q between 2q (even) and 3q -> 2q
    (2.0**-134, 0.0),
    (3 * 2.0**-134, 2.0**-132),
    (5 * 2.0**-134, 2.0**-132),
    # largest subnormal 127 q, smallest normal 128 q = 2^-126: 127.5 q -> 128 q (even)
    (127.5 * 2.0**-133, 2.0**-126),
    # overflow edge: max = 255 * 2^120 (odd significand); 255.5 * 2^120 is half-way to 2^128
    # (even), which does not exist in BF16: +inf. A hair below the half-way point stays at max.
    (255.5 * 2.0**120, INF),
    (255.5 * 2.0**120 - 2.0**90, 255 * 2.0**120),
    (255 * 2.0**120, 255 * 2.0**120),
]

FP16_HAND = [
    # 1 + 2^-11: between 1 (even) and 1 + 2^-10 (odd) -> 1; 1 + 3*2^-11 -> 1 + 2^-9 (even)
    (1 + 2.0**-11, 1.0),
    (1 + 3 * 2.0**-11, 1 + 2.0**-9),
    (1 + 2.0**-11 + 2.0**-40, 1 + 2.0**-10),
    # in [2048, 4096) the spacing is 2: 2049 -> 2048 (even), 2051 -> 2052 (2048 + 2*2, even)
    (2049.0, 2048.0),
    (2051.0, 2052.0),
    # subnormals: q = 2^-24. 0.5 q -> 0; 1.5 q -> 2q = 2^-23; 2.5 q -> 2q
    (2.0**-25, 0.0),
    (3 * 2.0**-25, 2.0**-23),
    (5 * 2.0**-25, 2.0**-23),
    # largest subnormal 1023 q, smallest normal 1024 q = 2^-14: 1023.5 q -> 2^-14
    (1023.5 * 2.0**-24, 2.0**-14),
    # overflow edge: max 65504 = 2047 * 32 (odd); 65520 = 2047.5 * 32 is half-way to 65536 (even,
    # not representable): +inf. 65519 is below the half-way point: 65504.
    (65520.0, INF),
    (65519.0, 65504.0),
    (65504.0, 65504.0),
]

FP32_HAND = [
    # 1 + 2^-24: between 1 (even) and 1 + 2^-23 (odd) -> 1; 1 + 3*2^-24 -> 1 + 2^-22 (even)
    (1 + 2.0**-24, 1.0),
    (1 + 3 * 2.0**-24, 1 + 2.0**-22),
    (1 + 2.0**-24 + 2.0**-50, 1 + 2.0**-23),  # 2^-50: float64 holds it at 1 (spacing 2^-52)
    # in [2^24, 2^25) the spacing is 2: 2^24 + 1 -> 2^24 (even); 2^24 + 3 -> 2^24 + 4 (even)
    (2.0**24 + 1, 2.0**24),
    (2.0**24 + 3, 2.0**24 + 4),
    # subnormals: q = 2^-149. 0.5 q -> 0; 1.5 q -> 2q = 2^-148; 2.5 q -> 2q
    (2.0**-150, 0.0),
    (3 * 2.0**-150, 2.0**-148),
    (5 * 2.0**-150, 2.0**-148),
    # smallest normal 2^-126 = 2^23 q: (2^23 - 0.5) q -> 2^23 q (even)
    ((2.0**23 - 0.5) * 2.0**-149, 2.0**-126),
    # overflow edge: max (2^24 - 1) 2^104 (odd); (2^24 - 0.5) 2^104 is half-way to 2^128: +inf
    ((2.0**24 - 0.5) * 2.0**104, INF),
    ((2.0**24 - 0.5) * 2.0**104 - 2.0**76, (2.0**24 - 1) * 2.0**104),  # float64 spacing there: 2^75
]

HAND = {"bf16": BF16_HAND, "fp16": FP16_HAND, "fp32": FP32_HAND}
FUNC = {"bf16": to_bf16, "fp16": to_fp16, "fp32": to_fp32}


def _signed(table):
    """Each pair and its mirror: round-to-nearest-even is symmetric, so -x rounds to -y."""
    return [(x, y) for x, y in table] + [(-x, -y) for x, y in table]


@pytest.mark.parametrize("fmt", ["bf16", "fp16", "fp32"])
def test_hand_rounding_values_both_signs(fmt):
    xs, want = zip(*_signed(HAND[fmt]))
    got = FUNC[fmt](np.array(xs))
    for x, g, w in zip(xs, got.tolist(), want):
        assert g == w, f"{fmt}: {x!r} -> {g!r}, want {w!r}"
    # round_to with the format name is the same function the Ops reach through represent()
    np.testing.assert_array_equal(round_to(np.array(xs), fmt), got)


@pytest.mark.parametrize("fmt", ["bf16", "fp16", "fp32"])
def test_half_way_below_the_smallest_subnormal_keeps_its_sign(fmt):
    # 0.5 q rounds to zero (the even neighbour), and -0.5 q to -0: the sign of zero survives
    q = numerics.get_format(fmt).min_quantum
    got = FUNC[fmt](np.array([0.5 * q, -0.5 * q]))
    assert got.tolist() == [0.0, 0.0]
    assert np.signbit(got).tolist() == [False, True]


@pytest.mark.parametrize("fmt", ["bf16", "fp16", "fp32"])
def test_non_finite_values_pass_through(fmt):
    got = FUNC[fmt](np.array([INF, -INF, np.nan]))
    assert got[0] == INF and got[1] == -INF and np.isnan(got[2])


def test_half_way_ties_are_counted_even_not_away_from_zero():
    """A run of consecutive half-way points in each format: round-half-to-even alternates down, up,
    down, up (the odd neighbour is skipped), so the results are each a multiple of 2 spacings.
    Half away from zero would round every positive one up (+1 spacing each)."""
    for fmt, p in (("bf16", 8), ("fp16", 11), ("fp32", 24)):
        q = 2.0 ** (1 - p)  # spacing in [1, 2)
        xs = 1 + (np.arange(20) + 0.5) * q  # 1 + 0.5q, 1 + 1.5q, ..., 1 + 19.5q
        got = (FUNC[fmt](xs) - 1) / q  # integers: k for the half-way point k + 0.5 rounds to k or k + 1
        want = [k if k % 2 == 0 else k + 1 for k in range(20)]
        assert got.tolist() == want, fmt


# --- oracles outside the reference --------------------------------------------------------------


def _np_cast(x, dtype):
    with np.errstate(over="ignore"):
        return np.asarray(x, np.float64).astype(dtype).astype(np.float64)


finite64 = st.floats(allow_nan=False, allow_infinity=False, width=64)


def _half_way(p, emin, emax):
    """Exact half-way (and one-hair-off) float64 values of a p-bit format: (m + 1/2 + t) 2^e with an
    integer significand m of p bits (or fewer: subnormals), t in {0, +-2^-20}."""
    return st.builds(
        lambda m, e, t, s: s * (m + 0.5 + t) * 2.0 ** (e - p + 1),
        st.integers(0, 2**p - 1),
        st.integers(emin, emax + 1),
        st.sampled_from([0.0, 0.0, 2.0**-20, -(2.0**-20)]),
        st.sampled_from([1.0, -1.0]),
    )


@settings(max_examples=300, deadline=None)
@given(st.one_of(finite64, _half_way(24, -126, 127)))
def test_fp32_equals_numpy_cast(x):
    # NumPy's float64 -> float32 cast is one IEEE round-to-nearest-even (overflow to inf)
    assert to_fp32(np.array([x]))[0] == _np_cast([x], np.float32)[0]


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.floats(-1e6, 1e6, allow_nan=False), _half_way(11, -14, 15)))
def test_fp16_equals_numpy_cast(x):
    # NumPy's float64 -> float16 conversion rounds the double's bits once (RNE, overflow to inf)
    assert to_fp16(np.array([x]))[0] == _np_cast([x], np.float16)[0]


float32_bits = st.one_of(
    st.integers(0, 2**32 - 1),
    # a BF16 pattern with its low half exactly half-way (0x8000) or one bit either side
    st.builds(lambda hi, lo: (hi << 16) | lo, st.integers(0, 2**16 - 1), st.sampled_from([0x8000, 0x7FFF, 0x8001])),
)


@settings(max_examples=300, deadline=None)
@given(float32_bits)
def test_bf16_of_float32_equals_ml_dtypes(bits):
    # ml_dtypes rounds a float32 to bfloat16 once (RNE): an exact oracle for float32 inputs
    x = np.array([bits], np.uint32).view(np.float32)
    if np.isnan(x[0]):
        return
    want = x.astype(ml_dtypes.bfloat16).astype(np.float64)
    np.testing.assert_array_equal(to_bf16(x.astype(np.float64)), want)
    # the storage array holds the same bit pattern ml_dtypes makes
    assert storage(x.astype(np.float64), "bf16").view(np.uint16)[0] == x.astype(ml_dtypes.bfloat16).view(np.uint16)[0]


@settings(max_examples=300, deadline=None)
@given(st.one_of(finite64, _half_way(8, -126, 127)))
def test_bf16_is_one_rounding_of_float64(x):
    """For any float64 x: to_bf16(x) is a BF16 value (an ml_dtypes fixed point), at most half a
    spacing from x, and at exactly half a spacing it is the even one (last significand bit 0).
    The half-way values 2^-20 spacings off are the double-rounding trap: 2^-20 of a BF16 spacing
    is 2^-4 of a float32 spacing, which a cast to float32 rounds away, so a conversion through
    float32 lands on the tie and may go the wrong way; one rounding from float64 never does."""
    y = float(to_bf16(np.array([x]))[0])
    if math.isinf(y):
        assert abs(x) >= 255.5 * 2.0**120
        return
    assert float(np.float64(y).astype(ml_dtypes.bfloat16)) == y
    q = float(numerics.quantum(y, "bf16")) if y != 0 else 2.0**-133
    qx = float(numerics.quantum(x, "bf16"))
    err = abs(x - y)
    assert err <= 0.5 * max(q, qx)
    if err == 0.5 * qx and err > 0:
        assert (np.array([y]).astype(ml_dtypes.bfloat16).view(np.uint16)[0] & 1) == 0, (x, y)
