"""grouped_conv: a hand-derived conv, the spec's loop against the vectorized module,
column 0 without a preceding tap, no state across calls, the cases and their pitfalls."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from conformance.cases import grouped_conv as cases
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
    assert {"conv_col0_tap", "conv_delta_per_channel", "conv_separate_rounding"} <= flags
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


def conv_variant(v, base_side, delta_side, *, prev="zero", per_channel=False, separate=False):
    """A buggy conv: prev = "wrap" (column 0 reads column W-1) or a nonzero pad value;
    per_channel: channel c uses delta[c mod G]; separate: every product and sum rounded to BF16."""
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
    if separate:
        r = to_bf16
        out = r(r(r(bs[:, :, 0] * vg) + r(d[:, :, 0] * vg)) + r(r(bs[:, :, 1] * before) + r(d[:, :, 1] * before)))
    else:
        out = (bs[:, :, 0] + d[:, :, 0]) * vg + (bs[:, :, 1] + d[:, :, 1]) * before
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
    "conv_separate_rounding": [{"separate": True}],
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
