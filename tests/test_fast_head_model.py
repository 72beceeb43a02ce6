"""A NumPy model of kernels_cu/fast/head.cu's per-block selection, checked against a plain top-k of the keys.

The kernel keeps, per hidden row, a buffer of HT_CAP keys and a threshold key; per tile it seeds the first
tile's thresholds from 16 group maxima, offers every live logit through a float pre-filter (!(z < f), f the
threshold key's float) and the key compare, claims slots in whatever order the atomics land, leaves values
that found the buffer full pending for another pass, and compacts rows past a limit (sort, keep k, threshold =
the k-th). The claim of the design is that the kept keys are exactly the block's top k whatever the order of
the claims. This model follows the kernel's steps and float32 compare semantics (not its code) and checks that
claim on adversarial values (ties on a grid, all-zero rows with -0, Inf, NaN, rising rows that overflow every
tile) under random claim orders. The first version's seed (threshold = seed key - 1) with its float exact test
must fail on an all-zero row: the -0 pitfall the GPU test caught.

The ping-pong kernel (fast_head_topk_pp) selects differently: over 128-row tiles staged in shared memory, a row's
first threshold from the k-th largest of the maxima of its 32 groups of 4 head rows, keys above the threshold to
the buffer in head-row order, compaction when the buffer is full with keys left. Its warp form (hp_select, the
HP_WARP_ROWS switch) gives a hidden row to a warp, its default form (hp_select_lanes) to a lane; both offer the
keys in the order this model does. Its model is checked the same way, over an eligible-row cut too, and two seed
mutants (a rank or a word too high) must lose a key of the top k. The lane form adds two steps of its own, each
checked against an independent formulation: a set of 16 values skipped when its float maximum is below the
threshold's float (it must never skip a key above the threshold, with NaN, -0, Inf and flushed subnormals), and
the seed's k-th group maximum kept by insertion into k registers (against a sort); and its tile-end compaction
(each lane its own row: the kept keys inserted into k registers), in the block model and on its own, with a mutant.
Shared thresholds (HP_SHARED_THR): several blocks' tiles interleaved at random, each starting from the highest
published threshold it read (possibly a stale one), give the plain top k once merged; a mutant that publishes a
row's best key instead of its threshold loses keys.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

CAP, VT, GROUPS = 32, 256, 16


def fk_key(z: np.float32, row: int) -> int:
    """topk_keys.cuh fk_key: ordered float word (-0 folded onto +0, NaN word 1) over 0xffffffff - row."""
    z = np.float32(z)
    if z == 0:
        z = np.float32(0.0)
    b = int(np.array(z, np.float32).view(np.uint32))
    ordw = 1 if np.isnan(z) else ((~b) & 0xFFFFFFFF if b & 0x80000000 else b | 0x80000000)
    return (ordw << 32) | (0xFFFFFFFF - row)


def key_float(key: int) -> np.float32:
    """topk_keys.cuh key_float: 0 -> -inf, NaN word -> NaN, else the ordered word mapped back."""
    if key == 0:
        return np.float32(-np.inf)
    ordw = key >> 32
    if ordw == 1:
        return np.float32(np.nan)
    bits = (ordw & 0x7FFFFFFF) if ordw & 0x80000000 else (~ordw) & 0xFFFFFFFF
    return np.array(bits, np.uint32).view(np.float32)[()]


def group_of(r: int) -> int:
    """The seed's group of tile row r, as the kernel forms them: row 128 wg + 64 mb + 16 w' + g + 8 h (warpgroup wg,
    m64 block mb, warp w' of the warpgroup, lane row g, half h) is in group 2 (4 wg + w') + mb."""
    wg, rem = divmod(r, 128)
    mb, rem = divmod(rem, 64)
    return 2 * (4 * wg + rem // 16) + mb


def keyfilter_passes(zz: np.float32, v: int, thr: int) -> bool:
    """fast/topk.cu's KeyFilter (the first fast_head epilogue's exact test): value and row through float compares."""
    if thr == 0 or (thr >> 32) == 1:
        return True
    f = key_float(thr)
    row = 0xFFFFFFFF - (thr & 0xFFFFFFFF)
    return bool(zz > f or (zz == f and v < row))


def model_block(z: np.ndarray, k: int, rng, limit: int = CAP - 8, seed_minus_one: bool = False,
                exact: str = "key", retry: bool = True) -> list[list[int]]:
    """The kept keys of each hidden row for one block: z [rows, N] float32 logits of the block's head rows
    (row ids 0..rows-1), claims in the order rng draws. exact: "key" (the kernel's key compare) or "keyfilter"
    (the first version's float test)."""
    rows, N = z.shape
    buf: list[list[int]] = [[] for _ in range(N)]
    cnt = [0] * N
    thr = [0] * N

    def compact(n: int, lim: int) -> None:
        if cnt[n] <= lim:
            return
        keys = sorted(buf[n][:CAP], reverse=True)[:k]
        buf[n] = keys
        cnt[n] = k
        thr[n] = keys[k - 1]

    for t0 in range(0, rows, VT):
        tile = range(t0, min(rows, t0 + VT))
        if t0 == 0:  # the seed: per row, the k-th largest of the 16 groups' maxima (NaN-skipping), its row word 0
            for n in range(N):
                best = [np.float32(np.nan)] * GROUPS
                for r in tile:
                    g = group_of(r - t0)
                    best[g] = np.fmax(best[g], z[r, n])
                keys = sorted((fk_key(b, 0xFFFFFFFF) if not np.isnan(b) else 0) for b in best)[::-1]  # row word 0
                kth = keys[k - 1]
                if kth:
                    thr[n] = kth - 1 if seed_minus_one else kth
        pend = [(r, n) for r in tile for n in range(N)]
        while pend:
            order = rng.permutation(len(pend))
            left = []
            for i in order:
                r, n = pend[i]
                zz = z[r, n]
                f = key_float(thr[n])
                if zz < f:  # the float pre-filter drops it (NaN z never compares below)
                    continue
                key = fk_key(zz, r)
                if not (key > thr[n] if exact == "key" else keyfilter_passes(zz, r, thr[n])):
                    continue
                pos = cnt[n]
                cnt[n] += 1
                if pos >= CAP:
                    if retry:  # False: a mutant that drops the values finding the buffer full
                        left.append((r, n))
                    continue
                if pos < len(buf[n]):
                    buf[n][pos] = key
                else:
                    buf[n].append(key)
            for n in range(N):
                compact(n, limit)
            pend = left
    for n in range(N):
        compact(n, k)
    return [sorted(buf[n][: min(cnt[n], CAP)], reverse=True) for n in range(N)]


def plain_topk(z: np.ndarray, k: int) -> list[list[int]]:
    return [sorted((fk_key(z[r, n], r) for r in range(z.shape[0])), reverse=True)[:k] for n in range(z.shape[1])]


def _values(kind: str, rows: int, n: int, rng) -> np.ndarray:
    if kind == "gauss":
        return rng.standard_normal((rows, n)).astype(np.float32)
    if kind == "grid":
        return (rng.integers(-2, 3, (rows, n)) * 0.5).astype(np.float32)
    if kind == "zeros":
        z = np.zeros((rows, n), np.float32)
        z[rng.random((rows, n)) < 0.5] = -0.0
        return z
    if kind == "rising":
        return np.tile(np.linspace(-3, 3, rows, dtype=np.float32)[:, None], (1, n))
    if kind == "special":
        z = rng.integers(-1, 2, (rows, n)).astype(np.float32)
        z[rng.random((rows, n)) < 0.1] = np.inf
        z[rng.random((rows, n)) < 0.1] = -np.inf
        z[rng.random((rows, n)) < 0.1] = np.nan
        return z
    raise ValueError(kind)


@settings(max_examples=40, deadline=None)
@given(kind=st.sampled_from(["gauss", "grid", "zeros", "rising", "special"]), rows=st.integers(1, 700),
       n=st.integers(1, 3), k=st.integers(1, 16), seed=st.integers(0, 2**31 - 1))
def test_model_keeps_exactly_the_top_k_whatever_the_claim_order(kind, rows, n, k, seed):
    rng = np.random.default_rng(seed)
    z = _values(kind, rows, n, rng)
    assert model_block(z, k, rng) == plain_topk(z, k)


def test_rows_that_overflow_every_tile_and_a_tight_limit():
    """Rising logits beat every kept threshold in every tile (each tile's 256 values pass, 32 slots): the pending
    values must be offered again until none is left; limit = k compacts after every pass."""
    rng = np.random.default_rng(1)
    z = _values("rising", 900, 2, rng)
    for limit in (16, CAP - 8):
        assert model_block(z, 16, rng, limit=limit) == plain_topk(z, 16)
    assert model_block(z, 16, rng, retry=False) != plain_topk(z, 16)  # the retry is what makes it exact


def test_the_first_seed_fails_where_the_gpu_test_caught_it():
    """The first version seeded threshold = seed key - 1 and tested values with KeyFilter's float compares. For
    f = +0 that threshold reads back as -0 with row word 0: a zero logit is neither above -0 nor below row 0, so an
    all-zero row kept nothing (the GPU test's zeros case). The model reproduces the failure, and passes with the
    seed key itself under either test; the key compare the kernel now uses is immune to the - 1 as well."""
    rng = np.random.default_rng(2)
    z = np.zeros((300, 1), np.float32)
    z[::3] = -0.0
    want = plain_topk(z, 3)
    assert model_block(z, 3, rng, seed_minus_one=True, exact="keyfilter") != want
    assert model_block(z, 3, rng, exact="keyfilter") == want
    assert model_block(z, 3, rng) == want
    assert model_block(z, 3, rng, seed_minus_one=True) == want


# ---- the ping-pong kernel's selection (fast/head.cu hp_select): tiles of 128 head rows staged in shared memory, a
# warp a hidden row, lane l reading the tile's rows 4 l .. 4 l + 3; rows at or past the eligible count get key 0.
PP_VT = 128


def pp_seed(keys: list[int], k: int, how: str) -> int:
    """A row's first threshold from its first tile's keys (0 for ineligible). "lanemax": the k-th largest of the 32
    lanes' largest ordered words (the kernel); "bisect": the k-th largest ordered word (HP_SEED_BISECT); mutants:
    "rank_k_minus_1" (the (k-1)-th lane maximum: k - 1 lanes vouch for it, not k), "word_plus_1" (a word above)."""
    words = [key >> 32 for key in keys]
    if how == "bisect":
        return sorted(words, reverse=True)[k - 1] << 32
    lane_max = sorted((max(words[4 * lane:4 * lane + 4]) for lane in range(32)), reverse=True)
    if how == "rank_k_minus_1":
        return lane_max[max(k - 2, 0)] << 32
    if how == "word_plus_1":
        return (lane_max[k - 1] + 1) << 32 if lane_max[k - 1] else 0
    return lane_max[k - 1] << 32


def lane_tile_compact(buf: list[int], t: int, c: int, k: int, move_on: bool = True) -> tuple[int, int]:
    """hp_select_lanes' tile-end compaction as the kernel does it: slots k..c-1 inserted into k registers holding
    slots 0..k-1 (in whatever order), a step keeping the larger and moving the smaller on; the best k to slots
    0..k-1, returns (threshold = the least kept, count k). move_on False: a mutant that drops the displaced key."""
    top = list(buf[:k])
    for w in buf[k:c]:
        for i in range(k):
            if w > top[i]:
                top[i], w = w, (top[i] if move_on else 0)
    buf[:k] = top
    return min(top), k


def pp_row_tile(keys: list[int], buf: list[int], t: int, c: int, k: int, seed: str = "lanemax",
                tile_compact: bool = False, g: int = 0) -> tuple[int, int]:
    """One hidden row's tile in the ping-pong kernel: its threshold t raised to the shared one g (0: none), the seed
    while the list is empty (and g is 0), every key above the threshold offered in head-row order, a full buffer with
    keys left compacted (sorted, best k kept, threshold raised to the k-th) and the left keys filtered again, and
    (tile_compact, the lane form) the tile-end compaction. Returns the row's (threshold, count)."""
    t = max(t, g)
    if t == 0 and c == 0:
        t = pp_seed(keys, k, seed)
    left = [key for key in keys if key > t]
    while left:
        room = CAP - c
        for j, key in enumerate(left[:room]):
            buf[c + j] = key
        if len(left) <= room:
            c += len(left)
            break
        left = left[room:]
        kept = sorted(buf, reverse=True)[:k]  # compaction: the buffer is full
        buf[:k] = kept
        t, c = max(t, kept[k - 1]), k
        left = [key for key in left if key > t]
    if tile_compact and c > k:  # the lane form's tile end (HP_TILE_COMPACT)
        kth, c = lane_tile_compact(buf, t, c, k)
        t = max(t, kth)
    return t, c


def model_pp_block(z: np.ndarray, k: int, nv_total: int, seed: str = "lanemax",
                   tile_compact: bool = False) -> list[list[int]]:
    """The kept keys of each hidden row for one block of the ping-pong kernel: z [rows, N] float32 (row ids
    0..rows-1), the first nv_total rows eligible, each tile and row by pp_row_tile, at the end every row down to k."""
    rows, N = z.shape
    buf = [[0] * CAP for _ in range(N)]
    cnt, thr = [0] * N, [0] * N
    for t0 in range(0, rows, PP_VT):
        nv = min(PP_VT, nv_total - t0)
        for n in range(N):
            keys = [fk_key(z[t0 + v, n], t0 + v) if v < nv and t0 + v < rows else 0 for v in range(PP_VT)]
            thr[n], cnt[n] = pp_row_tile(keys, buf[n], thr[n], cnt[n], k, seed, tile_compact)
    out = []
    for n in range(N):
        kept = sorted(buf[n][:cnt[n]], reverse=True)[:k]
        out.append([key for key in kept if key])
    return out


def plain_topk_eligible(z: np.ndarray, k: int, nv_total: int) -> list[list[int]]:
    rows = min(z.shape[0], max(nv_total, 0))
    return [sorted((fk_key(z[r, n], r) for r in range(rows)), reverse=True)[:k] for n in range(z.shape[1])]


@settings(max_examples=40, deadline=None)
@given(kind=st.sampled_from(["gauss", "grid", "zeros", "rising", "special"]), rows=st.integers(1, 700),
       n=st.integers(1, 3), k=st.integers(1, 16), cut=st.integers(0, 40), seed=st.integers(0, 2**31 - 1),
       how=st.sampled_from(["lanemax", "bisect"]))
def test_pp_model_keeps_exactly_the_top_k_of_the_eligible_rows(kind, rows, n, k, cut, seed, how):
    rng = np.random.default_rng(seed)
    z = _values(kind, rows, n, rng)
    nv = max(rows - cut, 0)
    assert model_pp_block(z, k, nv, how) == plain_topk_eligible(z, k, nv)
    assert model_pp_block(z, k, nv, how, tile_compact=True) == plain_topk_eligible(z, k, nv)  # the lane form's tile end


def test_pp_seed_mutants_drop_keys_the_top_k_needs():
    """The seed's claim is that k keys are at least the threshold: a threshold one rank or one word higher is not
    backed by k keys and loses one of the top k where each lane holds one large logit (its first) and the rest are
    small, so the top 16 are the 16 largest lane maxima."""
    rng = np.random.default_rng(3)
    z = np.full((128, 4), -10.0, np.float32)
    z[::4] = rng.permutation(np.arange(1, 129, dtype=np.float32).reshape(32, 4))
    want = plain_topk_eligible(z, 16, 128)
    assert model_pp_block(z, 16, 128) == want
    assert model_pp_block(z, 16, 128, "rank_k_minus_1") != want
    assert model_pp_block(z, 16, 128, "word_plus_1") != want


def test_pp_seed_lets_few_keys_through_on_gaussian_logits():
    """Why the lanes' maxima: the 16th largest of 32 lane maxima sits near the median of a 4-logit maximum, so a
    logit passes with probability about 1 - 0.5 ** (1 / 4) = 0.159: 20.4 of 128 expected at k 16 (the kernel's
    comment), and a row's first tile fills its 32 slots once, without a compaction (the bisection's exact k-th
    measured slower: 0.714 against 0.675 ms at 120 rows). The mean of 200 rows is checked against 24, well
    above 20.4 plus its sampling spread (the count's standard deviation is about 3, so the mean's is about 0.2);
    k keys always pass (the seed's claim)."""
    rng = np.random.default_rng(4)
    passed = []
    for _ in range(200):
        zz = rng.standard_normal(128).astype(np.float32)
        keys = [fk_key(zz[v], v) for v in range(128)]
        t = pp_seed(keys, 16, "lanemax")
        passed.append(sum(key > t for key in keys))
    assert 16 <= min(passed) and np.mean(passed) < 24 and max(passed) <= CAP


# ---- the lane form's own steps (fast/head.cu hp_select_lanes)
SET = 16  # HP_SET float4: values a set


def ftz(z: np.float32) -> np.float32:
    """-ftz=true: a subnormal operand reads as a zero of its sign."""
    return np.float32(np.copysign(0.0, z)) if z != 0 and abs(z) < np.finfo(np.float32).tiny else np.float32(z)


def lane_set_passes(zs: np.ndarray, t: int, strict: bool = False, nan_wins: bool = False) -> bool:
    """The set test: every set while the threshold word is 0 or 1; else fmaxf over the set (NaN skipped, operands
    flushed) against key_float(t) (flushed), >=. Mutants: strict (>), nan_wins (a maximum that NaN propagates
    through, as np.maximum)."""
    if (t >> 32) <= 1:
        return True
    m = np.float32(np.nan)
    for z in zs:
        m = (np.maximum if nan_wins else np.fmax)(m, ftz(np.float32(z)))
    f = ftz(key_float(t))
    return bool(m > f) if strict else bool(m >= f)


def _special_floats(rng, n: int) -> np.ndarray:
    pool = np.array([0.0, -0.0, 1.0, -1.0, 0.5, np.inf, -np.inf, np.nan, 1e-40, -1e-40, 3e-45, -3e-45,
                     np.finfo(np.float32).tiny, 2.0, -2.0], np.float32)
    return pool[rng.integers(0, len(pool), n)]


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), gauss=st.booleans())
def test_lane_set_test_never_skips_a_key_above_the_threshold(seed, gauss):
    """For thresholds that are real keys (any value, any row) and sets of 16 values, ties and specials included:
    a set holding a key above the threshold passes the float test."""
    rng = np.random.default_rng(seed)
    zs = rng.standard_normal(SET).astype(np.float32) if gauss else _special_floats(rng, SET)
    rows = rng.integers(0, 1000, SET)
    tz = zs[rng.integers(0, SET)] if rng.random() < 0.5 else _special_floats(rng, 1)[0]
    t = fk_key(tz, int(rng.integers(0, 1000)))
    if any(fk_key(z, int(r)) > t for z, r in zip(zs, rows)):
        assert lane_set_passes(zs, t)


def test_lane_set_test_mutants_skip_needed_sets():
    """The test must be >=: a value equal to the threshold's float with a lower head row has the larger key (ties
    go to the lower row), and a strict test drops it. The maximum must skip NaN: one NaN in a set would hide the
    set's real maximum from a NaN-propagating one."""
    t = fk_key(np.float32(1.0), 50)
    zs = np.full(SET, -1.0, np.float32)
    zs[3] = 1.0
    assert fk_key(zs[3], 10) > t
    assert lane_set_passes(zs, t) and not lane_set_passes(zs, t, strict=True)
    # -0 against a +0 threshold: the key folds -0 onto +0, the float compare sees -0 == +0
    t0 = fk_key(np.float32(0.0), 50)
    assert fk_key(np.float32(-0.0), 10) > t0 and lane_set_passes(np.array([-0.0] + [-1.0] * 15, np.float32), t0)
    zn = np.full(SET, -1.0, np.float32)
    zn[0], zn[5] = np.nan, 2.0
    assert fk_key(zn[5], 5) > t and lane_set_passes(zn, t) and not lane_set_passes(zn, t, nan_wins=True)


def seed_by_insertion(words: list[int], k: int) -> int:
    """The kernel's seed: the 32 group maxima inserted into k registers (k steps; the larger stays, the smaller
    moves on), then the least of them."""
    top = [0] * k
    for q in range(32):
        w = max(words[4 * q:4 * q + 4])
        for i in range(k):
            top[i], w = max(top[i], w), min(top[i], w)
    return min(top) << 32


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), k=st.integers(1, 16), nv=st.integers(0, 128),
       kind=st.sampled_from(["gauss", "grid", "zeros", "special"]))
def test_lane_seed_by_insertion_equals_the_sorted_group_maxima(seed, k, nv, kind):
    rng = np.random.default_rng(seed)
    z = _values(kind, 128, 1, rng)[:, 0]
    keys = [fk_key(z[v], v) if v < nv else 0 for v in range(128)]
    assert seed_by_insertion([key >> 32 for key in keys], k) == pp_seed(keys, k, "lanemax")


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), k=st.integers(1, 16), extra=st.integers(1, 16))
def test_tile_compaction_keeps_the_best_k_whatever_the_slots_order(seed, k, extra):
    """The insertion's claim: each step drops the least of the k + 1 keys, so slots 0..k-1 need no order (after a
    seed they are in head-row order). Distinct keys, shuffled."""
    rng = np.random.default_rng(seed)
    c = min(k + extra, CAP)
    keys = [int(x) for x in rng.choice(2**40, c, replace=False) + 1]
    buf = keys + [0] * (CAP - c)
    t, cnt = lane_tile_compact(buf, 0, c, k)
    want = sorted(keys, reverse=True)[:k]
    assert sorted(buf[:k], reverse=True) == want and t == want[-1] and cnt == k


def test_tile_compaction_mutant_that_drops_the_displaced_key():
    """Slots [5, 9, 8, 1], then 7: 7 displaces 5, which moves on and displaces 1. A mutant that drops the displaced
    key keeps 1 and loses 5."""
    buf = [5, 9, 8, 1, 7] + [0] * (CAP - 5)
    b1 = list(buf)
    assert lane_tile_compact(b1, 0, 5, 4) == (5, 4) and sorted(b1[:4], reverse=True) == [9, 8, 7, 5]
    b2 = list(buf)
    lane_tile_compact(b2, 0, 5, 4, move_on=False)
    assert sorted(b2[:4], reverse=True) != [9, 8, 7, 5]


# ---- shared thresholds (fast/head.cu HP_SHARED_THR): the blocks publish each row's threshold, every block filters
# by the highest it has read
def model_shared(z: np.ndarray, k: int, nv_total: int, blocks: int, rng, stale: float = 0.3,
                 publish: str = "threshold", schedule: list[int] | None = None) -> list[list[int]]:
    """The merged top k of ``blocks`` ping-pong blocks (contiguous row ranges, the lane form) whose tiles run in a
    random interleaving (or ``schedule``, a block index per step), each tile's rows starting from max(own threshold,
    a shared value read: the current one, or with probability ``stale`` an older one, as a read that raced the
    atomics), publishing the threshold after the tile where it rose past the value read. publish "best": a mutant
    that publishes the row's best key (one key backs it, not k)."""
    rows, N = z.shape
    cuts = [rows * b // blocks for b in range(blocks + 1)]
    state = [{"buf": [[0] * CAP for _ in range(N)], "cnt": [0] * N, "thr": [0] * N, "t0": cuts[b]}
             for b in range(blocks)]
    history = [[0] * N]  # the shared thresholds after each publication
    steps = list(schedule) if schedule is not None else None
    while True:
        live = [b for b in range(blocks) if state[b]["t0"] < cuts[b + 1]]
        if not live:
            break
        b = steps.pop(0) if steps else int(rng.choice(live))
        if b not in live:
            continue
        st_, t0 = state[b], state[b]["t0"]
        shared = list(history[-1] if rng.random() >= stale else history[int(rng.integers(len(history)))])
        for n in range(N):
            keys = [fk_key(z[r, n], r) if r < min(cuts[b + 1], nv_total) else 0 for r in range(t0, t0 + PP_VT)]
            t, c = pp_row_tile(keys, st_["buf"][n], st_["thr"][n], st_["cnt"][n], k, "lanemax", True, shared[n])
            st_["thr"][n], st_["cnt"][n] = t, c
            out = max(st_["buf"][n][:c], default=0) if publish == "best" else t
            if out > shared[n]:
                history.append(list(history[-1]))
                history[-1][n] = max(history[-1][n], out)
        st_["t0"] = min(t0 + PP_VT, cuts[b + 1])
    merged = []
    for n in range(N):
        keys = [key for st_ in state for key in st_["buf"][n][:st_["cnt"][n]] if key]
        merged.append(sorted(keys, reverse=True)[:k])
    return merged


@settings(max_examples=40, deadline=None)
@given(kind=st.sampled_from(["gauss", "grid", "zeros", "rising", "special"]), rows=st.integers(1, 1500),
       n=st.integers(1, 3), k=st.integers(1, 16), cut=st.integers(0, 300), blocks=st.integers(1, 6),
       seed=st.integers(0, 2**31 - 1))
def test_shared_thresholds_keep_the_top_k_whatever_the_interleaving(kind, rows, n, k, cut, blocks, seed):
    """Whatever order the blocks' tiles run in and whichever published value each read sees, the merged lists are
    the plain top k of the eligible rows."""
    rng = np.random.default_rng(seed)
    z = _values(kind, rows, n, rng)
    nv = max(rows - cut, 0)
    assert model_shared(z, k, nv, blocks, rng) == plain_topk_eligible(z, k, nv)


def test_shared_threshold_mutant_that_publishes_the_best_key():
    """A published threshold must be backed by k keys. Block 0 holds the row's largest logit, block 1 the next
    fifteen: with block 0's best key published first, block 1 drops all fifteen and the merged top 16 loses them."""
    z = np.full((2 * PP_VT, 1), -5.0, np.float32)
    z[3, 0] = 100.0
    z[PP_VT:PP_VT + 15, 0] = np.arange(50, 65, dtype=np.float32)
    rng = np.random.default_rng(0)
    want = plain_topk_eligible(z, 16, 2 * PP_VT)
    assert model_shared(z, 16, 2 * PP_VT, 2, rng, stale=0.0, schedule=[0, 1]) == want
    assert model_shared(z, 16, 2 * PP_VT, 2, rng, stale=0.0, publish="best", schedule=[0, 1]) != want
