"""The fast mode's split top-k (kernels_cu.fast.topk_into, fast/topk.cu) against a NumPy
statement of the C4 order on adversarial rows: exact ties everywhere (values on a coarse grid),
NaN and -inf logits, -0 next to +0, rows sorted ascending and descending (the warp's k-th-key
threshold's worst and best case), ids cut at vocab_size, a shortlist, widths that are not a multiple
of 4 (50001: the reverted block-pruning kernel of 58af140 had a 4-byte load path for them; the
committed kernel, 86941ea's, loads 4 bytes everywhere), k from 1 to 40 (the per-thread-list variant
above 32), rows 1 to 120 (both the in-block merged and the unmerged plan). Exact comparison:
selection runs on the given fp32 logits, so ids must equal the reference's and scores must be those
logits' values.
Marked ``gpu`` by tests/gpu/conftest.py."""

from __future__ import annotations

import numpy as np
import pytest


def c4_topk(z: np.ndarray, k: int, vocab_size: int, shortlist=None):
    """C4 on one fp32 row: value descending (-0 == +0), NaN after every number, the lower row
    first on ties; entries whose global id (row, or shortlist[row]) is outside [0, vocab_size)
    never compete; missing ranks are id -1, score -inf."""
    gid = np.arange(z.size) if shortlist is None else shortlist
    ok = (gid >= 0) & (gid < vocab_size)
    rows = np.nonzero(ok)[0]
    vals = z[rows].astype(np.float64)
    nan = np.isnan(vals)
    a = np.where(nan, np.inf, -vals)  # ascending = better first, NaN with -inf (the nan key splits them)
    if rows.size > k:  # only the k best values and everything tied with the k-th can rank
        t = np.partition(a, k - 1)[k - 1]
        keep = a <= t
        rows, vals, nan, a = rows[keep], vals[keep], nan[keep], a[keep]
    order = np.lexsort((rows, a, nan))  # NaN last, value desc, row asc
    pick = rows[order[:k]]
    ids = np.full(k, -1, dtype=np.int64)
    scores = np.full(k, -np.inf, dtype=np.float32)
    ids[: pick.size] = gid[pick]
    scores[: pick.size] = z[pick]
    return ids, scores


def _rows(rng, kind: str, m: int, vr: int) -> np.ndarray:
    if kind == "gauss":
        z = rng.standard_normal((m, vr)).astype(np.float32) * 4
    elif kind == "grid":  # massive exact ties, with signed zeros
        z = (rng.integers(-3, 4, (m, vr)) * 0.5).astype(np.float32)
        z[z == 0] = np.where(rng.random(int((z == 0).sum())) < 0.5, -0.0, 0.0)
    elif kind == "ascending":  # every new column beats the running threshold
        z = np.tile(np.linspace(-5, 5, vr, dtype=np.float32), (m, 1))
    elif kind == "descending":
        z = np.tile(np.linspace(5, -5, vr, dtype=np.float32), (m, 1))
    elif kind == "nan_inf":  # few finite values: NaN and -inf fill the top-k's tail
        z = np.full((m, vr), np.nan, dtype=np.float32)
        z[:, ::7] = -np.inf
        z[:, 3::97] = rng.standard_normal(z[:, 3::97].shape)
    else:
        raise ValueError(kind)
    return z


@pytest.fixture(params=["bound", "vec", "warp"])
def kernels(request):
    """The kernel sets where k <= 32: "bound" (fast_topk_bound's per-row bound, then
    fast_topk_partial_vec where it applies, and fast_topk_merge_warp: what the Ops and FastRound run),
    "vec" (the same without the bound) and "warp" (fast_topk_partial_warp and fast_topk_merge, the
    per-thread-list merge), each as FastOptions."""
    from kernels_cu.fast import FastOptions

    on = request.param != "warp"
    return request.param, FastOptions(topk_vec=on, topk_merge_warp=on)


def _bound(cp, kernels, m):
    return cp.empty(m, dtype=np.uint64) if kernels[0] == "bound" else None


@pytest.mark.parametrize("kind", ["gauss", "grid", "ascending", "descending", "nan_inf"])
@pytest.mark.parametrize(("m", "vr"), [(1, 248320), (7, 248320), (32, 248320), (33, 50001), (120, 248320)])
@pytest.mark.parametrize("k", [1, 16, 32, 40])
def test_topk_into_equals_the_c4_order(cupy, kernels, kind, m, vr, k):
    from kernels_cu.fast import backend as fast

    cp = cupy
    if k > 32 and kernels[0] != "bound":
        pytest.skip("k > 32 runs the per-thread-list kernels in every set")
    rng = np.random.default_rng(m * 1000 + k)
    z = _rows(rng, kind, m, vr)
    vocab = vr - 5
    plan = fast.topk_plan(m, vr, k, kernels[1])
    partial = cp.empty((m, plan[4], k), dtype=np.uint64)
    scores, ids = cp.empty((m, k), dtype=np.float32), cp.empty((m, k), dtype=np.int32)
    zd = cp.asarray(z)
    # the vector kernel runs exactly where it should: k <= 32, no shortlist, rows of 4n floats
    assert fast.topk_vec_applies(zd, None, k, kernels[1]) == (kernels[0] != "warp" and k <= 32 and vr % 4 == 0)
    fast.topk_into(zd, None, vocab, k, 0.0, 0.0, partial, scores, ids, _bound(cp, kernels, m), kernels[1])
    ids, scores = ids.get(), scores.get()
    for r in range(m):
        want_ids, want_scores = c4_topk(z[r], k, vocab)
        assert np.array_equal(ids[r], want_ids), (r, ids[r][:8], want_ids[:8])
        assert np.array_equal(scores[r].view(np.uint32), want_scores.view(np.uint32)) or (
            np.array_equal(np.isnan(scores[r]), np.isnan(want_scores))
            and np.array_equal(scores[r][~np.isnan(scores[r])], want_scores[~np.isnan(want_scores)])), r


@pytest.mark.parametrize("k", [1, 16])
def test_topk_into_with_a_shortlist(cupy, kernels, k):
    from kernels_cu.fast import backend as fast

    cp = cupy
    rng = np.random.default_rng(5)
    m, vr, vocab = 9, 30000, 100000
    z = _rows(rng, "grid", m, vr)
    shortlist = rng.permutation(vocab + 50)[:vr].astype(np.int32)  # some ids >= vocab_size
    plan = fast.topk_plan(m, vr, k, kernels[1])
    partial = cp.empty((m, plan[4], k), dtype=np.uint64)
    scores, ids = cp.empty((m, k), dtype=np.float32), cp.empty((m, k), dtype=np.int32)
    fast.topk_into(cp.asarray(z), cp.asarray(shortlist), vocab, k, 0.0, 0.0, partial, scores, ids,
                   _bound(cp, kernels, m), kernels[1])
    for r in range(m):
        want_ids, _ = c4_topk(z[r], k, vocab, shortlist)
        assert np.array_equal(ids.get()[r], want_ids), r


@pytest.mark.parametrize("k", [1, 16])
def test_topk_into_on_a_misaligned_array(cupy, kernels, k):
    """Logits 4 bytes off a 16-byte boundary (a view into a larger buffer): the vector kernel's
    16-byte loads do not apply, the warp kernel runs, and the result is still the C4 order."""
    from kernels_cu.fast import backend as fast

    cp = cupy
    rng = np.random.default_rng(11)
    m, vr = 5, 248320
    z = _rows(rng, "gauss", m, vr)
    buf = cp.empty(m * vr + 1, dtype=np.float32)
    zd = buf[1:].reshape(m, vr)
    zd[...] = cp.asarray(z)
    assert zd.data.ptr % 16 != 0 and not fast.topk_vec_applies(zd, None, k, kernels[1])
    plan = fast.topk_plan(m, vr, k, kernels[1])
    partial = cp.empty((m, plan[4], k), dtype=np.uint64)
    scores, ids = cp.empty((m, k), dtype=np.float32), cp.empty((m, k), dtype=np.int32)
    fast.topk_into(zd, None, vr, k, 0.0, 0.0, partial, scores, ids, _bound(cp, kernels, m), kernels[1])
    for r in range(m):
        want_ids, want_scores = c4_topk(z[r], k, vr)
        assert np.array_equal(ids.get()[r], want_ids), r
        assert np.array_equal(scores.get()[r], want_scores), r


def _c4_rank_keys(z: np.ndarray, vocab_size: int) -> np.ndarray:
    """Eligible columns of one row in the C4 order (best first)."""
    rows = np.arange(min(z.size, vocab_size))
    vals = z[rows].astype(np.float64)
    nan = np.isnan(vals)
    return rows[np.lexsort((rows, np.where(nan, np.inf, -vals), nan))]


@pytest.mark.parametrize("kind", ["gauss", "grid", "ascending", "descending", "nan_inf"])
@pytest.mark.parametrize(("vr", "vocab"), [(248320, 248315), (3000, 3000), (2048, 1030), (1000, 900), (40, 40)])
@pytest.mark.parametrize("k", [1, 16, 32])
def test_topk_bound_is_at_most_the_rows_kth_key(cupy, kind, vr, vocab, k):
    """fast_topk_bound's per-row bound is a key at or below the row's k-th best (the column it names
    ranks k-th or later in the C4 order: the filter `key >= bound` keeps every key of the top k), or 0
    (no bound) where fewer than k columns exist; on Gaussian rows it is selective (the case it is for)."""
    from kernels_cu.fast import backend as fast

    cp = cupy
    m = 5
    z = _rows(np.random.default_rng(vr + k), kind, m, vr)
    bound = cp.empty(m, dtype=np.uint64)
    fast._fn("fast/topk", "fast_topk_bound")((m,), (fast._FT_THREADS,), (cp.asarray(z), np.int32(m), np.int32(vr),
                                                                           np.int32(vocab), np.int32(k), bound))
    for r, b in enumerate(bound.get().tolist()):
        order = _c4_rank_keys(z[r], vocab)
        if order.size < k:
            assert b == 0, r
            continue
        assert b != 0, r
        col = 0xFFFFFFFF - (b & 0xFFFFFFFF)
        rank = int(np.nonzero(order == col)[0][0])
        assert rank >= k - 1, (r, rank)
        if kind == "gauss" and vr == 248320:  # 16 x 1024 samples: about the 0.1 % (k 16) to 0.2 % (k 32) quantile
            assert rank < vr // 200, (r, rank)
