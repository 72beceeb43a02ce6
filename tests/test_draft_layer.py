"""draft_layer: the layer written token by token and head by head (with explicit key lists and
explicit conv taps) against the vectorized reference, residual and extent properties, and the
registry's cases."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reference.draft_attention as da
from conformance.cases import draft_layer as cases
from reference import numerics, precision
from reference.draft_layer import draft_layer, forward
from tests.casetools import fingerprint


def rms(x, w, eps):
    return w * x / np.sqrt(np.mean(x * x) + eps)


def rope(x, p, theta):
    d = len(x)
    out = np.empty(d)
    for j in range(d // 2):
        a = p * theta ** (-2.0 * j / d)
        out[j] = x[j] * np.cos(a) - x[j + d // 2] * np.sin(a)
        out[j + d // 2] = x[j + d // 2] * np.cos(a) + x[j] * np.sin(a)
    return out


def conv_prepare(n, base, proj):
    """n [W, H] -> (prepared, finish delta [W, 2 taps, G]) with explicit taps, BF16 at both outputs."""
    w, h = n.shape
    g = h // 16
    delta = (n @ proj.T).reshape(w, 2, 2, g)
    prepared = np.zeros((w, h))
    for i in range(w):
        for c in range(h):
            prepared[i, c] = (base[0, 0, c] + delta[i, 0, 0, c // 16]) * n[i, c]
            if i:
                prepared[i, c] += (base[0, 1, c] + delta[i, 0, 1, c // 16]) * n[i - 1, c]
    return numerics.to_bf16(prepared), numerics.to_bf16(delta[:, 1])


def conv_finish(z, base, delta):
    w, h = z.shape
    out = np.zeros((w, h))
    for i in range(w):
        for c in range(h):
            out[i, c] = (base[1, 0, c] + delta[i, 0, c // 16]) * z[i, c]
            if i:
                out[i, c] += (base[1, 1, c] + delta[i, 1, c // 16]) * z[i - 1, c]
    return out  # joins the residual stream unrounded: not a represented point inside the layer (C1)


def loop_layer(kw):
    """The spec's layer for one batch row at a time, one token and one head at a time."""
    f64 = {k: np.asarray(v, np.float64) if np.asarray(v).dtype.kind == "f" else v for k, v in kw.items()}
    x, eps, theta, d, window = f64["x"], kw["eps"], kw["theta"], kw["head_dim"], kw["window"]
    conv = kw["variant"] == "dflash2"
    b_, w, _ = x.shape
    hq, hk = f64["wq"].shape[0] // d, f64["wk"].shape[0] // d
    cap = f64["k_cache"].shape[1]
    out = np.zeros_like(x)
    for b in range(b_):
        f, live = int(kw["frontier"][b]), int(kw["live"][b])
        n = np.array([rms(x[b, i], f64["input_norm"], eps) for i in range(w)])
        if conv:
            n, fin_a = conv_prepare(n, f64["attn_conv_base"], f64["attn_conv_proj"])
        q = [[rope(rms(f64["wq"][t * d:(t + 1) * d] @ n[i], f64["q_norm"], eps), f + i, theta) for t in range(hq)]
             for i in range(w)]
        k = [[rope(rms(f64["wk"][t * d:(t + 1) * d] @ n[i], f64["k_norm"], eps), f + i, theta) for t in range(hk)]
             for i in range(w)]
        v = [[f64["wv"][t * d:(t + 1) * d] @ n[i] for t in range(hk)] for i in range(w)]
        keys = [(p, f64["k_cache"][b, p % cap], f64["v_cache"][b, p % cap]) for p in range(max(0, f - cap), f)]
        keys += [(f + j, np.array(k[j]), np.array(v[j])) for j in range(live)]
        a = np.zeros((w, hq * d))
        for i in range(w):
            seen = [(kk, vv) for p, kk, vv in keys if window == 0 or abs(p - (f + i)) < window]
            for t in range(hq):
                g = t // (hq // hk)
                s = np.array([q[i][t] @ kk[g] / np.sqrt(d) for kk, _ in seen])
                e = np.exp(s - s.max()) if len(s) else s
                a[i, t * d:(t + 1) * d] = sum((ei * vv[g] for ei, (_, vv) in zip(e, seen)), np.zeros(d)) / max(
                    e.sum(), 1e-300)
        o = a @ f64["wo"].T
        y = x[b] + (conv_finish(o, f64["attn_conv_base"], fin_a) if conv else o)
        m = np.array([rms(y[i], f64["post_norm"], eps) for i in range(w)])
        if conv:
            m, fin_m = conv_prepare(m, f64["mlp_conv_base"], f64["mlp_conv_proj"])
        gate, up = m @ f64["w_gate"].T, m @ f64["w_up"].T
        z = (gate / (1 + np.exp(-gate)) * up) @ f64["w_down"].T
        out[b] = y + (conv_finish(z, f64["mlp_conv_base"], fin_m) if conv else z)
    return out


def small_case(seed, variant, window, b, w, hq, hk):
    rng = np.random.default_rng(seed)
    d, h, cap = 4, 32, 6
    frontier = rng.integers(0, 20, b)
    live = rng.integers(1, w + 1, b)
    kw = dict(
        x=rng.standard_normal((b, w, h)), k_cache=rng.standard_normal((b, cap, hk, d)),
        v_cache=rng.standard_normal((b, cap, hk, d)), frontier=frontier, live=live,
        **cases.layer_weights(rng, h=h, hq=hq, hk=hk, d=d, inter=48, variant=variant),
    )
    return {**kw, "eps": 1e-6, "theta": 1e4, "head_dim": d, "window": window, "variant": variant}


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from(["dflash", "dflash2"]), st.integers(0, 5), st.integers(1, 2),
       st.integers(2, 5), st.sampled_from([(2, 1), (2, 2), (4, 2)]))
def test_loop_layer_matches_vectorized(seed, variant, window, b, w, heads):
    kw = small_case(seed, variant, window, b, w, *heads)
    got = forward(**kw)
    want = loop_layer(kw)
    # float64 throughout, O(1) values, sums of <= 48 terms: the two orders agree to ~1e-13. The
    # DFlash2 BF16 points (prepared, delta) could flip only if a value fell within ~1e-15 of a BF16
    # rounding boundary (probability ~1e-12 per element).
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-10)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from(["dflash", "dflash2"]), st.integers(0, 5))
def test_columns_at_or_past_live_influence_nothing_before_it(seed, variant, window):
    # attention sees only block rows < live and the conv only looks back, so rewriting x at rows
    # >= live must leave rows < live bit-identical (masked keys contribute exact zeros)
    kw = small_case(seed, variant, window, 2, 5, 2, 1)
    kw["live"] = np.array([2, 4])
    ref = forward(**kw)
    x = kw["x"].copy()
    x[0, 2:] += 3.0
    x[1, 4:] *= -2.0
    got = forward(**{**kw, "x": x})
    np.testing.assert_array_equal(got[0, :2], ref[0, :2])
    np.testing.assert_array_equal(got[1, :4], ref[1, :4])
    assert not np.array_equal(got[0, 2:], ref[0, 2:])


@pytest.mark.parametrize("variant", ["dflash", "dflash2"])
def test_zero_output_projections_leave_the_residual(variant):
    kw = small_case(7, variant, 0, 1, 3, 2, 1)
    kw["x"] = numerics.to_bf16(kw["x"])
    kw["wo"], kw["w_down"] = np.zeros_like(kw["wo"]), np.zeros_like(kw["w_down"])
    np.testing.assert_array_equal(draft_layer(**kw)["x_next"], kw["x"])


@pytest.mark.parametrize("cid", [c.id for c in cases.generate() if "causal_draft_attention" in c.flags])
def test_causal_layer_exceeds_bound(cid, monkeypatch):
    case = next(c for c in cases.generate() if c.id == cid)
    ref = draft_layer(**case.kwargs())["x_next"]
    with precision.baseline(cases.SPEC.bf16_intermediates):
        base = draft_layer(**case.kwargs())["x_next"]
    mask = case.masks["x_next"]
    bound = 2 * numerics.ulp_error(base, ref, "bf16")[mask].max() + 1
    norm_bound = 2 * numerics.normwise_error(base[mask], ref[mask]) + 2.0**-8
    real = da.allowed

    def causal(f, lv, cap, w, s):
        a = real(f, lv, cap, w, s).copy()
        a[:, :, cap:] &= np.tril(np.ones((w, w), dtype=bool))
        return a

    monkeypatch.setattr(da, "allowed", causal)
    bug = draft_layer(**case.kwargs())["x_next"]
    assert numerics.ulp_error(bug, ref, "bf16")[mask].max() > 4 * bound
    assert numerics.normwise_error(bug[mask], ref[mask]) > 10 * norm_bound


def test_generator_deterministic_ids_unique_and_both_variants():
    a, b = cases.generate(), cases.generate()
    assert fingerprint(a) == fingerprint(b)
    ids = [c.id for c in a]
    assert len(ids) == len(set(ids)) and 10 <= len(ids) <= 60
    assert {c.params["variant"] for c in a} == {"dflash", "dflash2"}
    assert {c.params["window"] == 0 for c in a} == {True, False}
    for c in a:
        assert c.masks["x_next"].shape == c.inputs["x"].shape
