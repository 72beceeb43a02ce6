"""draft_attention: the window on paper, an explicit loop against the vectorized reference, and the
pitfall cases against buggy variants under the harness's bound."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reference.draft_attention as da
from conformance.cases import draft_attention as cases
from reference import draft_attention as draft_attention_op
from reference import numerics
from tests.casetools import bound_and_ref, check_generator


def test_window_S3_F2_W4_on_paper():
    # C = 3, F = 2: slots 0, 1 hold positions 0, 1; slot 2 would hold -1 (unpopulated).
    # Block rows j = 0..3 sit at 2..5. Query i at 2 + i keeps keys with |pk - pq| < 3:
    #   q0 @2: ctx 0, 1; block @2, @3, @4        (@5 is at distance 3: dropped)
    #   q1 @3: ctx 1;    block @2, @3, @4, @5    (ctx 0 at distance 3: dropped)
    #   q2 @4: -;        block @2, @3, @4, @5
    #   q3 @5: -;        block @3, @4, @5        (@2 at distance 3: dropped)
    # Columns: slot 0, slot 1, slot 2, block 0..3.
    expect = np.array(
        [
            [1, 1, 0, 1, 1, 1, 0],
            [0, 1, 0, 1, 1, 1, 1],
            [0, 0, 0, 1, 1, 1, 1],
            [0, 0, 0, 0, 1, 1, 1],
        ],
        dtype=bool,
    )
    got = da.allowed(np.array([2]), np.array([4]), 3, 4, 3)[0]
    np.testing.assert_array_equal(got, expect)


def test_single_key_returns_its_value_and_equal_scores_average():
    d = 4
    q = np.zeros((1, 2, 1, d))
    k = np.ones((1, 2, 1, d))
    v = np.array([2.0, -1.0, 0.5, 8.0]).reshape(1, 1, 1, d).repeat(2, axis=1)
    v_cache = np.full((1, 2, 1, d), 1.0)
    # F = 0: no context; live = 1 so row 0 sees only block row 0 -> out = v[0] exactly
    out = da.draft_attention(q, k, v, np.zeros((1, 2, 1, d)), v_cache, [0], [1], 0)["out"]
    np.testing.assert_array_equal(out[0, 0, 0], [2.0, -1.0, 0.5, 8.0])
    # F = 1: slot 0 holds position 0 (v = 1); q = 0 gives equal scores -> (1 + v) / 2, exact in bf16
    out = da.draft_attention(q, k, v, np.zeros((1, 2, 1, d)), v_cache, [1], [1], 0)["out"]
    np.testing.assert_array_equal(out[0, 0, 0], [1.5, 0.0, 0.75, 4.5])


def test_gqa_query_head_reads_kv_head_h_div_ratio():
    # Hq = 4, Hk = 2, one key: query head h returns the value of KV head h // 2
    v = np.array([[3.0, 3.0], [-5.0, -5.0]]).reshape(1, 1, 2, 2)
    out = da.draft_attention(np.zeros((1, 1, 4, 2)), np.zeros((1, 1, 2, 2)), v, np.zeros((1, 1, 2, 2)),
                             np.zeros((1, 1, 2, 2)), [0], [1], 0)["out"]
    np.testing.assert_array_equal(out[0, 0, :, 0], [3.0, 3.0, -5.0, -5.0])


geometry = st.tuples(
    st.integers(1, 12),  # capacity C
    st.integers(0, 40),  # frontier F
    st.integers(2, 16),  # width W
    st.integers(0, 10),  # window (0 = full)
).flatmap(lambda g: st.tuples(st.just(g), st.integers(1, g[2])))


@settings(max_examples=200, deadline=None)
@given(geometry)
def test_mask_formula_matches_explicit_position_lists(g):
    (cap, f, w, window), live = g
    got = da.allowed(np.array([f]), np.array([live]), cap, w, window)[0]
    # explicit: list the populated context positions and live block positions, then test each pair
    ctx = {p % cap: p for p in range(max(0, f - cap), f)}
    keys = [ctx.get(s) for s in range(cap)] + [f + j if j < live else None for j in range(w)]
    for i in range(w):
        pq = f + i
        want = [pk is not None and (window == 0 or abs(pk - pq) < window) for pk in keys]
        assert list(got[i]) == want


def loop_attention(q, k, v, k_cache, v_cache, frontier, live, window):
    """Per row, per query, per head: gather the allowed keys into a list, softmax, weighted sum."""
    b_, w, hq, d = q.shape
    cap, hk = k_cache.shape[1], k.shape[2]
    out = np.zeros(q.shape)
    for b in range(b_):
        f = int(frontier[b])
        keys = [(p, k_cache[b, p % cap], v_cache[b, p % cap]) for p in range(max(0, f - cap), f)]
        keys += [(f + j, k[b, j], v[b, j]) for j in range(int(live[b]))]
        for i in range(w):
            chosen = [(kk, vv) for p, kk, vv in keys if window == 0 or abs(p - (f + i)) < window]
            for h in range(hq):
                g = h // (hq // hk)
                s = np.array([q[b, i, h] @ kk[g] / np.sqrt(d) for kk, _ in chosen])
                if len(s):
                    e = np.exp(s - s.max())
                    out[b, i, h] = sum(ei * vv[g] for ei, (_, vv) in zip(e, chosen)) / e.sum()
    return out


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 2), st.integers(1, 8), st.integers(0, 30), st.integers(2, 8), st.integers(0, 6),
    st.sampled_from([(1, 1), (2, 1), (4, 2)]), st.integers(0, 2**32 - 1),
)
def test_loop_matches_vectorized(b, cap, f0, w, window, heads, seed):
    rng = np.random.default_rng(seed)
    hq, hk = heads
    d = 4
    frontier = f0 + rng.integers(0, 5, b)
    live = rng.integers(1, w + 1, b)
    q, k, v = (rng.standard_normal((b, w, h, d)) for h in (hq, hk, hk))
    kc, vc = rng.standard_normal((b, cap, hk, d)), rng.standard_normal((b, cap, hk, d))
    got = da.attend(q, k, v, kc, vc, frontier, live, window)
    want = loop_attention(q, k, v, kc, vc, frontier, live, window)
    # both float64 over <= 20 keys: softmax and sums agree to ~20 * 2^-53 relative to max|v| (~4)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("cid", [c.id for c in cases.generate() if "window_le_S" in c.flags])
@pytest.mark.parametrize("shift", [+1, -1], ids=["le_S", "lt_S-1"])
def test_window_off_by_one_exceeds_bound(cid, shift, monkeypatch):
    case = next(c for c in cases.generate() if c.id == cid)
    bound, ref, mask = bound_and_ref(cases.SPEC, case, "out", "bf16")
    real = da.allowed
    monkeypatch.setattr(da, "allowed", lambda f, lv, c, w, s: real(f, lv, c, w, s + shift if s else 0))
    bug = da.draft_attention(**case.kwargs())["out"]
    assert numerics.ulp_error(bug, ref, "bf16")[mask].max() > 4 * bound


@pytest.mark.parametrize("cid", [c.id for c in cases.generate() if "causal_draft_attention" in c.flags])
def test_causal_attention_exceeds_bound(cid, monkeypatch):
    case = next(c for c in cases.generate() if c.id == cid)
    bound, ref, mask = bound_and_ref(cases.SPEC, case, "out", "bf16")
    real = da.allowed

    def causal(f, lv, cap, w, s):
        a = real(f, lv, cap, w, s).copy()
        a[:, :, cap:] &= np.tril(np.ones((w, w), dtype=bool))  # block row j only for queries i >= j
        return a

    monkeypatch.setattr(da, "allowed", causal)
    bug = da.draft_attention(**case.kwargs())["out"]
    assert numerics.ulp_error(bug, ref, "bf16")[mask].max() > 4 * bound


def test_baseline_bound_is_tight():
    # positive V keeps outputs away from 0, so the baseline's max error is a relative one (<= 1 ULP);
    # a regression in case design that loosens the bound would weaken every case
    for case in cases.generate():
        bound, _, _ = bound_and_ref(cases.SPEC, case, "out", "bf16")
        assert bound <= 5, case.id


def test_generator_deterministic_ids_unique_and_pitfalls_named():
    a = check_generator(cases.generate, ("window_le_S", "causal_draft_attention"))
    for c in a:
        assert c.masks["out"].shape == c.inputs["q"].shape
    widths = {c.inputs["q"].shape[1] for c in a}
    assert min(widths) == 2 and max(widths) == 16


def test_non_finite_v_counts_only_where_attended():
    # FP16 V overflows to inf (C1). Position 15 is 5 >= S = 4 away from every query (20..23):
    # its inf must not reach the output as 0 * inf = NaN. Position 19 is attended by queries
    # 20..22 (distance 1..3): inf passes there; query 23 is S = 4 away and stays finite.
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((1, 4, 2, 8)) for _ in range(3))
    k, v = k[:, :, :1], v[:, :, :1]
    k_cache, v_cache = rng.standard_normal((1, 16, 1, 8)), rng.standard_normal((1, 16, 1, 8))
    far, near = v_cache.copy(), v_cache.copy()
    far[0, 15, 0, 3] = np.inf
    near[0, 19 % 16, 0, 3] = np.inf
    args = {"q": q, "k": k, "v": v, "k_cache": k_cache, "frontier": np.array([20]), "live": np.array([4]),
            "window": 4}
    run = draft_attention_op.draft_attention
    assert np.array_equal(run(**args, v_cache=far)["out"], run(**args, v_cache=v_cache)["out"])
    out = run(**args, v_cache=near)["out"]
    assert np.isposinf(out[0, :3, :, 3]).all() and np.isfinite(out[0, 3]).all()
    assert np.isfinite(np.delete(out, 3, axis=-1)).all()
