"""kernels_cu/fast/gemv.cu on a GPU: the block's layer GEMMs at few rows.

- out = x @ w^T for M 1 .. 16 (one and two n-tiles), K from one chunk (32) to the 35B / 27B layers'
  widths, a chunk count that is not a multiple of the warps x unroll: every element within the FP32
  summation bound of the float64 product (BF16 x BF16 products are exact in FP32, so any order of
  addition is within gamma_(K-1) sum |x_k w_k|); a wrong k permutation, a dropped chunk or a wrong
  output index is far outside it (the planted products in the first and last chunks make a chunk
  dropped at either end visible);
- the staging of the weight rows before the wait changes where w is read from, not the order of
  addition: no staging, part of K staged and all of it give the same bits, with PDL and without;
- the same bits on every call and inside a captured graph;
- shapes and arrays outside the kernel's contract are refused (False), so the caller runs cuBLAS;
- the SiLU-mul form (``act_into``: block c computes gate rows 8c.. and up rows I + 8c..)
  gives the bits of the plain kernel followed by fb_silu_mul, at every staging budget, PDL on and off,
  eager and in a graph.
The race against a late producer of x (x read only after the wait) is in tests/gpu/test_pdl.py.
Marked ``gpu`` by tests/gpu/conftest.py; skipped with the reason where no GPU answers.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.gpu.bf16 import gauss_bits as _bits
from tests.gpu.bf16 import to_f64 as _f64
from tests.gpu.block_suite import block_suite_clean
from tests.gpu.graphs import eager_and_replayed

pytestmark = pytest.mark.gpu
U = 2.0**-24


def _case(M, N, K):
    xh, wh = _bits(M * 7 + 1, (M, K)), _bits(N + K, (N, K))
    for k in (0, K - 1):  # planted products (8 x 8) in the first and the last chunk of every row
        xh[:, k] = 0x4100
        wh[:, k] = 0x4100
    return xh, wh


@pytest.mark.parametrize("M,N,K", [(1, 16, 32), (8, 2048, 4096), (8, 6144, 2048), (7, 48, 96), (9, 32, 2048),
                                   (16, 1280, 5120), (16, 64, 6144), (3, 5120, 17408), (8, 16, 1056)])
def test_gemv_within_the_fp32_bound_and_repeatable(cupy, M, N, K):
    from kernels_cu.fast import gemv as fast_gemv

    xh, wh = _case(M, N, K)
    x, w = cupy.asarray(xh), cupy.asarray(wh)
    out = cupy.full((M, N), np.nan, np.float32)
    assert fast_gemv.gemv_into(x, w, out)
    got = cupy.asnumpy(out).astype(np.float64)
    xf, wf = _f64(xh), _f64(wh)
    exact = xf @ wf.T
    # FP32 summation of K exact products: |error| <= gamma_(K-1) * sum |x_k w_k| (Higham 3.1)
    bound = (K - 1) * U / (1 - (K - 1) * U) * (np.abs(xf) @ np.abs(wf).T)
    err = np.abs(got - exact)
    assert np.isfinite(got).all()
    assert (err <= bound).all(), f"{float((err / bound).max()):.3g} x the bound"
    first = cupy.asnumpy(out).view(np.uint32).copy()
    out.fill(0)
    fast_gemv.gemv_into(x, w, out)
    assert np.array_equal(cupy.asnumpy(out).view(np.uint32), first)


@pytest.mark.parametrize("M,N,K", [(8, 2048, 6144), (16, 1280, 5120), (5, 64, 17408), (8, 32, 96)])
def test_staging_and_pdl_do_not_change_the_bits(cupy, M, N, K):
    from kernels_cu.fast import DEFAULT_OPTIONS, FastOptions
    from kernels_cu.fast import gemv as fast_gemv

    xh, wh = _case(M, N, K)
    x, w = cupy.asarray(xh), cupy.asarray(wh)
    steps = -(-(K // 32) // fast_gemv.WARPS)
    seen = {}
    # the last budgets exceed what a block may hold at K 17408: the plan caps them at the device's limit
    for budget in (0, fast_gemv.STEP_BYTES, 3 * fast_gemv.STEP_BYTES, steps * fast_gemv.STEP_BYTES,
                   DEFAULT_OPTIONS.gemv_stage_bytes):
        for use_pdl in (True, False):
            opts = FastOptions(gemv_stage_bytes=budget, gemv_pdl=use_pdl)
            out = cupy.full((M, N), np.nan, np.float32)
            assert fast_gemv.gemv_into(x, w, out, opts)
            seen[(budget, use_pdl)] = cupy.asnumpy(out).view(np.uint32).copy()
    ref = seen[(0, False)]
    for key, bits in seen.items():
        assert np.array_equal(bits, ref), f"staging budget {key[0]} B, PDL {key[1]}: other bits"


def test_gemv_in_a_graph_gives_the_eager_bits(cupy):
    from kernels_cu.fast import gemv as fast_gemv

    x, w = cupy.asarray(_bits(1, (8, 2048))), cupy.asarray(_bits(2, (12288, 2048)))
    out = cupy.empty((8, 12288), np.float32)
    # the copies above ran on the legacy stream, which a non-blocking stream does not wait for (a pageable
    # copy returns before its DMA lands; without this the eager call races w's upload)
    cupy.cuda.Device().synchronize()
    eager, replayed = eager_and_replayed(cupy, lambda: fast_gemv.gemv_into(x, w, out), out)
    assert np.array_equal(replayed, eager)


def _silu_case(M, inter, K, seed):
    xh, wh = _case(M, 2 * inter, K)
    rng = np.random.default_rng(seed)
    # large gate sums too (|gate| >> 88: exp(-g) overflows to inf or underflows to 0 in SiLU's FP32 arithmetic)
    big = rng.choice(2 * inter, size=min(4, inter), replace=False)
    wh[big, :] = 0x4200  # 32.0 in every column: that row's sum is 32 * sum(x), large for most rows of x
    return xh, wh


@pytest.mark.parametrize("M,inter,K", [(8, 6144, 2048), (1, 8, 32), (9, 1024, 2048), (16, 40, 96), (3, 64, 17408)])
def test_act_form_gives_the_plain_gemm_then_silu_mul_bits(cupy, M, inter, K):
    """act_into == gemv_into into gu, then fb_silu_mul (CudaEngine.silu_mul), bit for bit: a row's sum does not
    depend on where the row sits in the block's tile, and the activation is the same device function. A wrong
    gate/up row pairing, a column index off by one or a skipped SiLU differs in most elements. At every staging
    budget (K 17408 leaves steps past the budget) and PDL on and off."""
    from kernels_cu.fast import DEFAULT_OPTIONS, FastOptions
    from kernels_cu.fast import block as fast_block
    from kernels_cu.fast import gemv as fast_gemv

    xh, wh = _silu_case(M, inter, K, M + inter)
    x, w = cupy.asarray(xh), cupy.asarray(wh)
    gu = cupy.full((M, 2 * inter), np.nan, np.float32)
    assert fast_gemv.gemv_into(x, w, gu)
    ref = cupy.empty((M, inter), np.uint16)
    fast_block.CudaEngine.silu_mul(gu, M, inter, ref)
    ref = cupy.asnumpy(ref)
    assert len(np.unique(ref)) > min(ref.size // 2, 8)  # not a constant that any wrong kernel could match
    steps = -(-(K // 32) // fast_gemv.WARPS)
    for budget in (0, fast_gemv.STEP_BYTES, steps * fast_gemv.STEP_BYTES, DEFAULT_OPTIONS.gemv_stage_bytes):
        for use_pdl in (True, False):
            opts = FastOptions(gemv_stage_bytes=budget, gemv_pdl=use_pdl)
            buf = cupy.full((16, inter), 0x7fc0, np.uint16)  # rows M .. 15: sentinels no store may touch
            assert fast_gemv.act_into(x, w, buf[:M], opts)
            got, rest = cupy.asnumpy(buf[:M]), cupy.asnumpy(buf[M:])
            assert np.array_equal(got, ref), (
                f"budget {budget} B, PDL {use_pdl}: {int((got != ref).sum())} of {ref.size} elements differ")
            assert (rest == 0x7fc0).all(), f"a store past row {M}"


def test_act_form_in_a_graph_and_its_refusals(cupy):
    from kernels_cu.fast import FastOptions
    from kernels_cu.fast import gemv as fast_gemv

    x, w = cupy.asarray(_bits(3, (8, 2048))), cupy.asarray(_bits(4, (12288, 2048)))
    act = cupy.empty((8, 6144), np.uint16)
    cupy.cuda.Device().synchronize()  # the uploads ran on the legacy stream (see the graph test above)
    eager, replayed = eager_and_replayed(cupy, lambda: fast_gemv.act_into(x, w, act), act)
    assert np.array_equal(replayed, eager)
    assert not fast_gemv.act_into(x, w, cupy.empty((8, 6143), np.uint16))  # act is not [M, N / 2]
    assert not fast_gemv.act_into(x, w, cupy.empty((8, 6144), np.float32))  # act is not BF16 bits
    assert not fast_gemv.act_into(x, w[:, :2016].copy(), act)  # K differs from x's
    # switched off: the caller runs the GEMM and fb_silu_mul
    assert not fast_gemv.act_into(x, w, act, FastOptions(gemv_act=False))


def test_the_block_chooses_one_wave_grids(cupy):
    """CudaEngine sends a layer GEMM here only when its grid fits options.gemv_max_waves at the staged footprint: the 35B
    qkv (384 blocks of 64 KiB, three a multiprocessor on the H200's 132) and o (128 blocks) do; the 27B
    qkv (384 blocks of 160 KiB, one a multiprocessor) does not."""
    from kernels_cu.fast import FastOptions
    from kernels_cu.fast import block as fast_block
    from kernels_cu.fast import gemv as fast_gemv

    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    assert fast_gemv.waves(8, 2048, 4096) == pytest.approx(128 / sms)
    assert fast_gemv.waves(8, 6144, 5120) == pytest.approx(384 / sms)
    # one wave at most: the 35B gate/up (1.9 waves) then stays out
    eng = fast_block.CudaEngine(attention=(None, "none"), options=FastOptions(gemv_max_waves=1.0))
    if sms >= 128:
        assert eng.gemv_takes(8, 6144, 2048) and eng.gemv_takes(8, 2048, 4096)
    assert not eng.gemv_takes(8, 6144, 5120) and not eng.gemv_takes(128, 6144, 2048)
    assert not eng.gemv_takes(16, 1280, 5120)  # 80 blocks: under gemv_min_fill of the multiprocessors


def test_gemv_refuses_what_it_cannot_run(cupy):
    from kernels_cu.fast import gemv as fast_gemv

    def call(M, N, K, off=0):
        x = cupy.zeros(M * K + off, np.uint16)[off:].reshape(M, K)
        return fast_gemv.gemv_into(x, cupy.zeros((N, K), np.uint16), cupy.zeros((M, N), np.float32))

    assert call(8, 64, 64)
    assert not call(17, 64, 64)  # more rows than two n-tiles
    assert not call(8, 64, 48)  # K not a multiple of 32
    assert not call(8, 40, 64)  # N not a multiple of 16
    assert not call(8, 64, 64, off=1)  # rows not 16-byte aligned


def test_block_suite_on_fast_gemv_wherever_it_takes_the_shape(cupy, monkeypatch):
    """The block's layer GEMMs on fast_gemv wherever ``takes`` accepts the shape (the wave and fill rules
    off: the vectors' grids are far smaller than the GPU, so the default rules never choose it there),
    through the masked_block and draft_layer vectors: no FAIL or ERROR, as on cuBLAS, and the kernel ran.
    A fresh backend with these options."""
    from kernels_cu.fast import FastOptions
    from kernels_cu.fast import gemv as fg

    ran = []
    real = fg.gemv_into

    def spy(x, w, out, options):
        ok = real(x, w, out, options)
        ran.append((ok, tuple(out.shape)))
        return ok

    monkeypatch.setattr(fg, "gemv_into", spy)
    real_act = fg.act_into

    def spy_act(x, w, act, options):
        ok = real_act(x, w, act, options)
        ran.append((ok, ("act", *act.shape)))
        return ok

    monkeypatch.setattr(fg, "act_into", spy_act)
    block_suite_clean(FastOptions(gemv_min_fill=0.0, gemv_max_waves=float("inf")))
    assert any(ok for ok, _ in ran), f"fast_gemv never ran: {ran[:5]}"
    assert any(ok and shape[0] == "act" for ok, shape in ran), f"the SiLU-mul form never ran: {ran[:5]}"
