"""kernels_cu/fast_wgemm.cu on a GPU (issue 12, session v16): the block's layer GEMMs at 17..128 rows on wgmma.

- out = x @ w^T within the FP32 accumulation bound of the float64 product: BF16 x BF16 products are exact in FP32,
  and whatever the order and grouping of the K - 1 additions, with each rounded toward zero (tensor cores truncate
  when they align and add: Fasi, Higham, Mikaitis, Pranesh 2021), |fl - exact| <= gamma_K sum |x_k w_k| with unit
  2^-23 (tests/gpu/test_fast_head.py derives the same bound for the head's chain). The bound models the chain as
  two-term additions; Hopper's fused k16 adder aligns 17 terms to the largest and truncates each, whose worst case
  can exceed it by about 1/16. Random data sits far inside. Planted products in the first and last K columns make a
  dropped first or last stage visible; a wrong output index or a lost piece is orders of magnitude out;
- at the official B8 W16 shapes (35B and 27B layer GEMMs, 128 rows) and at small shapes that reach every branch
  of the stream-K split: one block (every tile whole in one range), grids whose ranges cut tiles, ranges inside
  one tile (a tile of many pieces), whole and cut tiles in one block's range, N not a multiple of the 128-row tile,
  M not a multiple of 8, K one stage (tests/test_fast_wgemm_plan.py checks on the split's model that the cases
  reach these);
- integer grids are exact (every partial sum an integer below 2^24), so a piece added twice or dropped shows;
- the same bits on every call (the pieces added in block order, not arrival order), the tile counters back at 0;
- a captured graph gives the eager bits; arrays outside the contract are refused (False).
The race against a late producer of x is in tests/gpu/test_pdl.py. Marked ``gpu`` by tests/gpu/conftest.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.gpu.bf16 import gauss_bits as _bits
from tests.gpu.bf16 import to_f64 as _f64
from tests.gpu.bf16 import truncate
from tests.gpu.block_suite import block_suite_clean
from tests.gpu.graphs import eager_and_replayed

pytestmark = pytest.mark.gpu
U = 2.0**-23  # truncating additions


@pytest.fixture
def fw(cupy):
    from kernels_cu import fast_wgemm

    if not fast_wgemm._device_ok():
        pytest.skip("fast_wgemm needs a compute-capability 9.0 GPU (sm_90a wgmma)")
    return fast_wgemm


def _case(M, N, K, kind="gauss"):
    if kind == "grid":  # small integers: every partial sum exact
        rng = np.random.default_rng(M + N + K)
        xf = rng.integers(-3, 4, (M, K)).astype(np.float32)
        wf = rng.integers(-3, 4, (N, K)).astype(np.float32)
        return truncate(xf), truncate(wf)
    xh, wh = _bits(M * 7 + 1, (M, K)), _bits(N + K, (N, K))
    for k in (0, K - 1):  # planted products (8 x 8) in the first and the last stage of every row
        xh[:, k] = 0x4100
        wh[:, k] = 0x4100
    return xh, wh


def _check(cupy, fw, M, N, K, blocks=None, kind="gauss"):
    xh, wh = _case(M, N, K, kind)
    x, w = cupy.asarray(xh), cupy.asarray(wh)
    out = cupy.full((M, N), np.nan, np.float32)
    assert fw.gemm_into(x, w, out, blocks=blocks)
    got = cupy.asnumpy(out).astype(np.float64)
    xf, wf = _f64(xh), _f64(wh)
    exact = xf @ wf.T
    assert np.isfinite(got).all()
    if kind == "grid":
        assert np.array_equal(got, exact)
    bound = K * U / (1 - K * U) * (np.abs(xf) @ np.abs(wf).T)
    err = np.abs(got - exact)
    assert (err <= bound).all(), f"{float((err / bound).max()):.3g} x the bound"
    first = cupy.asnumpy(out).view(np.uint32).copy()
    out.fill(0)
    assert fw.gemm_into(x, w, out, blocks=blocks)
    assert np.array_equal(cupy.asnumpy(out).view(np.uint32), first), "other bits on the second call"
    _, counters = fw._scratch()
    assert not cupy.asnumpy(counters).any(), "a tile counter left nonzero"
    return first


# the 35B layer GEMMs at B8 W16 (q/k/v, o, gate/up, down) and the 27B ones
OFFICIAL = [(128, 6144, 2048), (128, 2048, 4096), (128, 12288, 2048), (128, 2048, 6144),
            (128, 6144, 5120), (128, 5120, 4096), (128, 34816, 5120), (128, 5120, 17408), (256 // 2, 1280, 5120)]


@pytest.mark.parametrize("M,N,K", OFFICIAL)
def test_official_shapes_within_the_fp32_bound_and_repeatable(cupy, fw, M, N, K):
    _check(cupy, fw, M, N, K)


@pytest.mark.parametrize("M,N,K,blocks", [
    (17, 256, 256, 1),      # one block: every tile whole in its range
    (24, 384, 640, 7),      # ranges cut tiles (T 30 over 7 blocks)
    (33, 128, 1024, 12),    # one tile of 16 stages over 12 blocks: ranges inside the tile, 12 pieces
    (40, 128, 1024, 16),    # a piece a stage
    (100, 200, 192, 5),     # N past the last full tile (rows 128..199 of 256), M not a multiple of 8
    (128, 1000, 64, 3),     # K one stage: ranges of several whole tiles, none cut (the last partly past N)
    (48, 640, 256, 3),      # T 20 over [0, 6) [6, 13) [13, 20): a whole tile then a cut one (slot 2b + 1); a cut,
                            # a whole and a cut; a cut then a whole: both kinds of store in one block's range
    (64, 640, 2048, None),  # the default grid
])
@pytest.mark.parametrize("kind", ["gauss", "grid"])
def test_stream_k_splits_within_the_bound(cupy, fw, M, N, K, blocks, kind):
    if blocks is not None and blocks > cupy.cuda.Device().attributes["MultiProcessorCount"]:
        pytest.skip("more blocks than multiprocessors here")
    _check(cupy, fw, M, N, K, blocks, kind)


def test_graph_replay_gives_the_eager_bits(cupy, fw):
    x, w = cupy.asarray(_bits(1, (128, 2048))), cupy.asarray(_bits(2, (6144, 2048)))
    out = cupy.empty((128, 6144), np.float32)
    cupy.cuda.Device().synchronize()  # the uploads landed before the non-blocking stream runs
    eager, replayed = eager_and_replayed(cupy, lambda: fw.gemm_into(x, w, out), out)
    assert np.array_equal(replayed, eager)


def test_refuses_what_it_cannot_run(cupy, fw):
    def call(M, N, K, off=0, dtype=np.uint16):
        x = cupy.zeros(M * K + off, dtype)[off:].reshape(M, K)
        return fw.gemm_into(x, cupy.zeros((N, K), np.uint16), cupy.zeros((M, N), np.float32))

    assert call(32, 128, 64)
    assert not call(16, 128, 64)  # fewer rows than MIN_ROWS (fast_gemv's)
    assert not call(129, 128, 64)  # more rows than the wgmma's N
    assert not call(32, 128, 96)  # K not a multiple of 64
    assert not call(32, 128, 64, off=1)  # rows not 16-byte aligned
    assert not call(32, 128, 64, dtype=np.float32)  # not BF16 bits
    with pytest.raises(ValueError, match="blocks"):
        fw.gemm_into(cupy.zeros((32, 64), np.uint16), cupy.zeros((128, 64), np.uint16),
                     cupy.zeros((32, 128), np.float32), blocks=2)  # one iteration (T 1): one block at most


def test_block_suite_on_fast_wgemm_wherever_it_takes_the_shape(cupy, monkeypatch):
    """The block's layer GEMMs on fast_wgemm wherever ``takes`` accepts the shape (ENABLED, MIN_ROWS 1 and fast_gemv
    off, so the vectors' small blocks reach it), through the masked_block and draft_layer vectors: no FAIL or ERROR, and
    the kernel ran. A fresh backend, so no workspace made under other switches is reused."""
    import kernels_cu.fast_gemv as fg
    import kernels_cu.fast_wgemm as fw

    if not fw._device_ok():
        pytest.skip("fast_wgemm needs a compute-capability 9.0 GPU")
    monkeypatch.setattr(fw, "ENABLED", True)
    monkeypatch.setattr(fw, "MIN_ROWS", 1)
    monkeypatch.setattr(fg, "GEMV", False)
    ran = []
    real = fw.gemm_into

    def spy(x, w, out, *a, **kw):
        ok = real(x, w, out, *a, **kw)
        ran.append((ok, tuple(out.shape)))
        return ok

    monkeypatch.setattr(fw, "gemm_into", spy)
    block_suite_clean()
    assert any(ok for ok, _ in ran), f"fast_wgemm never ran: {ran[:5]}"
