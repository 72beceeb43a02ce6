"""The attention that normalizes and rotates q and k itself (fast_attention.attention_qkv, session v21) on a GPU.

block_forward runs it instead of fb_qkv_post + attention_fast where fast_attention.qkv_takes the shape. Both go
through qk_norm_rope.cuh, so the claim is bit equality, checked here against the two-kernel path on the same
inputs:
- the attention output, at the round's shapes (35B / 27B GQA 4:1 at B1 W8 and B8 W16, the wgmma form among them),
  a GQA group of 16 (several row chunks, each with its own k / v scratch), one of 1 (one m-tile), windows that cut
  the block and the context, live counts of 0 .. W, positions past 2^32, split counts 1, 3 and the heuristic's;
- the block's k / v rows the last split writes (rows < live) equal fb_qkv_post's k / v;
- under PDL, behind a producer that writes qkv only after spinning 20 ms (having triggered at once), the
  kernel still gives the ordinary launch's bits: it reads qkv only after its wait (the RoPE table, written before
  the producer, it may read before);
- FastRound at the 35B geometry (tests/gpu/test_fast_round.py): fast_block.QKV_FUSED on and off give the same bits.
A mutant (q_norm for k) must break the equality, so the comparison can fail.
Marked ``gpu`` by tests/gpu/conftest.py; skipped with the reason where no GPU answers.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.gpu.bf16 import gauss_bits

pytestmark = pytest.mark.gpu

# name: B, W, Hq, Hk, window, capacity, frontier base
SHAPES = {
    "35B_B1_W8": (1, 8, 32, 8, 4096, 4096, 4096),
    "35B_B8_W16_wgmma": (8, 16, 32, 8, 0, 4096, 4096),
    "27B_B2_W16_local": (2, 16, 32, 8, 2048, 2048, 5000),
    "G16_B2_W16_chunks": (2, 16, 64, 4, 0, 300, 2**32 + 7),
    "G1_B3_W5_window5": (3, 5, 8, 8, 5, 64, 2**40),
}


def _case(cp, shape, seed):
    b, w, hq, hk, window, cap, front = SHAPES[shape]
    rng = np.random.default_rng(seed)
    d = 128
    qkv = cp.asarray(rng.standard_normal((b, w, hq + 2 * hk, d)).astype(np.float32) * 3)
    q_norm = cp.asarray((0.5 + rng.random(d)).astype(np.float32))
    k_norm = cp.asarray((0.5 + rng.random(d)).astype(np.float32))
    kc = cp.asarray(gauss_bits(rng, (b, cap, hk, d)))
    vc = cp.asarray(rng.standard_normal((b, cap, hk, d)).astype(np.float16).view(np.uint16))
    frontier = cp.asarray(front + 37 * np.arange(b, dtype=np.int64))
    live = cp.asarray(np.array([w, 0, w - 1, 1, w // 2, 3, w, 2][:b], dtype=np.int32).clip(0, w))
    inv_freq = cp.asarray(1.0 / (1e7 ** (np.arange(0, d, 2, dtype=np.float64) / d)))
    return dict(b=b, w=w, hq=hq, hk=hk, d=d, window=window, qkv=qkv, q_norm=q_norm, k_norm=k_norm, kc=kc, vc=vc,
                frontier=frontier, live=live, inv_freq=inv_freq)


def _two_kernels(cp, c, k_norm=None):
    """fb_qkv_post then attention_fast: (out bits, k bits, v bits)."""
    from kernels_cu import fast_attention as fa
    from kernels_cu.fast_block import CudaEngine

    b, w, hq, hk, d = c["b"], c["w"], c["hq"], c["hk"], c["d"]
    q = cp.empty((b, w, hq, d), np.uint16)
    k = cp.empty((b, w, hk, d), np.uint16)
    v = cp.empty((b, w, hk, d), np.uint16)
    CudaEngine.qkv_post(c["qkv"].reshape(b * w, -1), b * w, w, hq, hk, d, c["q_norm"],
                        c["k_norm"] if k_norm is None else k_norm, c["inv_freq"], c["frontier"], 1e-6, q, k, v)
    _, out = fa.attention_fast(q, k, v, c["kc"], c["vc"], c["frontier"], c["live"], c["window"], f32_out=False,
                               bf16_out=True)
    return out, k, v


def _fused(cp, c, pdl=False, before=None):
    """fb_rope_table then attention_qkv: (out bits, k scratch, v scratch)."""
    from kernels_cu import fast_attention as fa
    from kernels_cu.fast_block import CudaEngine

    b, w, hq, hk, d = c["b"], c["w"], c["hq"], c["hk"], c["d"]
    rope = cp.empty((b * w, d), np.float32)
    CudaEngine.rope_table(c["frontier"], c["inv_freq"], b * w, w, d, rope)
    shape = (fa.qkv_chunks(w, hq, hk), b, w, hk, d)
    kw, vw = cp.zeros(shape, np.uint16), cp.zeros(shape, np.uint16)
    if before is not None:
        before()
    out = fa.attention_qkv(c["qkv"], c["q_norm"], c["k_norm"], rope, 1e-6, kw, vw, c["kc"], c["vc"],
                           c["frontier"], c["live"], c["window"], hq=hq, hk=hk, pdl=pdl)
    return out, kw, vw


@pytest.fixture
def fa(cupy, monkeypatch):
    from kernels_cu import fast_attention

    monkeypatch.setattr(fast_attention, "SPLITS", None)
    return fast_attention


@pytest.mark.parametrize("splits", [None, 1, 3])
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_fused_gives_the_two_kernel_bits(cupy, fa, monkeypatch, shape, splits):
    cp = cupy
    monkeypatch.setattr(fa, "SPLITS", splits)
    c = _case(cp, shape, seed=len(shape) + (splits or 0))
    assert fa.qkv_takes(c["d"], c["w"], c["b"], c["hk"], c["kc"].shape[1])
    want, k, v = _two_kernels(cp, c)
    got, kw, vw = _fused(cp, c)
    path = fa.last_path()
    assert path.endswith("-qkv"), path
    if shape.endswith("wgmma") and fa.wg_capable():
        assert path.startswith("fast-wgmma"), path
    assert cp.array_equal(got, want), f"{shape}: {int((got != want).sum())} of {got.size} output bits differ"
    live = cp.asnumpy(c["live"])
    kh, vh, kwh, vwh = (cp.asnumpy(a) for a in (k, v, kw, vw))
    for chunk in range(kwh.shape[0]):
        for bi, n in enumerate(live):
            np.testing.assert_array_equal(kwh[chunk, bi, :n], kh[bi, :n], err_msg=f"k rows, chunk {chunk} b {bi}")
            np.testing.assert_array_equal(vwh[chunk, bi, :n], vh[bi, :n], err_msg=f"v rows, chunk {chunk} b {bi}")


def test_a_mutant_breaks_the_equality(cupy, fa):
    """k normalized with q_norm's weights on the two-kernel side: the comparison above must see it."""
    cp = cupy
    c = _case(cp, "35B_B1_W8", seed=3)
    want, _, _ = _two_kernels(cp, c, k_norm=c["q_norm"])
    got, _, _ = _fused(cp, c)
    assert not cp.array_equal(got, want)


_PRODUCER = r"""
extern "C" __global__ void late_copy(const float* src, float* dst, long long n, long long spin_ns) {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while ((long long)(t - t0) < spin_ns);
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        dst[i] = src[i];
}
"""


@pytest.mark.parametrize("shape", ["35B_B1_W8", "35B_B8_W16_wgmma"])
def test_reads_qkv_only_after_the_wait(cupy, fa, shape):
    """Under PDL behind a producer that triggers at once and writes qkv 20 ms later (qkv held other values before),
    the output is the ordinary launch's: nothing of qkv is read before griddepcontrol.wait."""
    from kernels_cu import pdl

    cp = cupy
    if not pdl.active():
        pytest.skip(f"PDL not active here (ENABLED={pdl.ENABLED}, needs compute capability 9.0+)")
    late = cp.RawModule(code=_PRODUCER, options=("-std=c++17",)).get_function("late_copy")
    with cp.cuda.Stream(non_blocking=True) as s:  # the legacy stream would serialize the launch (vacuous check)
        c = _case(cp, shape, seed=11)
        want, _, _ = _fused(cp, c)
        src = c["qkv"].copy()
        c["qkv"][...] = cp.asarray(np.random.default_rng(1).standard_normal(c["qkv"].shape).astype(np.float32))
        got, _, _ = _fused(cp, c, pdl=True, before=lambda: late((8,), (256,), (src, c["qkv"], np.int64(src.size),
                                                                               np.int64(20_000_000))))
        s.synchronize()
        assert cp.array_equal(got, want)

