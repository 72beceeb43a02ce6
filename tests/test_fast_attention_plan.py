"""CPU check of the plan of kernels_cu/fast/attention.cu (no GPU needed).

``emulate`` mirrors the kernel's bookkeeping line for line in float64: the context key range
n_ctx = min(F, C, S - 1) and its ring slots, the per-row masks (lo_ctx, [blo, bhi)) and the key
slices left unmasked because every live row of their m-tile may see all of them, the 64-key
tiles split over ``ns`` blocks, the key slices of the warps (MT m-tiles, 4 / MT slices), the
online softmax in the exp2 domain, the merge of the slices, the combine of the splits, and where
a non-finite V meets a zero P (tensor-core PV: 0 * inf = NaN, unless the tile is flagged for the
CUDA-core path). Only the arithmetic is float64 instead of the kernel's BF16/FP16 operands, so
the emulation must equal the float64 reference to rounding on every committed vector and on
geometries the vectors do not reach (several tiles, ring wrap, splits, GQA, windows cutting a
tile, non-finite V inside a tile a window cuts). What this cannot check: the CUDA code itself
(fragment layouts, barriers); tests/gpu/test_fast_attention.py does that on a GPU.
"""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from conformance import vectors as vec_io
from kernels_cu.loader import source_path
from reference.draft_attention import attend

ROOT = Path(__file__).resolve().parents[1]
NT, WARPS, ROWS = 64, 4, 64
LOG2E = 1.4426950408889634


def _f64(x):
    a = np.asarray(x)
    if a.dtype.name == "bfloat16":
        return a.astype(np.float64)
    if a.dtype == np.uint16:  # BF16 bits
        return (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return a.astype(np.float64)


def _step(state, qr, sl2, keys, vals, allowed, flagged):
    """One tile of one warp's key slice: online softmax in the exp2 domain, then PV."""
    m, l_, o = state
    sc = np.where(allowed, (qr @ keys.T) * sl2, -np.inf)
    mx = np.maximum(m, sc.max(axis=1))
    mu = np.where(mx == -np.inf, 0, mx)
    corr = np.exp2(m - mu)
    p = np.exp2(sc - mu[:, None])
    l_ = l_ * corr + p.sum(axis=1)
    o = o * corr[:, None]
    if flagged:  # CUDA-core path: p * v only where p > 0
        for r in range(p.shape[0]):
            for c in range(p.shape[1]):
                if p[r, c] > 0:
                    o[r] += p[r, c] * vals[c]
    else:  # tensor cores: every product, 0 * inf = NaN
        o = o + np.einsum("rc,cd->rd", p, vals)
    return mx, l_, o


def emulate(q, k, v, kc, vc, frontier, live, window, ns=1, mt=None, use_flags=True):
    q, k, v, kc, vc = (_f64(x) for x in (q, k, v, kc, vc))
    bsz, w, hq, d = q.shape
    hk, cap = k.shape[2], kc.shape[1]
    g = hq // hk
    m_rows = w * g
    mt = mt or (1 if min(m_rows, ROWS) <= 16 else 2 if min(m_rows, ROWS) <= 32 else 4)
    kg_n = WARPS // mt
    nkw = NT // kg_n
    sl2 = LOG2E / np.sqrt(d)
    out = np.zeros(q.shape)
    with np.errstate(invalid="ignore", over="ignore"):
        for b in range(bsz):
            f = int(frontier[b])
            lve = min(max(int(live[b]), 0), w)
            nc = max(min(f, cap), 0)
            if window > 0:
                nc = min(nc, window - 1)
            slot0 = (f - nc) % cap if nc > 0 else 0
            tiles = -(-nc // NT)
            for h in range(hk):
                rows = np.arange(m_rows)
                i_of = rows // g
                ok = i_of < lve
                if window > 0:
                    lo_ctx = np.where(ok, np.maximum(i_of + nc - window, -1), 2**31 - 1)
                    blo = np.where(ok, np.maximum(0, i_of - window + 1), 0)
                    bhi = np.where(ok, np.minimum(lve, i_of + window), 0)
                else:
                    lo_ctx = np.where(ok, -1, 2**31 - 1)
                    blo = np.zeros(m_rows, int)
                    bhi = np.where(ok, lve, 0)
                qr = np.stack([q[b, i_of[r], h * g + r % g] for r in range(m_rows)])  # [M, D]
                mtile = (rows // ROWS) * 4 + (rows % ROWS) // 16  # (row chunk, m-tile) of each row
                parts = []
                for s in range(ns):
                    t_lo, t_hi = tiles * s // ns, tiles * (s + 1) // ns
                    slices = []
                    for kg in range(kg_n):
                        st = (np.full(m_rows, -np.inf), np.zeros(m_rows), np.zeros((m_rows, d)))
                        for t in range(t_lo, t_hi):
                            kb0 = t * NT
                            kk = kb0 + kg * nkw + np.arange(nkw)
                            present = kk < nc
                            slot = (slot0 + np.where(present, kk, 0)) % cap
                            keys = np.where(present[:, None], kc[b, slot, h], 0)
                            vals = np.where(present[:, None], vc[b, slot, h], 0)
                            allowed = present[None, :] & (kk[None, :] > lo_ctx[:, None])
                            # the kernel skips the mask of a warp's key slice that lies inside [lo, n_ctx)
                            # for every live row of its 16-row m-tile (rows past live are zeroed anyway)
                            for grp in np.unique(mtile):
                                sel = mtile == grp
                                lo_live = max([-1, *lo_ctx[sel & ok].tolist()])
                                if kb0 + kg * nkw + nkw <= nc and kb0 + kg * nkw > lo_live:
                                    allowed[sel] = True
                            cut = window > 0 and kb0 <= lve - 1 + nc - window
                            tile_rows = kb0 + np.arange(NT)
                            tile_v = vc[b, (slot0 + np.where(tile_rows < nc, tile_rows, 0)) % cap, h]
                            nonfinite = bool((~np.isfinite(tile_v[tile_rows < nc])).any())
                            st = _step(st, qr, sl2, keys, vals, allowed, use_flags and cut and nonfinite)
                        if s == ns - 1 and lve > 0:
                            j = kg * nkw + np.arange(nkw)
                            present = j < lve
                            jj = np.where(present, j, 0)
                            keys = np.where(present[:, None], k[b, jj, h], 0)
                            vals = np.where(present[:, None], v[b, jj, h], 0)
                            allowed = (j[None, :] >= blo[:, None]) & (j[None, :] < bhi[:, None])
                            nonfinite = bool((~np.isfinite(v[b, :lve, h])).any())
                            st = _step(st, qr, sl2, keys, vals, allowed, use_flags and nonfinite)
                        slices.append(st)
                    # merge the key slices (warp kg = 0 takes the others)
                    m0, l0, o0 = slices[0]
                    mx = m0.copy()
                    for mq, _, _ in slices[1:]:
                        mx = np.maximum(mx, mq)
                    mu = np.where(mx == -np.inf, 0, mx)
                    own = m0 > -np.inf
                    w0 = np.where(own, np.exp2(m0 - mu), 0)
                    big_l = np.where(own, l0 * w0, 0)
                    big_o = np.where(own[:, None], o0 * w0[:, None], 0)
                    for mq, lq, oq in slices[1:]:
                        sel = mq > -np.inf
                        wq = np.where(sel, np.exp2(mq - mu), 0)
                        big_l = big_l + np.where(sel, wq * lq, 0)
                        big_o = big_o + np.where(sel[:, None], wq[:, None] * oq, 0)
                    parts.append((mx, big_l, big_o))
                # combine the splits (fast_attn_combine; with ns = 1 the kernel divides directly)
                for r in range(m_rows):
                    i, hh = r // g, h * g + r % g
                    if i >= lve:
                        continue
                    mx = max(p[0][r] for p in parts)
                    big_l, acc = 0.0, np.zeros(d)
                    for pm, pl, po in parts:
                        if pm[r] > -np.inf:
                            wt = np.exp2(pm[r] - mx) if ns > 1 else 1.0
                            big_l += wt * pl[r]
                            acc = acc + wt * po[r]
                    out[b, i, hh] = acc / big_l if big_l > 0 else 0.0
    return out


def _compare(case_inputs, window, **kw):
    ins = case_inputs
    ref = attend(ins["q"], ins["k"], ins["v"], ins["k_cache"], ins["v_cache"], ins["frontier"], ins["live"], window)
    emu = emulate(ins["q"], ins["k"], ins["v"], ins["k_cache"], ins["v_cache"], ins["frontier"], ins["live"], window,
                  **kw)
    rows = np.arange(ref.shape[1])[None, :] < np.asarray(ins["live"])[:, None]
    r, e = ref[rows], emu[rows]
    fin = np.isfinite(r)
    # non-finite reference elements (an attended inf V) must be matched exactly, finite ones to rounding
    assert np.array_equal(np.isnan(r), np.isnan(e)) and np.array_equal(r[~fin & ~np.isnan(r)], e[~fin & ~np.isnan(e)])
    np.testing.assert_allclose(e[fin], r[fin], rtol=1e-11, atol=1e-12)
    assert not np.any(emu[~rows]), "rows >= live must be zero"


def _vector_inputs():
    manifest = vec_io.read_manifest(ROOT / "vectors")
    out = []
    for entry in manifest["files"]:
        if entry["op"] == "draft_attention":
            vec = vec_io.parse_vector((ROOT / "vectors" / entry["path"]).read_bytes(), entry["path"])
            out.append(pytest.param(vec, id=entry["case"].split("/", 1)[1]))
    return out


@pytest.mark.parametrize("vec", _vector_inputs())
@pytest.mark.parametrize("ns", [1, 3])
def test_plan_matches_reference_on_vectors(vec, ns):
    _compare(dict(vec.inputs), int(vec.params["window"]), ns=ns)


def _round_bf16(x):
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16)


def _random_case(rng, b, w, hq, hk, d, cap, frontier, live, vscale=1.0):
    q = _round_bf16(rng.standard_normal((b, w, hq, d)) * 1.5)
    k = _round_bf16(rng.standard_normal((b, w, hk, d)))
    v = _round_bf16(np.exp(0.5 * rng.standard_normal((b, w, hk, d))) * vscale)
    kc = _round_bf16(rng.standard_normal((b, cap, hk, d)))
    vc = (np.exp(0.5 * rng.standard_normal((b, cap, hk, d))) * vscale).astype(np.float16)
    return {"q": q, "k": k, "v": v, "k_cache": kc, "v_cache": vc, "frontier": np.asarray(frontier, np.int64),
            "live": np.asarray(live, np.int32)}


@pytest.mark.parametrize(("window", "cap", "frontier", "live", "ns", "mt"), [
    (0, 300, [0, 1, 299, 300, 777], [4, 1, 8, 3, 8], 1, None),
    (0, 300, [0, 1, 299, 300, 777], [4, 1, 8, 3, 8], 4, None),
    (0, 130, [129, 2**32 + 5, 64], [8, 8, 2], 7, None),  # more splits than tiles: empty splits
    (70, 200, [69, 70, 71, 500, 2**31 + 1], [8, 5, 8, 8, 1], 2, None),  # the window cuts the first tile
    (3, 8, [0, 2, 3, 40, 41], [8, 8, 2, 8, 7], 1, None),  # window < W: the block tile is cut
    (130, 130, [1000, 129, 5], [8, 8, 8], 3, 1),  # MT 1 (4 key slices) on a 2-tile context
    (0, 100, [50, 100], [8, 6], 2, 2),
    (128, 300, [500, 129, 1000], [8, 8, 5], 1, None),  # n_ctx 127: the last key slice ends one past n_ctx
])
def test_plan_matches_reference_random(window, cap, frontier, live, ns, mt):
    rng = np.random.default_rng(cap + window + ns)
    case = _random_case(rng, len(frontier), 8, 8, 2, 16, cap, frontier, live)
    _compare(case, window, ns=ns, mt=mt)


@pytest.mark.parametrize("live", [18, 17, 24])
def test_plan_key_slice_starting_at_a_live_rows_window_edge(live):
    """W 24, one query head per KV head, window 60 (n_ctx 59, row i may see context keys > i - 1), 16-key
    slices: with 18 rows live, the slice starting at key 16 begins exactly at row 17's window edge (its
    key 16 is at distance S) and must stay masked; with 17 live it is inside every live row's window."""
    rng = np.random.default_rng(live)
    case = _random_case(rng, 1, 24, 2, 2, 16, 200, [500], [live])
    _compare(case, 60, ns=1, mt=1)


@pytest.mark.parametrize("where", ["ctx_cut", "block_cut"])
def test_plan_nonfinite_v_where_a_window_cuts(where):
    """An inf V allowed for one row and not for the next: the flagged tile keeps the others finite."""
    rng = np.random.default_rng(5)
    window, cap, f = 70, 200, 500
    case = _random_case(rng, 1, 8, 4, 1, 16, cap, [f], [8])
    if where == "ctx_cut":
        # position F - S + 1 is at distance S - 1 from row 0 (allowed) and S from row 1 (not)
        case["v_cache"][0, (f - window + 1) % cap, 0, :4] = np.float16(np.inf)
        case["v_cache"][0, (f - window + 1) % cap, 0, 4:8] = np.float16(-np.inf)
    else:
        window = 3
        case["v"] = case["v"].copy()
        case["v"][0, 0, 0, :2] = np.inf  # BF16 +inf at block row 0: rows 0..2 see it
    _compare(case, window, ns=2)
    out = emulate(case["q"], case["k"], case["v"], case["k_cache"], case["v_cache"], case["frontier"],
                  case["live"], window, ns=2)
    assert np.isinf(out[0, 0]).any() and np.isfinite(out[0, 3:]).all()


def test_plan_without_the_flag_gives_nan():
    """The same ctx case with every tile on the tensor-core path: row 1 (which must not see the inf)
    turns NaN through 0 * inf, so the flag is what keeps it finite."""
    rng = np.random.default_rng(5)
    window, cap, f = 70, 200, 500
    case = _random_case(rng, 1, 8, 4, 1, 16, cap, [f], [8])
    case["v_cache"][0, (f - window + 1) % cap, 0, :4] = np.float16(np.inf)
    out = emulate(case["q"], case["k"], case["v"], case["k_cache"], case["v_cache"], case["frontier"],
                  case["live"], window, ns=2, use_flags=False)
    assert np.isnan(out[0, 1, :, :4]).all()


def test_split_count_fills_one_wave_and_no_more(monkeypatch):
    """kernels_cu.fast.attention.splits_for (no GPU: the SM count is given): the grid b x hk x chunks x
    splits never exceeds one wave of `resident` blocks per SM when it splits at all, each split keeps at
    least options.attention_min_tiles_per_split context tiles, and with room it splits (a partial second wave, 3
    splits of 64 (b, KV head) pairs on 132 SMs x 2, measured slower on the H200)."""
    from hypothesis import given, settings
    from hypothesis import strategies as st
    from kernels_cu.fast import attention as fa

    class _Dev:
        id = 0

    class _Cuda:
        Device = _Dev

    class _Cp:
        cuda = _Cuda

    monkeypatch.setattr(fa, "cp", lambda: _Cp)
    monkeypatch.setattr(fa, "_sm_count", lambda dev_id: 132)
    assert fa.splits_for(8, 8, 1, 2048, 2048, 2) == 4  # 27B B8 W16: 256 blocks of 264 slots
    assert fa.splits_for(1, 8, 1, 2048, 2048, 2) == 8  # 27B B1: 32 tiles, at least 4 per split
    assert fa.splits_for(1, 8, 1, 4096, 0, 2) == 16  # 35B B1 full attention: 64 tiles

    @settings(max_examples=300, deadline=None)
    @given(b=st.integers(1, 16), hk=st.integers(1, 16), chunks=st.integers(1, 4), cap=st.integers(1, 70000),
           window=st.integers(0, 70000), resident=st.integers(1, 4))
    def check(b, hk, chunks, cap, window, resident):
        ns = fa.splits_for(b, hk, chunks, cap, window, resident)
        n_ctx = min(cap, window - 1) if window > 0 else cap
        tiles = -(-max(n_ctx, 0) // 64)
        assert ns >= 1
        if ns > 1:
            assert b * hk * chunks * ns <= resident * 132
            assert tiles // ns >= fa.DEFAULT_OPTIONS.attention_min_tiles_per_split
        elif b * hk * chunks * 2 <= resident * 132:  # room for two splits: only too few tiles stop it
            assert tiles // 2 < fa.DEFAULT_OPTIONS.attention_min_tiles_per_split

    check()


def test_combine_batch_holds_the_splits_and_matches_the_source():
    """fast_attention.combine_batch(ns): the combine instance whose batch holds all ns splits' loads at
    once (the smallest such, so no more registers than needed), the largest where none does; and the
    instances it names are the ones fast/attention.cu builds (FA_COMBINE)."""
    import re
    from kernels_cu.fast import attention as fa

    src = source_path("fast/attention").read_text()
    built = re.search(r"#define FA_COMBINE\(DPV\) (.*)", src).group(1)
    assert tuple(int(c) for c in re.findall(r"FA_COMBINE_CB\(DPV, (\d+)\)", built)) == fa.COMBINE_BATCHES
    assert [fa.combine_batch(ns) for ns in (1, 2, 3, 4, 5, 8, 9, 16, 17, 64)] == [2, 2, 4, 4, 8, 8, 16, 16, 16, 16]
    for ns in range(1, 100):
        cb = fa.combine_batch(ns)
        smaller = [c for c in fa.COMBINE_BATCHES if c < cb]
        assert (ns <= cb or cb == max(fa.COMBINE_BATCHES)) and all(ns > c for c in smaller)
