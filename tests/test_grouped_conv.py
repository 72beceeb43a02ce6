"""grouped_conv: a hand-derived conv, the spec's loop against the vectorized module,
column 0 without a preceding tap, no state across calls, the cases and their pitfalls."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from conformance.cases import grouped_conv as cases
from conformance.compare import Result
from conformance.controls import variants
from reference import numerics, precision
from reference.grouped_conv import GROUP, grouped_conv
from reference.numerics import storage, to_bf16

BF16_U = 2.0**-8  # unit roundoff of BF16 (8 significant bits)


def bf(x):
    return storage(np.asarray(x, dtype=np.float64), "bf16")


# -- hand-derived ---------------------------------------------------------------------------------


def test_hand_H16_W3():
    """B = 1, W = 3, H = 16 (one group). x[i, j] = a_i for j < 8 and -a_i for j >= 8, a = (1, 2, -0.5);
    z[i, j] = i + 1. proj reads one channel per row, so
        delta[i, 0, 0] = 0.5 x[i, 0], delta[i, 0, 1] = 0.25 x[i, 1],
        delta[i, 1, 0] = -x[i, 0],    delta[i, 1, 1] = 2 x[i, 15]:
        column 0: (0.5, 0.25 | -1, -2); column 1: (1, 0.5 | -2, -4); column 2: (-0.25, -0.125 | 0.5, 1).
    base[0, 0, j] = 1 + j/16, base[0, 1, j] = 0.5, base[1, 0, j] = j/8, base[1, 1, j] = -0.25.

    prepared[i, j] = (base00_j + d[i,0,0]) x[i, j] + 1{i>=1} (0.5 + d[i,0,1]) x[i-1, j]:
        i = 0: (1.5 + j/16) * (+-1)                          = +-(1.5 + j/16)
        i = 1: (2 + j/16) * (+-2) + (0.5 + 0.5) * (+-1)      = +-(5 + j/8)
        i = 2, j < 8:  (0.75 + j/16)(-0.5) + (0.375)(2)      = 0.375 - j/32
        i = 2, j >= 8: (0.75 + j/16)(0.5) + (0.375)(-2)      = j/32 - 0.375
    finish_delta = the side-1 deltas (exact in BF16).
    finished[i, j] = (j/8 + fd[i,0]) z[i, j] + 1{i>=1} (-0.25 + fd[i,1]) z[i-1, j]:
        i = 0: (j/8 - 1) * 1                                 = j/8 - 1
        i = 1: (j/8 - 2) * 2 + (-0.25 - 4) * 1               = j/4 - 8.25
        i = 2: (j/8 + 0.5) * 3 + (-0.25 + 1) * 2             = 3j/8 + 3
    Every value has at most 7 significant bits, so BF16 holds it exactly.
    """
    j = np.arange(16.0)
    sign = np.where(j < 8, 1.0, -1.0)
    a = np.array([1.0, 2.0, -0.5])
    x = (a[:, None] * sign)[None]
    z = np.broadcast_to(np.array([1.0, 2.0, 3.0])[:, None], (3, 16))[None]
    proj = np.zeros((4, 16))
    proj[0, 0], proj[1, 1], proj[2, 0], proj[3, 15] = 0.5, 0.25, -1.0, 2.0
    base = np.stack([np.stack([1 + j / 16, np.full(16, 0.5)]), np.stack([j / 8, np.full(16, -0.25)])])

    out = grouped_conv(x=bf(x), z=bf(z), base=bf(base), proj=bf(proj))

    prepared = np.stack([sign * (1.5 + j / 16), sign * (5 + j / 8), np.where(j < 8, 0.375 - j / 32, j / 32 - 0.375)])
    finish_delta = np.array([[-1.0, -2.0], [-2.0, -4.0], [0.5, 1.0]])[None, :, :, None]
    finished = np.stack([j / 8 - 1, j / 4 - 8.25, 3 * j / 8 + 3])
    np.testing.assert_array_equal(out["prepared"], prepared[None])
    np.testing.assert_array_equal(out["finish_delta"], finish_delta)
    np.testing.assert_array_equal(out["finished"], finished[None])


def test_hand_finish_uses_represented_delta():
    """finish consumes prepare's BF16 delta, not the exact one. H = 16, W = 1:
    delta[0, 1, 0] = x0 * p = (1 + 3*2^-7)(1 + 2^-7) = 1 + 4*2^-7 + 3*2^-14 = 1.03143310546875,
    BF16 (spacing 2^-7) gives 1.03125. With base[1, 0] = -1 and z = 1 the coefficient is
    2^-5 = 0.03125 (exact in BF16); the unrounded delta would give 0.031433..., which BF16
    (spacing 2^-12 there) rounds to 0.031494140625."""
    x = np.zeros((1, 1, 16))
    x[..., 0] = 1 + 3 * 2.0**-7
    proj = np.zeros((4, 16))
    proj[2, 0] = 1 + 2.0**-7
    base = np.zeros((2, 2, 16))
    base[1, 0] = -1.0
    out = grouped_conv(x=bf(x), z=bf(np.ones((1, 1, 16))), base=bf(base), proj=bf(proj))
    assert out["finish_delta"][0, 0, 0, 0] == 1.03125
    np.testing.assert_array_equal(out["finished"], np.full((1, 1, 16), 0.03125))


# -- the spec's loop against the vectorized module -----------------------------------------------


def spec_loop(x, z, base, proj):
    """Conv_s(X)[b,i,g,j] written out one element at a time, as the spec states it."""
    x, z, base, proj = (np.asarray(a, dtype=np.float64) for a in (x, z, base, proj))
    nb, w, h = x.shape
    ng = h // GROUP
    delta = np.zeros((nb, w, 2, 2, ng))
    for b in range(nb):
        for i in range(w):
            for s in range(2):
                for t in range(2):
                    for g in range(ng):
                        row = (s * 2 + t) * ng + g
                        delta[b, i, s, t, g] = sum(proj[row, c] * x[b, i, c] for c in range(h))
    fd = to_bf16(delta[:, :, 1])

    def conv(v, s, d):
        out = np.zeros_like(v)
        for b in range(nb):
            for i in range(w):
                for g in range(ng):
                    for j in range(GROUP):
                        c = g * GROUP + j
                        out[b, i, c] = (base[s, 0, c] + d[b, i, 0, g]) * v[b, i, c]
                        if i >= 1:
                            out[b, i, c] += (base[s, 1, c] + d[b, i, 1, g]) * v[b, i - 1, c]
        return out

    return {"prepared": to_bf16(conv(x, 0, delta[:, :, 0])), "finish_delta": fd, "finished": to_bf16(conv(z, 1, fd))}


@st.composite
def dyadic_inputs(draw, max_w=4, max_groups=3):
    """Small dyadic values (k/8, k/16): every product and sum below is exact in float64,
    so any two correct formulations agree bit for bit after the one BF16 rounding."""
    nb = draw(st.integers(1, 2))
    w = draw(st.integers(1, max_w))
    h = GROUP * draw(st.integers(1, max_groups))
    ints = st.integers(-16, 16)
    x = draw(hnp.arrays(np.int64, (nb, w, h), elements=ints)) / 8.0
    z = draw(hnp.arrays(np.int64, (nb, w, h), elements=ints)) / 8.0
    base = draw(hnp.arrays(np.int64, (2, 2, h), elements=ints)) / 8.0
    proj = draw(hnp.arrays(np.int64, (4 * h // GROUP, h), elements=st.integers(-8, 8))) / 16.0
    return {"x": bf(x), "z": bf(z), "base": bf(base), "proj": bf(proj)}


def assert_same(a, b):
    for k in ("prepared", "finish_delta", "finished"):
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


@settings(max_examples=40, deadline=None)
@given(dyadic_inputs())
def test_spec_loop_equals_module(kw):
    assert_same(grouped_conv(**kw), spec_loop(**kw))


@settings(max_examples=40, deadline=None)
@given(dyadic_inputs(), st.data())
def test_column0_ignores_preceding_columns(kw, data):
    """Prepending any columns P changes nothing after the first original column, and the
    first original column equals column 0 of the block alone: no tap reaches before it."""
    nb, _, h = kw["x"].shape
    n = data.draw(st.integers(1, 3))
    pre = data.draw(hnp.arrays(np.int64, (2, nb, n, h), elements=st.integers(-64, 64))) / 4.0
    alone = grouped_conv(**kw)
    longer = grouped_conv(
        x=np.concatenate([bf(pre[0]), kw["x"]], axis=1),
        z=np.concatenate([bf(pre[1]), kw["z"]], axis=1),
        base=kw["base"],
        proj=kw["proj"],
    )
    np.testing.assert_array_equal(longer["finish_delta"][:, n:], alone["finish_delta"])
    for k in ("prepared", "finished"):
        np.testing.assert_array_equal(longer[k][:, n + 1 :], alone[k][:, 1:], err_msg=k)
    # column 0 of the block alone equals the spec's i = 0 formula (tap-0 term only)
    loop = spec_loop(**{**kw, "x": kw["x"][:, :1], "z": kw["z"][:, :1]})
    np.testing.assert_array_equal(alone["prepared"][:, :1], loop["prepared"])
    np.testing.assert_array_equal(alone["finished"][:, :1], loop["finished"])


@settings(max_examples=20, deadline=None)
@given(dyadic_inputs(), dyadic_inputs())
def test_no_state_across_calls(a, b):
    """The second call on a block equals the first, whatever ran in between (no history
    across requests or rounds)."""
    first = grouped_conv(**a)
    grouped_conv(**b)
    assert_same(grouped_conv(**a), first)


# -- cases: determinism, coverage, budget ---------------------------------------------------------


@pytest.fixture(scope="module")
def generated():
    return cases.generate()


def test_generator_deterministic_and_ids_unique(generated):
    again = cases.generate()
    ids = [c.id for c in generated]
    assert len(set(ids)) == len(ids)
    assert ids == [c.id for c in again]
    for c, d in zip(generated, again):
        assert c.inputs.keys() == d.inputs.keys()
        for k in c.inputs:
            assert c.inputs[k].dtype == d.inputs[k].dtype
            assert c.inputs[k].tobytes() == d.inputs[k].tobytes(), (c.id, k)


def test_cases_cover_the_sweep(generated):
    assert 10 <= len(generated) <= 60
    hs = {c.inputs["x"].shape[2] for c in generated}
    ws = {c.inputs["x"].shape[1] for c in generated}
    assert {16, 32, 48, 128} <= hs and all(h % GROUP == 0 for h in hs)
    assert {1, 16} <= ws
    flags = {f for c in generated for f in c.flags}
    assert {"conv_col0_tap", "conv_delta_per_channel"} <= flags
    # the cancellation cases carry no flag: no pitfall since C2 v3, every legitimate form must pass them
    cancel = [c for c in generated if "coef_near_cancel" in c.id or "coef_cancels" in c.id]
    assert len(cancel) == 4 and not any(c.flags for c in cancel)
    for c in generated:
        assert c.op == "grouped_conv"
        assert set(c.inputs) == set(cases.SPEC.inputs)
        assert all(v.dtype == np.dtype(numerics.BF16.dtype) for v in c.inputs.values())
        for f in c.flags:
            assert f in c.id


def test_large_delta_cases_are_large(generated):
    big = [c for c in generated if "large_delta" in c.id]
    assert big
    for c in big:
        delta = grouped_conv(**c.kwargs())["finish_delta"]
        assert np.abs(delta).max() >= 100 * np.abs(np.asarray(c.inputs["base"], np.float64)).max()


def test_budget(generated):
    """Inputs plus BF16 outputs; the three Ops of this owner share 4 MB, this one takes <= 1 MB."""
    total = 0
    for c in generated:
        total += sum(v.nbytes for v in c.inputs.values())
        total += sum(2 * np.asarray(v).size for v in grouped_conv(**c.kwargs()).values())
    assert total <= 2**20


# -- pitfall cases: the buggy variant lands far outside the harness bound -------------------------


def conv_variant(v, base_side, delta_side, *, prev="zero", per_channel=False, separate=False, swap_taps=False):
    """A conv with one switch: prev = "wrap" (column 0 reads column W-1) or a nonzero pad value;
    per_channel: channel c uses delta[c mod G]; swap_taps: tap 0's coefficient on the previous column
    and tap 1's on the current one; separate (legitimate, C2 v3): every product and sum rounded to BF16."""
    nb, w, h = v.shape
    ng = h // GROUP
    vg = v.reshape(nb, w, ng, GROUP)
    if per_channel:
        d = delta_side[..., np.arange(h) % ng].reshape(nb, w, 2, ng, GROUP)
    else:
        d = np.broadcast_to(delta_side[..., None], (nb, w, 2, ng, GROUP))
    bs = base_side.reshape(1, 1, 2, ng, GROUP)
    if prev == "wrap":
        before = np.roll(vg, 1, axis=1)
    else:
        pad = 0.0 if prev == "zero" else float(prev)
        before = np.concatenate([np.full_like(vg[:, :1], pad), vg[:, :-1]], axis=1)
    cur, tap = (before, vg) if swap_taps else (vg, before)
    if separate:
        r = to_bf16
        out = r(r(r(bs[:, :, 0] * cur) + r(d[:, :, 0] * cur)) + r(r(bs[:, :, 1] * tap) + r(d[:, :, 1] * tap)))
    else:
        out = (bs[:, :, 0] + d[:, :, 0]) * cur + (bs[:, :, 1] + d[:, :, 1]) * tap
    return out.reshape(nb, w, h)


def buggy_op(x, z, base, proj, **bug):
    x, z, base, proj = (np.asarray(a, dtype=np.float64) for a in (x, z, base, proj))
    nb, w, h = x.shape
    delta = (x @ proj.T).reshape(nb, w, 2, 2, h // GROUP)
    fd = to_bf16(delta[:, :, 1])
    return {
        "prepared": to_bf16(conv_variant(x, base[0], delta[:, :, 0], **bug)),
        "finish_delta": fd,
        "finished": to_bf16(conv_variant(z, base[1], fd, **bug)),
    }


def harness_bounds(case):
    """C2: 2x the float32 baseline's max ULP error + 1 ulp, 2x its normwise error + u."""
    ref = grouped_conv(**case.kwargs())
    with precision.baseline(cases.SPEC.bf16_intermediates):
        base = grouped_conv(**case.kwargs())
    bounds = {}
    for o in cases.SPEC.outputs:
        ulp = 2 * numerics.ulp_error(base[o.name], ref[o.name], o.fmt).max() + 1
        nw = 2 * numerics.normwise_error(base[o.name], ref[o.name]) + BF16_U
        bounds[o.name] = (ulp, nw)
    return ref, bounds


PITFALL_BUGS = {
    "conv_col0_tap": [{"prev": "wrap"}, {"prev": 1.0}],
    "conv_delta_per_channel": [{"per_channel": True}],
}


@pytest.mark.parametrize("pitfall", sorted(PITFALL_BUGS))
def test_pitfall_cases_fail_their_bug(generated, pitfall):
    """Each pitfall case puts its bug at >= 4x both bounds on prepared and finished; the
    correct conv (the zero-pad variant) sits within them, so the variant machinery is sound."""
    targeted = [c for c in generated if pitfall in c.flags]
    assert targeted
    for c in targeted:
        ref, bounds = harness_bounds(c)
        ok = buggy_op(**c.kwargs())
        for name in ("prepared", "finished"):
            ulp_b, nw_b = bounds[name]
            assert numerics.ulp_error(ok[name], ref[name], "bf16").max() <= ulp_b
        for bug in PITFALL_BUGS[pitfall]:
            out = buggy_op(**c.kwargs(), **bug)
            for name in ("prepared", "finished"):
                ulp_b, nw_b = bounds[name]
                assert numerics.ulp_error(out[name], ref[name], "bf16").max() >= 4 * ulp_b, (c.id, bug, name)
                assert numerics.normwise_error(out[name], ref[name]) >= 4 * nw_b, (c.id, bug, name)


def test_pitfall_deltas_exact_in_bf16(generated):
    """The pitfall cases' deltas are BF16 values, so the BF16 "delta" intermediate the
    baseline may use costs nothing there and their bounds stay at one ulp."""
    for c in generated:
        if not c.flags:
            continue
        x = np.asarray(c.inputs["x"], np.float64)
        delta = x @ np.asarray(c.inputs["proj"], np.float64).T
        np.testing.assert_array_equal(to_bf16(delta), delta)
        _, bounds = harness_bounds(c)
        assert bounds["prepared"][0] == 1 and bounds["finished"][0] == 1, c.id


# -- C2 v3: the envelope admits the conv's legitimate forms, and only those -----------------------


class _Fixed:
    """An implementation that returns given grouped_conv outputs (BF16 storage)."""

    def __init__(self, **outputs):
        self.outputs = {k: storage(np.asarray(v, np.float64), "bf16") for k, v in outputs.items()}

    def grouped_conv(self, x, z, base, proj):
        return dict(self.outputs)


def _judge(impl, case):
    from conformance import fuzz, registry

    return fuzz.judge_with(impl, {"grouped_conv": registry.get("grouped_conv")})(case)


def _hand_case(case_id, base_side1_tap0, proj_side1_tap0, z):
    """B = 1, W = 1, H = 16 (one group): x = (1, 1, 0, ...), so delta[s, t] = proj row (2s + t) . (1, 1);
    side 0 and tap 1 are zero (prepared is exactly 0; W = 1 has no tap 1 anyway)."""
    from conformance.registry import Case

    x = np.zeros((1, 1, 16))
    x[..., :2] = 1.0
    base = np.zeros((2, 2, 16))
    base[1, 0] = base_side1_tap0
    proj = np.zeros((4, 16))
    proj[2, :2] = proj_side1_tap0
    return Case(id=f"grouped_conv/{case_id}", inputs={"x": bf(x), "z": bf(z[None, None]), "base": bf(base),
                                                      "proj": bf(proj)})


def _v2_verdict(case, impl_out, s):
    """``finished`` judged with a given s (the v2 rule's, by hand) through the same comparison."""
    from conformance.compare import _represented
    from conformance.registry import BF16_CONV_CHAIN, REPRESENTED, Output

    from conformance import generate, registry

    ref = np.asarray(grouped_conv(**case.kwargs())["finished"], np.float64)
    bound = generate.case_vector(registry.get("grouped_conv"), case).bounds["finished"]  # the vector's tight bound
    assert bound["envelope"]["k"] == BF16_CONV_CHAIN.k and bound["envelope"]["n"] == BF16_CONV_CHAIN.n
    out = np.asarray(impl_out, np.float64)
    return _represented(Output("finished", REPRESENTED, "bf16"), ref, out, np.ones(ref.shape, bool), bound, s)


def test_v3_fp32_finish_delta_where_the_coefficient_cancels_exactly():
    """base = 4; the FP32 delta is -4 + 2^-8 (proj (-4, 2^-8) on x = (1, 1)), its BF16 copy -4 (2^-8 is
    under half the BF16 spacing 2^-6 below 4). z_j = 1 + j/8 (BF16 values).
    Reference (with the BF16 finish delta): finished = (4 - 4) z = 0 exactly.
    An FP32-delta finish (coefficient form or z-lab's FP32 products, both exact here): 2^-8 z_j, a BF16 value,
    more than the tight bound's 1 ulp (the BF16 spacing at 0 is taken as 2^-8) for j >= 1.
    v3 s (reference.magnitude.conv, finish delta ``rounded``: s_d = |d| = 4): coefficient term
    rss(s_d, |b| + |d|) = rss(4, 8) = 4 sqrt 5, times |z|; |c| s_z = 0 and |c z| = 0: s_j = 4 sqrt(5) z_j.
    Error / (u s) = 2^-8 / (2^-8 4 sqrt 5) = 1 / (4 sqrt 5) = 0.112 per element: 0.014 of K = 8, and
    normwise the same ratio, 0.028 of N = 4: ACCEPTABLE(precision). v2 s: rss(|z| rss(0, |c|), |c z|) = 0:
    any output off the tight bound FAILs."""
    z = 1 + np.arange(16) / 8
    case = _hand_case("hand_fp32_delta_cancels", 4.0, [-4.0, 2.0**-8], z)
    ref = grouped_conv(**case.kwargs())
    assert np.all(np.asarray(ref["finished"], np.float64) == 0)
    np.testing.assert_array_equal(np.asarray(ref["finish_delta"], np.float64)[0, 0, :, 0], [-4.0, 0.0])  # taps 0, 1
    got = 2.0**-8 * z
    impl = _Fixed(prepared=ref["prepared"], finish_delta=ref["finish_delta"], finished=got[None, None])
    r = _judge(impl, case)
    assert r.result == Result.ACCEPTABLE and "precision" in r.acceptable_flags, r.detail
    assert r.envelope_frac == pytest.approx(1 / (16 * np.sqrt(5)), rel=1e-6)
    from reference import scales

    s = scales.grouped_conv(case.kwargs(), ref)["finished"]
    np.testing.assert_allclose(s, 4 * np.sqrt(5) * z[None, None], rtol=1e-12)
    assert _v2_verdict(case, got[None, None], np.zeros_like(s)).result == Result.FAIL
    # the engine controls of the same form give exactly this output
    for v in (variants.BY_NAME["conv_fp32_finish_delta"], variants.BY_NAME["conv_fp32_finish_delta_fp32"]):
        np.testing.assert_array_equal(np.asarray(v.grouped_conv(**case.kwargs())["finished"], np.float64),
                                      got[None, None], err_msg=v.key)


def test_v3_separately_rounded_products_where_the_coefficient_nearly_cancels():
    """base = 1 + 2^-7, delta = -1 exactly (proj (-1, 0)), so c = 2^-7. z_j = 1 + j 2^-7 (BF16).
    Reference: c z_j = 2^-7 + j 2^-14, a BF16 value for j < 128.
    z-lab's BF16 form: BF16(b z_j) = BF16(1 + (j + 1) 2^-7 + j 2^-14) = 1 + (j + 1) 2^-7 (j 2^-14 is under
    half the spacing 2^-7), BF16(d z_j) = -z_j exactly, their sum 2^-7: an error of j 2^-14 = j ulps.
    v3 s: rss(|z| rss(s_d, |b| + |d|), |c z|) with s_d = 1, |b| + |d| = 2 + 2^-7: about 2.24 z_j; at j = 15
    the error is 15 2^-14 / (2^-8 2.24 1.117) = 0.094 u s, 0.012 of K = 8: ACCEPTABLE(precision) (15 ulps,
    outside the tight bound of 1). v2 s: rss(|z| |c|, |c z|) = sqrt 2 2^-7 z_j: at j = 15,
    15 2^-14 / (2^-8 sqrt 2 2^-7 1.117) = 19 u s, 2.4 times K; normwise sqrt 2 ||j|| / ||z|| = 11.7 u ||s||
    against N = 4: FAIL."""
    j = np.arange(16)
    z = 1 + j * 2.0**-7
    case = _hand_case("hand_separate_products", 1 + 2.0**-7, [-1.0, 0.0], z)
    ref = grouped_conv(**case.kwargs())
    np.testing.assert_array_equal(np.asarray(ref["finished"], np.float64)[0, 0], 2.0**-7 + j * 2.0**-14)
    zlab = np.full(16, 2.0**-7)
    np.testing.assert_array_equal(conv_variant(np.asarray(case.inputs["z"], np.float64), np.asarray(
        case.inputs["base"], np.float64)[1], np.asarray(ref["finish_delta"], np.float64), separate=True)[0, 0], zlab)
    r = _judge(_Fixed(prepared=ref["prepared"], finish_delta=ref["finish_delta"], finished=zlab[None, None]), case)
    assert r.result == Result.ACCEPTABLE and "precision" in r.acceptable_flags, r.detail
    np.testing.assert_array_equal(np.asarray(variants.BY_NAME["conv_separate_products"].grouped_conv(
        **case.kwargs())["finished"], np.float64)[0, 0], zlab)
    v2_s = np.sqrt(2) * 2.0**-7 * z[None, None]
    norm_ratio = np.linalg.norm(j * 2.0**-14) / (BF16_U * np.linalg.norm(v2_s))
    assert norm_ratio > 4
    assert _v2_verdict(case, zlab[None, None], v2_s).result == Result.FAIL


def test_v3_coefficient_term_is_v2_where_base_and_delta_share_a_sign():
    """(|b| + |d|) = |b + d| when b d >= 0: s is v2's there (only cancellation widens it). b = 1, d = 0.5,
    z = 1, W = 1, exact delta: rss(|z| 1.5, |c z| = 1.5) = 1.5 sqrt 2; b = 1, d = -0.5: rss(1.5, 0.5)."""
    from reference import magnitude as mg

    base = np.zeros((2, 16))
    base[0] = 1.0
    for d, want in ((0.5, 1.5 * np.sqrt(2)), (-0.5, np.hypot(1.5, 0.5))):
        delta = np.zeros((1, 1, 2, 1))
        delta[0, 0, 0, 0] = d
        out = mg.conv(mg.exact(np.ones((1, 1, 16))), base, mg.exact(delta), 16)
        np.testing.assert_allclose(out.s, want, rtol=1e-15)


@pytest.mark.parametrize("bug", [{"swap_taps": True}, {"per_channel": True}, {"prev": "wrap"}, {"prev": 1.0}],
                         ids=["tap_order", "delta_per_channel", "col0_wrap", "col0_pad"])
def test_v3_the_conv_bugs_still_fail(generated, bug):
    """The bugs C2 v3 keeps: every pitfall case of the bug (tap order: the W >= 2 random cases, whose
    taps' coefficients differ) FAILs, judged against the v3 envelope."""
    key = {"per_channel": "conv_delta_per_channel", "prev": "conv_col0_tap"}.get(next(iter(bug)))
    if key:
        targeted = [c for c in generated if key in c.flags]
    else:
        targeted = [c for c in generated if c.id.startswith("grouped_conv/H") and c.inputs["x"].shape[1] >= 2]
    assert targeted
    for c in targeted:
        r = _judge(_Fixed(**buggy_op(**c.kwargs(), **bug)), c)
        assert r.result == Result.FAIL, (c.id, bug, r.result, r.detail)


def test_v3_catalog_mutants_fail_their_cases_and_the_v3_controls_pass_the_cancellation_cases(generated):
    """The catalog's conv mutants FAIL every case flagged with their pitfall; the four C2 v3 controls give no
    FAIL on the cancellation cases, and each that rounds off the reference's grid there is off the tight
    bound (ACCEPTABLE) on at least one of them: the cases exercise them. Under v2's s the FP32-delta
    controls FAIL the exact-cancellation cases."""
    from conformance import mutants

    conv_mutants = [m for m in mutants.MUTANTS if m.op == "grouped_conv"]
    keys = {m.key for m in conv_mutants}
    assert {"conv_col0_tap", "conv_delta_per_channel"} <= keys and "conv_separate_rounding" not in keys, keys
    for m in conv_mutants:
        for c in (c for c in generated if m.pitfall in c.flags):
            assert _judge(m, c).result == Result.FAIL, (m.key, c.id)
    cancel = [c for c in generated if "coef_near_cancel" in c.id or "coef_cancels" in c.id]
    for key in ("conv_separate_products", "conv_separate_products_fp32", "conv_fp32_finish_delta",
                "conv_fp32_finish_delta_fp32"):
        results = {c.id: _judge(variants.BY_NAME[key], c) for c in cancel}
        assert all(r.result in (Result.PASS, Result.ACCEPTABLE) for r in results.values()), (key, results)
        # FP32 products of BF16 inputs are exact (8 + 8 significant bits): that control may PASS throughout
        if key != "conv_separate_products_fp32":
            assert any(r.result == Result.ACCEPTABLE for r in results.values()), key
    exact = [c for c in cancel if "coef_cancels" in c.id]
    for key in ("conv_fp32_finish_delta", "conv_fp32_finish_delta_fp32"):
        for c in exact:
            out = variants.BY_NAME[key].grouped_conv(**c.kwargs())
            ref = np.asarray(grouped_conv(**c.kwargs())["finished"], np.float64)
            zero = ref == 0
            assert zero.any() and np.any(np.asarray(out["finished"], np.float64)[zero] != 0), (key, c.id)
            # v2's s is 0 wherever the coefficients cancel (the followed delta exact, |c| = 0)
            assert _v2_verdict(c, out["finished"], np.where(zero, 0.0, 1.0)).result == Result.FAIL, (key, c.id)
