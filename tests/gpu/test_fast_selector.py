"""kernels_cu/fast/selector.cu on a GPU: the fast DFlash2 selector against the exact mode's kernels
(select.cu bf16_rowdot and selector_walk, launched through fast_round's exact=True path), bit for bit.

- fast_rowdot_*: g = BF16(x @ w.T) equals bf16_rowdot's bits (and the fp32 variant its fp32 out, any
  NaN matching any NaN: cvt keeps the payload, which depends on the order) on random rows at the
  real shapes (27B DFlash2: H 5120, R 256; M 7 and 120 rows and the small/large boundary), at odd
  shapes (H not a multiple of 32, N not a multiple of the block; every H in the list is a multiple
  of 8, so the 16-byte kernels run there), an unaligned x (the 2-byte load kernels fast_rowdot_s /
  fast_rowdot_l, at H 5120 only: H % 8 != 0 is not run), and on hand-built rows whose exact sum is a
  BF16 midpoint (ties to even), just off one, subnormal, past the largest BF16, signed zeros, inf
  and NaN. Why equality is expected although the double sum runs in another order:
  fast/selector.cu's header (every product is exact in double; the two sums differ by ~2^-53
  relative, so the one BF16 rounding agrees except when the exact sum lies within that of a rounding
  boundary; the hand-built rows are sums that are exact in double in any order, so both round the
  same value). Repeated launches give identical bits (the cluster reduction adds in a fixed order).
- fast_selector_walk: path, tokens and q equal selector_walk's bit for bit, at B1 K7 and B8 K15
  (k 16, R 256) and small shapes (k 1, 4, 8, 32; R 8, 100, 64), per-row temperatures (<= 0, tiny,
  0.05, 0.7, 1, 50, a subnormal), edge seeds; and with energies that tie (equal scores, g = 0),
  signed zeros, +-inf and NaN (at rank 0 and elsewhere). Every kernel instance of the .cu
  (ROWDOT_KERNELS, WALK_KERNELS) is run: the 16-byte rowdots and the walk on every case above, the
  2-byte rowdots on the unaligned random rows only (not on the hand-built midpoints).
Marked ``gpu`` by tests/gpu/conftest.py; skipped with the reason where no GPU answers.
"""

from __future__ import annotations

import numpy as np
import pytest

from kernels_cu.fast import round as fr
from kernels_cu.fast import selector as fs

EDGE_SEEDS = [0, 2**32 - 1, 2**32, 2**64 - 1]


def bf16_bits(a) -> np.ndarray:
    """float -> BF16 bits, RNE (NaN stays NaN)."""
    u = np.asarray(a, np.float32).view(np.uint32)
    r = ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    return np.where(nan, ((u >> 16) | np.uint32(0x40)).astype(np.uint16), r)


def exact_bits(values) -> np.ndarray:
    """BF16 bits of values that must be BF16 values already (checked)."""
    v = np.asarray(values, np.float64)
    b = bf16_bits(v.astype(np.float32))
    back = (b.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    ok = (back == v) | (np.isnan(back) & np.isnan(v))
    assert ok.all(), v[~ok]
    return b


def _rowdots(cupy, x, w, *, bits_out=True, kernel=None):
    """(fast, exact) outputs of x @ w.T for device BF16 bits."""
    from kernels_cu.exact.select import _rowdot

    M, N = x.shape[0], w.shape[0]
    dtype = np.uint16 if bits_out else np.float32
    fast = cupy.full((M, N), 0xAAAA if bits_out else np.nan, dtype=dtype)
    fs.rowdot_into(x, w, fast, bits_out=bits_out, kernel=kernel)
    exact = _rowdot(x, w, bits_out=bits_out)
    return cupy.asnumpy(fast), cupy.asnumpy(exact)


def _same(a, b) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint8), b.view(np.uint8))


def _same_fp32(a, b) -> bool:
    """Bit for bit, except that any NaN equals any NaN: the fp32 variant rounds the double sum with
    cvt.rn.f32.f64, which keeps a NaN's sign and payload, and those depend on the order in which the
    NaN met the other terms (the BF16 variant writes the one canonical NaN 0x7fc0)."""
    both = np.isnan(a) & np.isnan(b)
    return a.shape == b.shape and np.array_equal(np.where(both, 0, a.view(np.uint32)),
                                                 np.where(both, 0, b.view(np.uint32)))


def _diff(a, b) -> str:
    bad = np.argwhere(a.view(np.uint32 if a.dtype.itemsize == 4 else np.uint16) !=
                      b.view(np.uint32 if b.dtype.itemsize == 4 else np.uint16))
    return f"{len(bad)} differ, first {bad[:5].tolist()}: {a[tuple(bad[0])] if len(bad) else ''} vs " \
           f"{b[tuple(bad[0])] if len(bad) else ''}"


# --- rowdot -------------------------------------------------------------------------------


@pytest.mark.parametrize("M,N,H", [(7, 256, 5120), (120, 256, 5120), (1, 256, 5120), (16, 256, 5120),
                                   (17, 256, 5120), (64, 256, 5120), (5, 40, 200), (33, 70, 136),
                                   (40, 256, 5128), (3, 9, 8), (130, 20, 520)])
def test_rowdot_equals_bf16_rowdot(cupy, M, N, H):
    rng = np.random.default_rng(1000 * M + N + H)
    xs = rng.standard_normal((M, H)).astype(np.float32)
    xs[rng.random((M, H)) < 0.002] *= 60.0  # activation outliers
    x = cupy.asarray(bf16_bits(xs))
    w = cupy.asarray(bf16_bits(rng.standard_normal((N, H)).astype(np.float32) * 0.02))
    name = fs.rowdot_plan(M, N, H, x.data.ptr, w.data.ptr)[0]
    assert name.endswith("_v") == (H % 8 == 0)
    fast, exact = _rowdots(cupy, x, w)
    assert _same(fast, exact), f"{name}: {_diff(fast, exact)}"
    fast32, exact32 = _rowdots(cupy, x, w, bits_out=False)
    assert _same(fast32, exact32), f"{name} fp32: {_diff(fast32, exact32)}"


VEC_KERNELS = sorted(n for n in fs.ROWDOT_KERNELS if n.endswith("_v"))


@pytest.mark.parametrize("kernel", VEC_KERNELS)
@pytest.mark.parametrize("M", [7, 120, 33])
def test_rowdot_every_kernel_equals_bf16_rowdot(cupy, kernel, M):
    N, H = 256, 5120
    rng = np.random.default_rng(M)
    x = cupy.asarray(bf16_bits(rng.standard_normal((M, H)).astype(np.float32)))
    w = cupy.asarray(bf16_bits(rng.standard_normal((N, H)).astype(np.float32) * 0.02))
    fast, exact = _rowdots(cupy, x, w, kernel=kernel)
    assert _same(fast, exact), f"{kernel}: {_diff(fast, exact)}"


@pytest.mark.parametrize("M", [7, 120])
def test_rowdot_unaligned_rows_take_the_two_byte_path(cupy, M):
    N, H = 256, 5120
    rng = np.random.default_rng(M)
    buf = cupy.asarray(bf16_bits(rng.standard_normal(M * H + 1).astype(np.float32)))
    x = buf[1:].reshape(M, H)  # 2 bytes past a 16-byte boundary
    w = cupy.asarray(bf16_bits(rng.standard_normal((N, H)).astype(np.float32) * 0.05))
    assert not fs.rowdot_plan(M, N, H, x.data.ptr, w.data.ptr)[0].endswith("_v")
    fast, exact = _rowdots(cupy, x, w)
    assert _same(fast, exact), _diff(fast, exact)


TINY = 2.0**-133  # the smallest BF16 subnormal
MAXBF = float.fromhex("0x1.fep127")  # the largest finite BF16
# (x value, w value) products of one output; sums exact in double in every order
TIE_CASES = [
    [(1.0, 1.0), (2.0**-8, 1.0)],  # 1 + 2^-8: midpoint, to even -> 1
    [(1.0, 1.0), (3 * 2.0**-8, 1.0)],  # 1 + 3 2^-8: midpoint, to even -> 1 + 2^-6
    [(-1.0, 1.0), (-(2.0**-8), 1.0)],  # -> -1
    [(2.0**20, 1.0), (1.0, 1.0), (-(2.0**20), 1.0), (2.0**-8, 1.0)],  # cancelling, spread over slices
    [(1.0, 1.0), (2.0**-8, 1.0), (2.0**-40, 1.0)],  # just above the midpoint -> 1 + 2^-7
    [(1.0, 1.0), (2.0**-8, 1.0), (-(2.0**-40), 1.0)],  # just below -> 1
    [(2.0**-70, 1.5 * 2.0**-63)],  # 1.5 * 2^-133: subnormal midpoint -> 2^-132
    [(2.0**-70, 2.0**-64)],  # 2^-134 = half the smallest subnormal: to even -> +0
    [(2.0**-70, 0.75 * 2.0**-63)],  # 0.75 * 2^-133 -> 2^-133
    [(MAXBF, 1.0), (2.0**119, 1.0)],  # the largest BF16 plus half an ulp: -> inf
    [(MAXBF, 1.0), (2.0**118, 1.0)],  # plus a quarter ulp: -> the largest
    [(-0.0, 1.0), (0.0, -1.0)],  # signed zeros -> +0
    [(2.0**-130, 2.0**100), (3 * TINY, 1.0)],  # BF16 subnormal inputs
    [(float("inf"), 1.0), (1.0, 1.0)],  # -> inf
    [(float("inf"), 1.0), (float("-inf"), 1.0)],  # -> NaN
    [(float("inf"), 0.0)],  # inf * 0 -> NaN
    [(float("nan"), 1.0), (1.0, 1.0)],  # -> NaN
    [(1.0, float("-inf"))],  # -> -inf
]


@pytest.mark.parametrize("kernel", VEC_KERNELS)
@pytest.mark.parametrize("rows", [len(TIE_CASES), 40])
def test_rowdot_hand_built_midpoints_and_specials(cupy, rows, kernel):
    """Case c puts its products at h = c + 19 t (t spread over the whole row, so over every slice
    of the cluster): output (c, c) is the case's sum, every other output of the case rows is 0 or
    picks up inf/NaN from the case's special inputs; all of it must match bf16_rowdot."""
    H, n_cases = 5120, len(TIE_CASES)
    x = np.zeros((rows, H))
    w = np.zeros((max(rows, 32), H))
    spread = np.linspace(0, (H - n_cases) // 19, 8).astype(int)
    for c, prods in enumerate(TIE_CASES):
        for (xv, wv), t in zip(prods, spread):
            x[c, c + 19 * t] = xv
            w[c, c + 19 * t] = wv
    for r in range(n_cases, rows):  # the rest: copies, so the 32-row blocks see them too
        x[r] = x[r % n_cases]
        w[r] = w[r % n_cases]
    xd, wd = cupy.asarray(exact_bits(x)), cupy.asarray(exact_bits(w))
    fast, exact = _rowdots(cupy, xd, wd, kernel=kernel)
    assert _same(fast, exact), _diff(fast, exact)
    want = {0: 0x3F80, 1: 0x3F82, 2: 0xBF80, 3: 0x3F80, 4: 0x3F81, 5: 0x3F80, 6: 0x0002, 7: 0x0000, 8: 0x0001,
            9: 0x7F80, 10: 0x7F7F, 11: 0x0000, 13: 0x7F80, 14: 0x7FC0, 15: 0x7FC0, 16: 0x7FC0, 17: 0xFF80}
    got = {c: int(fast[c, c]) for c in want}
    assert got == want
    fast32, exact32 = _rowdots(cupy, xd, wd, bits_out=False, kernel=kernel)
    assert _same_fp32(fast32, exact32), _diff(fast32, exact32)


def test_rowdot_repeats_bit_for_bit_and_the_wiring(cupy):
    rng = np.random.default_rng(7)
    M, N, H = 120, 256, 5120
    x = cupy.asarray(bf16_bits(rng.standard_normal((M, H)).astype(np.float32)))
    w = cupy.asarray(bf16_bits(rng.standard_normal((N, H)).astype(np.float32) * 0.02))
    outs = []
    for exact in (False, False, True):
        o = cupy.empty((M, N), dtype=np.uint16)
        fr.rowdot_bits_into(x, w, o, exact=exact)
        outs.append(cupy.asnumpy(o))
    assert _same(outs[0], outs[1]) and _same(outs[0], outs[2])


# --- the walk -----------------------------------------------------------------------------

TEMPS = [0.0, -1.0, 0.05, 0.7, 1.0, 50.0, 1e-3, 1e-40]


def walk_inputs(rng, B, K, k, R, V=1000, temps=TEMPS):
    g = bf16_bits(rng.standard_normal((B, K, R)).astype(np.float32))
    scores = -np.sort(-rng.standard_normal((B, K, k)) * 2.0, axis=-1).astype(np.float32)
    ids = np.stack([rng.choice(V, k, replace=False) for _ in range(B * K)]).reshape(B, K, k).astype(np.int32)
    anchor = rng.integers(0, V, B).astype(np.int32)
    w_pred = bf16_bits(rng.standard_normal((V, R)).astype(np.float32) * 0.5)
    w_succ = bf16_bits(rng.standard_normal((V, R)).astype(np.float32) * 0.5)
    temperature = np.asarray([temps[i % len(temps)] for i in range(B)], np.float32)
    seed = np.asarray([EDGE_SEEDS[i % 4] ^ int(rng.integers(0, 2**16)) for i in range(B)], np.uint64)
    frontier = rng.integers(0, 2**40, B).astype(np.int64)
    return {"g": g, "scores": scores, "ids": ids, "anchor": anchor, "w_pred": w_pred, "w_succ": w_succ,
            "temperature": temperature, "seed": seed, "frontier": frontier}


def _walks(cupy, inp, kernel=None):
    d = {n: cupy.asarray(v) for n, v in inp.items()}
    B, K, k = inp["ids"].shape
    res = []
    for exact in (False, True):
        path = cupy.full((B, K), -7, dtype=np.int32)
        tokens = cupy.full((B, K), -7, dtype=np.int32)
        q = cupy.full((B, K, k), np.nan, dtype=np.float32)
        args = (d["g"], d["scores"], d["ids"], d["anchor"], d["w_pred"], d["w_succ"], d["temperature"], d["seed"],
                d["frontier"], path, tokens, q)
        if kernel is None or exact:
            fr.selector_walk_into(*args, exact=exact)
        else:
            fs.walk_into(*args, kernel=kernel)
        res.append({"path": cupy.asnumpy(path), "tokens": cupy.asnumpy(tokens), "q": cupy.asnumpy(q)})
    return res


def _assert_walks_equal(fast, exact):
    for name in ("path", "tokens", "q"):
        assert _same(fast[name], exact[name]), f"{name}: {_diff(fast[name], exact[name])}"


@pytest.mark.parametrize("B,K,k,R", [(1, 7, 16, 256), (8, 15, 16, 256), (3, 5, 1, 8),
                                     (2, 9, 4, 100), (2, 2, 32, 256), (4, 17, 8, 64), (1, 1, 16, 256),
                                     (16, 8, 16, 256), (5, 12, 16, 96)])
@pytest.mark.parametrize("kernel", sorted(fs.WALK_KERNELS))
def test_walk_equals_selector_walk(cupy, B, K, k, R, kernel):
    assert fs.walk_supported(K, k, R)
    rng = np.random.default_rng(B * 10000 + K * 100 + k + R)
    inp = walk_inputs(rng, B, K, k, R)
    fast, exact = _walks(cupy, inp, kernel)
    _assert_walks_equal(fast, exact)
    assert (fast["path"] >= 0).all() and (fast["path"] < k).all()


@pytest.mark.parametrize("kernel", sorted(fs.WALK_KERNELS))
def test_walk_ties_zeros_and_nonfinite_energies(cupy, kernel):
    """g = 0: every energy is its score (+ a +0 sum). Rows: all equal, pairs of equal maxima, -0/+0
    maxima, +inf twice, -inf everywhere, NaN at rank 0, NaN elsewhere, NaN everywhere; each at T 0
    and T 1."""
    k, K, R = 8, 4, 32
    pats = [
        [1.0] * k,
        [0.5, 2.0, 2.0, 1.0, 2.0, -1.0, 0.0, 2.0],
        [-0.0, 0.0, -0.0, -1.0, -2.0, 0.0, -3.0, -0.0],
        [1.0, float("inf"), 3.0, float("inf"), 0.0, 1.0, 2.0, 3.0],
        [float("-inf")] * k,
        [float("nan"), 1.0, 5.0, 2.0, 5.0, 0.0, 1.0, 1.0],
        [1.0, float("nan"), 5.0, float("nan"), 5.0, 0.0, 7.0, float("nan")],
        [float("nan")] * k,
    ]
    B = 2 * len(pats)
    rng = np.random.default_rng(3)
    inp = walk_inputs(rng, B, K, k, R, temps=[0.0, 1.0])
    inp["g"][:] = 0
    for b in range(B):
        inp["scores"][b] = np.asarray(pats[b // 2], np.float32)
    fast, exact = _walks(cupy, inp, kernel)
    _assert_walks_equal(fast, exact)


def test_walk_repeats_and_shares_nothing_across_rows(cupy):
    """Same inputs twice: same bits; a row's result does not depend on the other rows (row 0 alone
    equals row 0 of the batch)."""
    rng = np.random.default_rng(11)
    inp = walk_inputs(rng, 8, 15, 16, 256)
    a, _ = _walks(cupy, inp)
    b, _ = _walks(cupy, inp)
    _assert_walks_equal(a, b)
    one = {n: (v[:1] if n in ("g", "scores", "ids", "anchor", "temperature", "seed", "frontier") else v)
           for n, v in inp.items()}
    solo, _ = _walks(cupy, one)
    for name in ("path", "tokens", "q"):
        assert _same(solo[name], a[name][:1])
