"""Verdict v2 (CONTRACTS C2 v2): three verdicts for represented outputs, the envelope's
magnitudes by hand and against the reference, the bias check, and the platform-stable
baseline (C8). Every number below is derived next to its assertion."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance import registry
from conformance.compare import Result, _represented, bias
from conformance.registry import REPRESENTED, Output
from reference import magnitude as mg
from reference import numerics, precision, scales
from reference.draft_layer import forward
from reference.grouped_conv import finish_raw
from reference.norms import plain_head_rmsnorm, rope_1d

Y = Output("y", REPRESENTED, "bf16")
ENV = {"bound_ulp": 1.0, "bound_norm": 2.0**-8, "envelope": {"k": 8.0, "n": 4.0}}
U = 2.0**-8


def _judge(out, ref, s, bound=ENV):
    ref = np.asarray(ref, np.float64)
    return _represented(Y, ref, np.asarray(out, np.float64), np.ones(ref.shape, bool), bound, np.asarray(s, float))


# --- the three verdicts, by hand ---------------------------------------------------------------


def test_cancellation_point_inside_the_envelope_is_acceptable_precision():
    # ref 2^-7 formed from terms of magnitude 1 (s = 1): an error of 2 u = 2^-7 is 128 BF16 ulps at
    # 2^-7 (ulp there 2^-14; tight bound 1) but 2 u*s, inside K = 8
    v = _judge([1.0, 2.0**-7 + 2.0**-7], [1.0, 2.0**-7], [1.0, 1.0])
    assert v.result == Result.ACCEPTABLE and v.flags == ("precision",)
    assert v.numbers["envelope_frac"] == pytest.approx(max(2 / 8, np.sqrt(2) / 4))  # 2 u*s of K = 8; normwise 2^-7/(u sqrt 2) = 1.41 of N = 4
    assert "precision: outside the tight bound" in v.detail


def test_outside_the_envelope_fails_and_inside_the_tight_bound_passes():
    assert _judge([1.0, 2.0**-7 + 9 * U], [1.0, 2.0**-7], [1.0, 1.0]).result == Result.FAIL  # 9 u*s > 8
    v = _judge([1.0, 2.0**-7], [1.0, 2.0**-7], [1.0, 1.0])
    assert v.result == Result.PASS and v.numbers["envelope_frac"] == 0.0


def test_an_element_with_no_magnitude_must_be_exact():
    # s = 0 (a cache row the Op only copies): any change is outside every envelope
    assert _judge([1.0, 2.0], [1.0, 2.0 + 2.0**-6], [1.0, 0.0]).result == Result.FAIL


def test_normwise_envelope_catches_a_spread_error():
    # every element off by 5 u*s: componentwise 5 <= 8, normwise 5 > 4
    ref = np.full(16, 0.25)
    assert _judge(ref + 5 * U, ref, np.ones(16)).result == Result.FAIL
    assert _judge(ref + 3 * U * np.resize([1, -1], 16), ref, np.ones(16)).result == Result.ACCEPTABLE


def test_non_finite_mismatch_fails_whatever_the_envelope():
    v = _judge([1.0, np.inf], [1.0, 2.0], [1.0, 1e30])
    assert v.result == Result.FAIL and "non-finite" in v.detail


def test_truncation_fails_the_bias_check_and_rounding_noise_does_not():
    rng = np.random.default_rng(7)
    exact = rng.uniform(0.5, 2.0, (20, 20)) * rng.choice([-1, 1], (20, 20))
    ref = numerics.to_bf16(exact)
    bits = np.abs(exact).astype(np.float32).view(np.uint32) & np.uint32(0xFFFF0000)
    trunc = np.sign(exact) * bits.view(np.float32).astype(np.float64)
    mean, se, n, rows = bias(trunc, ref, np.ones(ref.shape, bool), "bf16")
    # about half the elements one quantum toward zero, every row alike: far beyond 6 standard errors
    assert n == 400 and rows == 20 and mean < -0.25 and abs(mean) > 6 * se
    v = _judge(trunc, ref, np.abs(ref))
    assert v.result == Result.FAIL and "systematic bias" in v.detail
    # a legitimate second rounding of independent noise: one quantum either way at random
    noisy = ref + rng.choice([-1, 0, 0, 1], ref.shape) * numerics.quantum(ref, "bf16")
    assert _judge(noisy, ref, 2 * np.abs(ref)).result != Result.FAIL


def test_a_shared_error_per_row_is_not_a_bias_of_the_rounding():
    # 4 rows whose elements all moved toward zero together (a row's BF16 softmax weights summing
    # below 1): mean -0.5 quantum, but 4 rows are 4 samples, not 128 (BIAS_MIN_ROWS)
    rng = np.random.default_rng(3)
    ref = numerics.to_bf16(rng.uniform(0.5, 2.0, (4, 32)))
    shrunk = ref - numerics.quantum(ref, "bf16") * (rng.random((4, 32)) < 0.5)
    assert _judge(shrunk, ref, np.abs(ref)).result != Result.FAIL
    # the same on 16 rows, every one of them shrunk: a bias
    ref16 = numerics.to_bf16(rng.uniform(0.5, 2.0, (16, 32)))
    shrunk16 = ref16 - numerics.quantum(ref16, "bf16") * (rng.random((16, 32)) < 0.5)
    assert _judge(shrunk16, ref16, np.abs(ref16)).result == Result.FAIL


def test_ftz_of_a_subnormal_is_inside_every_envelope():
    out = _represented(Output("p", REPRESENTED, "fp32"), np.array([1e-40, 0.5]), np.array([0.0, 0.5]),
                       np.ones(2, bool), {"bound_ulp": 1.0, "bound_norm": 2.0**-24,
                                          "envelope": {"k": 8.0, "n": 4.0}}, np.array([0.0, 0.5]))
    assert out.result == Result.ACCEPTABLE  # 1e-40 < 2^-126: flushed to zero legitimately


# --- magnitudes by hand -------------------------------------------------------------------------


def test_linear_of_exact_inputs_is_its_result_and_its_accumulation():
    x, w = np.array([[1.0, -1.0 + 2.0**-7]]), np.array([[1.0, 1.0]])
    y = mg.linear(mg.exact(x), w)
    assert y.v[0, 0] == 2.0**-7
    # rss(|y|, ACC * sum|w x|) = rss(2^-7, 4 * 2^-16 * (2 - 2^-7))
    assert y.s[0, 0] == pytest.approx(np.hypot(2.0**-7, 4 * 2.0**-16 * (2 - 2.0**-7)))


def test_angle_budget_ends_at_2p24():
    # below 2^24 an FP32 position is exact: 4 |p f| 2^-24 / 2^-8; from 2^24 on nothing is legitimate
    b = mg.angle_budget(np.array([2**24 - 1, 2**24]), 4, 1e6)
    assert b[0, 0] == pytest.approx(4 * (2**24 - 1) * 2.0**-16) and b[1, 0] == 0.0


def test_conv_s_holds_the_split_coefficient_v3():
    # base + delta = 2^-7 at tap 0 (base 1, delta -1 + 2^-7), z = 1, W = 1 (tap 0 only), exact delta:
    # C2 v3 s = rss(|z| (|base| + |delta|), |coef z|) = rss(2 - 2^-7, 2^-7): the coefficient's split,
    # not only |coef| (v2: rss(2^-7, 2^-7) = sqrt(2) 2^-7)
    base = np.zeros((2, 16))
    base[0] = 1.0
    delta = np.zeros((1, 1, 2, 1))
    delta[0, 0, 0, 0] = -1.0 + 2.0**-7
    z = np.ones((1, 1, 16))
    out = mg.conv(mg.exact(z), base, mg.exact(delta), 16)
    assert np.allclose(out.v, 2.0**-7) and np.allclose(out.s, np.hypot(2 - 2.0**-7, 2.0**-7))
    # the products rounded separately (z-lab) err by at most u (|base z| + |delta z| + |coef z|) = 2 u here,
    # 1.004 u s: inside K = 8 with room (v2's s put it at 2 u / (sqrt(2) 2^-7 u) = 181 u s)
    zlab = U * (1 + (1 - 2.0**-7) + 2.0**-7)
    assert zlab / (U * out.s[0, 0, 0]) <= 1.01
    # a finish delta taken as a rounding point (an FP32-delta finish, C2 v3) adds |z| |delta| in quadrature
    fin = mg.conv(mg.exact(z), base, mg.rounded(delta), 16)
    assert np.allclose(fin.s, np.sqrt((1 - 2.0**-7) ** 2 + (2 - 2.0**-7) ** 2 + 2.0**-14))


# --- the tracked forward is the reference (an independent formulation) -------------------------


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 2**40), st.integers(1, 6), st.sampled_from([1, 2]))
def test_tracked_context_k_equals_the_reference(start, rows, hk):
    rng = np.random.default_rng(start % 1000 + rows)
    d, h = 16, 32
    c = numerics.to_bf16(rng.standard_normal((rows, h)))
    wk = numerics.to_bf16(rng.standard_normal((hk * d, h)) / 6)
    norm = numerics.to_bf16(rng.uniform(0.5, 1.5, d))
    pos = start + np.arange(rows)
    ref = rope_1d(plain_head_rmsnorm((c @ wk.T).reshape(rows, hk, d), norm, 1e-6, d), pos, 1e4)
    k = mg.rope(mg.rmsnorm(mg.linear(mg.exact(c), wk).reshape(rows, hk, d), norm, 1e-6), pos, 1e4)
    assert np.allclose(k.v, ref, rtol=1e-12, atol=1e-12)
    assert np.all(k.s >= np.abs(k.v) * (1 - 1e-12))  # s is never below the value's own rounding


@pytest.mark.parametrize("op", ["draft_layer", "masked_block"])
def test_tracked_layer_chain_equals_the_reference_forward(op):
    spec = registry.get(op)
    for case in spec.generate()[:6]:
        kw = case.kwargs()
        if op == "draft_layer":
            x = mg.exact(kw["x"])
            args = {k: v for k, v in kw.items() if k != "x"}
            tracked = scales.layer(x, **args)
            assert np.allclose(tracked.v, forward(**kw), rtol=1e-9, atol=1e-9), case.id
        s = scales.__dict__[op](kw, spec.reference(**kw))
        name = spec.outputs[0].name
        assert s[name].shape == np.shape(spec.reference(**kw)[name]) and np.all(np.isfinite(s[name])), case.id


def test_grouped_conv_finish_follows_the_implementations_delta():
    spec = registry.get("grouped_conv")
    case = spec.generate()[0]
    kw = case.kwargs()
    ref = spec.reference(**kw)
    mine = dict(ref)
    mine["finish_delta"] = numerics.storage(numerics.to_bf16(np.asarray(ref["finish_delta"], float) * (1 + 2.0**-7)),
                                            "bf16")  # a one-ulp-ish different delta
    mine["finished"] = numerics.storage(finish_raw(kw["z"], kw["base"], np.asarray(mine["finish_delta"], float)),
                                        "bf16")
    followed = spec.follow(kw, mine)
    assert np.array_equal(np.asarray(followed["finished"], float), np.asarray(mine["finished"], float))


# --- the baseline does not depend on summation order (C8) ---------------------------------------


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 64), st.integers(0, 10_000))
def test_baseline_matmul_is_order_independent(n, seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((3, n)).astype(np.float32)
    b = rng.standard_normal((n, 5)).astype(np.float32)
    perm = rng.permutation(n)
    with precision.baseline():
        y = precision.matmul(a, b)
        y_perm = precision.matmul(a[:, perm], b[perm])
        e = precision.exp(a)
    assert y.dtype == np.float32 and np.array_equal(y, y_perm)
    assert np.array_equal(y, (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32))
    assert np.array_equal(e, np.exp(a.astype(np.float64)).astype(np.float32))


def test_registry_envelopes_cover_every_represented_output():
    for name, spec in registry.ops().items():
        for o in spec.outputs:
            if o.cls == REPRESENTED:
                assert o.name in spec.envelope and spec.scales is not None, f"{name}.{o.name} has no envelope"
                env = spec.envelope[o.name]
                assert env.k > 0 and env.n > 0 and len(env.why) > 40
