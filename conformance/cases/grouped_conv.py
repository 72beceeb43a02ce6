"""Cases for grouped_conv (DFlash2 dynamic grouped convolution; docs/ops.md sweep: H a
multiple of 16 from 16 up, W = 1 and W = 16, large deltas).

Pitfall cases put the bug far outside the derived bound (C2):
- conv_col0_tap: column 0 reading a preceding tap (the last column by wrap-around,
  or a nonzero pad). The tap-1 coefficient is large and the last column is large,
  the column-0 answer small.
- conv_delta_per_channel: delta indexed by channel instead of shared per group of
  16. Group deltas are large and far apart, base coefficients small.
Deltas in the pitfall cases are exactly representable in BF16, so the "delta"
intermediate (which a kernel may keep in BF16) does not widen their bound.

Cancellation cases (no pitfall: C2 v3 makes both forms they probe legitimate, so they
carry no flag and every legitimate control must give them no FAIL):
- coef_near_cancel: delta is -2^e exactly and base 2^e (1 + m 2^-7), so (base + delta)
  is small and exact in FP32 while BF16(base*x) carries up to 2^-9 |base x| of error:
  the products rounded separately land tens of ulps of the result away, inside the
  envelope's (|base| + |delta|) |x| term and outside the tight bound.
- coef_cancels: base = -BF16(delta) exactly on side 1 while the FP32 delta lies off the
  BF16 grid (delta = a + c, |c| = 2^-10 |a|, |a| 4 to 16): the reference's finished output
  is 0 wherever the coefficients cancel, and a finish with the FP32 delta gives c z there
  (above the tight bound), which only the v3 terms admit.
"""

from __future__ import annotations

import numpy as np

from conformance.registry import BF16_CHAIN, BF16_CONV_CHAIN, REPRESENTED, Case, OpSpec, Output, case_rng, register
from reference import scales
from reference.grouped_conv import GROUP, finish, grouped_conv
from reference.numerics import storage

OP = "grouped_conv"


def _case(case_id: str, x, z, base, proj, flags=()) -> Case:
    bf = {k: storage(v, "bf16") for k, v in {"x": x, "z": z, "base": base, "proj": proj}.items()}
    return Case(id=case_id, inputs=bf, flags=tuple(flags))


def _random(case_id: str, b: int, w: int, h: int, delta_scale: float = 1.0, base_scale: float = 0.5) -> Case:
    rng = case_rng(case_id)
    g = h // GROUP
    x = rng.standard_normal((b, w, h))  # a normalized branch input has rms ~ 1
    z = rng.standard_normal((b, w, h))
    base = rng.standard_normal((2, 2, h)) * base_scale
    # rows of proj have norm ~ delta_scale, so each delta ~ N(0, delta_scale^2)
    proj = rng.standard_normal((4 * g, h)) * (delta_scale / np.sqrt(h))
    return _case(case_id, x, z, base, proj)


def _exact_delta_proj(h: int, d) -> np.ndarray:
    """proj reading channel 0 only: with x[..., 0] = 1, delta[s,t,g] = d[s,t,g] exactly."""
    g = h // GROUP
    proj = np.zeros((4 * g, h))
    proj[:, 0] = np.asarray(d, dtype=np.float64).reshape(4 * g)
    return proj


def col0_tap(case_id: str, b: int, w: int, h: int) -> Case:
    """Small tap-0 terms everywhere, a large tap-1 coefficient, large last column:
    a wrap to column W-1 (or W = 1 reading itself) adds ~ 4 * 8 = 32 to column 0."""
    rng = case_rng(case_id)
    g = h // GROUP
    x = rng.uniform(0.5, 1.0, (b, w, h)) * rng.choice([-1, 1], (b, w, h))
    z = rng.uniform(0.5, 1.0, (b, w, h)) * rng.choice([-1, 1], (b, w, h))
    x[:, -1] *= 8.0
    z[:, -1] *= 8.0
    x[..., 0] = 1.0
    base = np.empty((2, 2, h))
    base[:, 0] = rng.uniform(0.125, 0.25, (2, h))
    base[:, 1] = rng.uniform(3.0, 4.0, (2, h))
    d = np.zeros((2, 2, g))
    d[:, 1] = rng.uniform(0.5, 1.0, (2, g))  # same sign as base: the tap stays large
    return _case(case_id, x, z, base, _exact_delta_proj(h, d), ("conv_col0_tap",))


def delta_per_channel(case_id: str, b: int, w: int, h: int) -> Case:
    """Group deltas 4 apart per group (and per side and tap), base small: channel c
    read with delta[c mod G] (or any per-channel index) is off by O(4 |x|)."""
    rng = case_rng(case_id)
    g = h // GROUP
    x = rng.standard_normal((b, w, h))
    z = rng.standard_normal((b, w, h))
    x[..., 0] = 1.0
    base = rng.standard_normal((2, 2, h)) * 0.125
    steps = 4.0 * (np.arange(g) - (g - 1) / 2.0)  # distinct groups, spread 4 apart
    d = np.stack([np.stack([steps, -steps[::-1] + 1.0]), np.stack([steps + 2.0, -steps])])  # [2 sides, 2 taps, G]
    return _case(case_id, x, z, base, _exact_delta_proj(h, d), ("conv_delta_per_channel",))


def coef_near_cancel(case_id: str, b: int, w: int, h: int) -> Case:
    """base = 2^e (1 + m 2^-7) with m in 1..4 and delta = -2^e: the coefficient
    m 2^(e-7) is exact in FP32, and so are its products with BF16 x; rounding
    base*x to BF16 on its own costs up to 2^-9 |base x| = 2^-2/m of the result."""
    rng = case_rng(case_id)
    g = h // GROUP
    x = rng.uniform(1.0, 2.0, (b, w, h)) * rng.choice([-1, 1], (b, w, h))
    z = rng.uniform(1.0, 2.0, (b, w, h)) * rng.choice([-1, 1], (b, w, h))
    x[..., 0] = 1.0
    e = rng.integers(-1, 3, (2, 2, g)).astype(np.float64)
    m = rng.integers(1, 5, (2, 2, h)).astype(np.float64)
    base = np.exp2(np.repeat(e, GROUP, axis=-1)) * (1.0 + m * 2.0**-7)
    return _case(case_id, x, z, base, _exact_delta_proj(h, -np.exp2(e)))


def coef_cancels(case_id: str, b: int, w: int, h: int) -> Case:
    """Channels 0 and 1 of x are 1 and proj reads only them: delta[s,t,g] = a + c exactly in
    FP32, a = +-2^e (e in 2..4), c = +-2^(e-10), so BF16(delta) = a (c is under half a BF16 spacing) while
    the FP32 delta is not a BF16 value. base = -a on side 1 for tap 0 in every group and for
    tap 1 in the even groups (the odd ones keep base = 2a, no cancellation): the reference's
    finished output, computed from the BF16 finish delta, is exactly 0 in column 0 and in the
    even groups of every column. Side 0 gets base = -a too, so the prepared coefficient is c
    (in the reference) or 0 (with a BF16 delta intermediate): a legitimate near-cancellation
    the delta's own term already covers."""
    rng = case_rng(case_id)
    g = h // GROUP
    x = rng.uniform(1.0, 2.0, (b, w, h)) * rng.choice([-1, 1], (b, w, h))
    z = rng.uniform(1.0, 2.0, (b, w, h)) * rng.choice([-1, 1], (b, w, h))
    x[..., 0] = x[..., 1] = 1.0
    # |c z| > 2^-8, beyond the tight bound's one spacing at 0: an FP32-delta finish is judged by the envelope
    e = rng.integers(2, 5, (2, 2, g)).astype(np.float64)
    a = np.exp2(e) * rng.choice([-1, 1], (2, 2, g))
    c = np.exp2(e - 10) * rng.choice([-1, 1], (2, 2, g))
    proj = np.zeros((4 * g, h))
    proj[:, 0], proj[:, 1] = a.reshape(4 * g), c.reshape(4 * g)
    keep = -a
    keep[1, 1, 1::2] = 2 * a[1, 1, 1::2]  # odd groups' tap 1 does not cancel
    base = np.repeat(keep, GROUP, axis=-1)
    return _case(case_id, x, z, base, proj)


def tap_layout(case_id: str, b: int, w: int, h: int) -> Case:
    """The conv family's layout variants (the taps' coefficients exchanged, the second tap reading
    column i + 1, the delta read group-major): ordinary inputs show each, so x and z are random and
    every delta (exact in BF16, distinct per side, tap and group) and base coefficient is O(1)."""
    rng = case_rng(case_id)
    g = h // GROUP
    x = rng.standard_normal((b, w, h))
    z = rng.standard_normal((b, w, h))
    x[..., 0] = 1.0
    base = rng.standard_normal((2, 2, h)) * 0.5
    d = storage(rng.standard_normal((2, 2, g)), "bf16").astype(np.float64)
    return _case(case_id, x, z, base, _exact_delta_proj(h, d), ("conv_tap_layout",))


def generate() -> list[Case]:
    cases = [
        _random(f"{OP}/H{h}_W{w}_B{b}", b, w, h)
        for b, w, h in [
            (1, 1, 16),
            (1, 16, 16),
            (2, 3, 16),
            (2, 2, 32),
            (1, 16, 32),
            (1, 1, 48),
            (3, 5, 48),
            (1, 16, 48),
            (2, 7, 64),
            (1, 1, 128),
            (2, 16, 128),
            (4, 4, 128),
        ]
    ]
    cases += [
        _random(f"{OP}/large_delta_x100_H64_W16", 1, 16, 64, delta_scale=100.0),
        _random(f"{OP}/large_delta_x1e4_H32_W3", 2, 3, 32, delta_scale=1e4),
        _random(f"{OP}/large_delta_x100_H16_W1", 2, 1, 16, delta_scale=100.0),
        _random(f"{OP}/base_only_H32_W4", 1, 4, 32, delta_scale=0.0),
        _random(f"{OP}/delta_only_H48_W4", 1, 4, 48, base_scale=0.0),
        col0_tap(f"{OP}/conv_col0_tap__wrap_H32_W16", 2, 16, 32),
        col0_tap(f"{OP}/conv_col0_tap__wrap_H16_W2", 1, 2, 16),
        col0_tap(f"{OP}/conv_col0_tap__W1_H48", 3, 1, 48),
        delta_per_channel(f"{OP}/conv_delta_per_channel__H64_W4", 2, 4, 64),
        delta_per_channel(f"{OP}/conv_delta_per_channel__H128_W16", 1, 16, 128),
        coef_near_cancel(f"{OP}/coef_near_cancel_H32_W8", 2, 8, 32),
        coef_near_cancel(f"{OP}/coef_near_cancel_H128_W16", 1, 16, 128),
        coef_cancels(f"{OP}/coef_cancels_fp32_delta_H32_W8", 2, 8, 32),
        coef_cancels(f"{OP}/coef_cancels_fp32_delta_H16_W1", 3, 1, 16),
    ]
    cases += [tap_layout(f"{OP}/conv_tap_layout__H48_W8_B2", 2, 8, 48)]
    return cases


def follow(kwargs, impl):
    """``finished`` from the implementation's own finish delta (a represented output it hands
    from prepare to finish): a legitimate one-ulp difference there is not finish's error."""
    delta = np.asarray(impl["finish_delta"], np.float64)
    out = dict(grouped_conv(**kwargs))
    out["finish_delta"] = delta
    out["finished"] = finish(kwargs["z"], kwargs["base"], delta)
    return out


SPEC = register(
    OpSpec(
        name=OP,
        reference=grouped_conv,
        inputs=("x", "z", "base", "proj"),
        outputs=(
            Output("prepared", REPRESENTED, "bf16"),
            Output("finish_delta", REPRESENTED, "bf16"),
            Output("finished", REPRESENTED, "bf16"),
        ),
        generate=generate,
        # the side-0 coefficients are a private intermediate of the fused prepare:
        # a kernel may hold them in BF16 (spec: "projected coefficients are private")
        bf16_intermediates=frozenset({"delta"}),
        envelope={"prepared": BF16_CONV_CHAIN, "finish_delta": BF16_CHAIN, "finished": BF16_CONV_CHAIN},
        scales=scales.grouped_conv,
        follow=follow,
        followed=("finish_delta",),
        doc="DFlash2 dynamic grouped conv: prepare (BF16 prepared, BF16 finish delta) and finish",
    )
)
