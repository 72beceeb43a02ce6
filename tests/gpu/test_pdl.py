"""Programmatic dependent launch (kernels_cu/pdl.py) on a GPU.

- ``pdl.launch`` really overlaps: a probe kernel launched with it starts (globaltimer) before a
  producer kernel ahead of it, which calls launch_dependents and then spins, has finished; launched
  with ``pdl=False`` it starts after. Without this the race checks below would pass vacuously;
- no kernel launched this way reads its predecessor's output before ``griddepcontrol.wait``: a
  producer that triggers at once, spins 200 us and only then writes the consumer's inputs (the
  previous contents are other values) must still give the consumer's results on the new inputs,
  bit for bit those of an ordinary launch, for the fast attention (one split and split + combine,
  the context tiles prefetched before the wait), the glue kernels (resid_norm both paths,
  qkv_post with its RoPE table before and after the wait, silu_mul) and fast_gemv (its weight rows
  staged before the wait; x read and out written only after it);
- masked_block / FastRound outputs with PDL equal those without (eager and graph), in
  tests/gpu/test_fast_round.py and test_fast_block.py, which run with PDL on (the default).
Marked ``gpu`` by tests/gpu/conftest.py; skipped with the reason where no GPU answers.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.gpu.bf16 import gauss_bits

pytestmark = pytest.mark.gpu

_SRC = r"""
extern "C" __global__ void slow_copy(const unsigned char* src, unsigned char* dst, long long n, long long spin_ns,
                                     unsigned long long* t_end) {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while ((long long)(t - t0) < spin_ns);
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        dst[i] = src[i];
    __syncthreads();
    if (t_end != 0 && threadIdx.x == 0) {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        atomicMax(t_end, t);
    }
}
extern "C" __global__ void probe(unsigned long long* t_start, const float* x, float* y, int n) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    if (threadIdx.x == 0 && blockIdx.x == 0) *t_start = t;  // the producer never touches t_start
    asm volatile("griddepcontrol.wait;" ::: "memory");
    for (int i = threadIdx.x; i < n; i += blockDim.x) y[i] = x[i];
}
"""
SPIN_NS = 20_000_000  # 20 ms: the consumer's host-side launch lands while the producer still spins


@pytest.fixture
def mod(cupy):
    """The producer / probe module, every test on a stream of its own (the legacy default stream does not
    overlap kernels: a PDL launch there waits as an ordinary one, so the checks below would be vacuous)."""
    from kernels_cu import pdl

    if not pdl.active():
        pytest.skip(f"PDL not active here (ENABLED={pdl.ENABLED}, needs compute capability 9.0+)")
    m = cupy.RawModule(code=_SRC, options=("-std=c++17",))
    with cupy.cuda.Stream(non_blocking=True) as s:
        yield m
        s.synchronize()


def _produce(cp, mod, src, dst, t_end=None):
    """dst <- src (as bytes) by a kernel that triggers its dependents at once and writes after SPIN_NS."""
    n = src.nbytes
    mod.get_function("slow_copy")((8,), (256,), (src.view(np.uint8).ravel(), dst.view(np.uint8).ravel(),
                                                 np.int64(n), np.int64(SPIN_NS),
                                                 np.uint64(0) if t_end is None else t_end))


def test_launch_overlaps_the_kernel_ahead_only_with_pdl(cupy, mod):
    from kernels_cu import pdl

    cp = cupy
    x = cp.arange(1024, dtype=np.float32)
    src, dst = cp.arange(4096, dtype=np.uint8), cp.zeros(4096, np.uint8)
    pdl.launch(mod.get_function("probe"), (1,), (128,), (cp.zeros(1, np.uint64), x, cp.zeros_like(x), np.int32(1)))
    cp.cuda.get_current_stream().synchronize()  # the first launch's host-side setup is not timed below
    for use in (True, False):
        t = cp.zeros(2, np.uint64)
        y = cp.zeros_like(x)
        _produce(cp, mod, src, dst, t[1:])
        pdl.launch(mod.get_function("probe"), (1,), (128,), (t[:1], x, y, np.int32(x.size)), pdl=use)
        cp.cuda.get_current_stream().synchronize()
        start, end = (int(v) for v in cp.asnumpy(t))
        assert cp.array_equal(y, x) and cp.array_equal(dst, src)
        if use:
            assert start < end - SPIN_NS // 2, "a PDL launch did not start before the kernel ahead finished"
        else:
            assert start >= end, "an ordinary launch started before the kernel ahead finished"


_NO_TRIGGER = r"""
extern "C" __global__ void slow_fill(float* dst, int n, float value, long long spin_ns, unsigned long long* t_end) {
    unsigned long long t0, t;  // no launch_dependents: only the graph's launch-order edge lets the probe start
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while ((long long)(t - t0) < spin_ns);
    for (int i = threadIdx.x; i < n; i += blockDim.x) dst[i] = value;
    __syncthreads();
    if (threadIdx.x == 0) {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        *t_end = t;
    }
}
"""


@pytest.mark.parametrize("launch_order", [True, False])
def test_graph_edges_relaxed_to_launch_order(cupy, mod, launch_order):
    """A captured PDL launch after a kernel that never triggers: with the edge relaxed to launch order
    (pdl.end_capture) the probe starts while that kernel still spins, and still copies what it wrote
    (the wait holds); kept as captured, it starts after."""
    from kernels_cu import pdl

    cp = cupy
    fill = cp.RawModule(code=_NO_TRIGGER, options=("-std=c++17",)).get_function("slow_fill")
    x, y, t = cp.zeros(1024, np.float32), cp.zeros(1024, np.float32), cp.zeros(2, np.uint64)
    s = cp.cuda.get_current_stream()
    pdl.launch(mod.get_function("probe"), (1,), (128,), (t[:1], x, y, np.int32(x.size)))  # warm-up
    s.synchronize()
    s.begin_capture()
    fill((1,), (256,), (x, np.int32(x.size), np.float32(7), np.int64(SPIN_NS // 4), t[1:]))
    pdl.launch(mod.get_function("probe"), (1,), (128,), (t[:1], x, y, np.int32(x.size)))
    g = pdl.end_capture(s, launch_order=launch_order)
    assert g.relaxed == (1 if launch_order else 0)
    g.launch(s)
    s.synchronize()
    start, end = (int(v) for v in cp.asnumpy(t))
    assert (start < end) == launch_order, (start, end)
    assert bool((y == 7).all())  # the fill wrote 7s; the probe copied them after its wait (x was 0 before)


def _attention_case(cp, b, w, window, seed):
    rng = np.random.default_rng(seed)
    hq, hk, d, cap, front = 32, 8, 128, 4096, 4096

    def bits(shape):
        return cp.asarray(gauss_bits(rng, shape))

    new = [bits(s) for s in ((b, w, hq, d), (b, w, hk, d), (b, w, hk, d))]
    old = [bits(x.shape) for x in new]
    kc = bits((b, cap, hk, d))
    vc = cp.asarray(np.abs(rng.standard_normal((b, cap, hk, d))).astype(np.float16).view(np.uint16))
    frontier = cp.asarray(front - 3 * np.arange(b, dtype=np.int64))
    live = cp.asarray(np.maximum(w - np.arange(b) % 3, 1).astype(np.int32))
    return new, old, (kc, vc, frontier, live, window)


@pytest.mark.parametrize("stages", [2, 4])
@pytest.mark.parametrize("inputs", ["bits", "f32"])
@pytest.mark.parametrize("splits", [1, None])
@pytest.mark.parametrize("shape", [(1, 8, 4096), (8, 16, 0)], ids=["B1W8_local", "B8W16_full"])
def test_attention_reads_q_k_v_only_after_the_wait(cupy, mod, shape, splits, inputs, stages):
    """BF16-bit q/k/v (the Op's) and FP32 ones holding BF16 values (the FP32 path), 2 and 4 K/V stages."""
    from kernels_cu.fast import FastOptions
    from kernels_cu.fast import attention as fa

    cp = cupy
    opts = FastOptions(attention_splits=splits, attention_stages=stages)
    b, w, window = shape
    new, old, rest = _attention_case(cp, b, w, window, seed=[b, w])
    if inputs == "f32":
        new, old = ([(x.astype(np.uint32) << 16).view(np.float32) for x in xs] for xs in (new, old))
    want = cp.asnumpy(fa.attention_fast(*new, *rest, f32_out=True, bf16_out=True, pdl=False, options=opts)[0])
    for last in range(3):  # only the last producer runs beside the attention: each of q, k, v in turn
        bufs = [x.copy() for x in old]
        for j in [j for j in range(3) if j != last] + [last]:
            _produce(cp, mod, new[j], bufs[j])
        got = cp.asnumpy(fa.attention_fast(*bufs, *rest, f32_out=True, bf16_out=True, pdl=True, options=opts)[0])
        # the fast kernel, not the exact fallback; at B8 W16 with BF16 bits on an H200 its wgmma form
        assert fa.last_path() in ("fast", "fast-wgmma"), fa.last_path()
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), f"input {'qkv'[last]} read early"


def test_glue_kernels_read_only_after_the_wait(cupy, mod):
    from kernels_cu.fast import block as fb

    cp = cupy
    rng = np.random.default_rng(5)
    eng = fb.CudaEngine(attention=(None, "none"))
    M, H, W, inter = 16, 2048, 16, 6144

    def twice(run, inputs):
        """run(inputs) ordinarily, then with each input first overwritten by the slow producer."""
        plain = [cp.asnumpy(o) for o in run(inputs)]
        for last in inputs:  # only the last producer runs beside the kernel: each input in turn
            bufs = {k: cp.asarray(rng.standard_normal(v.shape).astype(v.dtype)) for k, v in inputs.items()}
            for k in [k for k in inputs if k != last] + [last]:
                _produce(cp, mod, inputs[k], bufs[k])
            raced = [cp.asnumpy(o) for o in run(bufs)]
            for a, b in zip(plain, raced):
                assert np.array_equal(a.view(np.uint8), b.view(np.uint8)), f"{last} read before the wait"

    # silu_mul: gu [M, 2I] -> act
    def silu(i):
        act = cp.empty((M, inter), np.uint16)
        eng.silu_mul(i["gu"], M, inter, act)
        return [act]

    twice(silu, {"gu": cp.asarray(rng.standard_normal((M, 2 * inter)).astype(np.float32))})

    # resid_norm: resid_in + branch -> resid_out, BF16 norm (the cluster path at this shape, and the strided one)
    norm_w = cp.asarray(rng.standard_normal(H).astype(np.float32))
    for cols in (H, H - 4):
        def resid(i, cols=cols):
            out, hi = cp.empty((M, cols), np.float32), cp.empty((M, cols), np.uint16)
            eng.resid_norm(M, cols, W, resid_in=i["x"], branch=i["br"], resid_out=out, norm_w=norm_w[:cols],
                           eps=1e-6, norm_hi=hi)
            return [out, hi]

        twice(resid, {k: cp.asarray(rng.standard_normal((M, cols)).astype(np.float32)) for k in ("x", "br")})

    # qkv_post: qkv [M, (Hq + 2 Hk) D] -> q, k, v BF16 bits
    hq, hk, d = 32, 8, 128
    qn, kn = (cp.asarray(rng.standard_normal(d).astype(np.float32)) for _ in range(2))
    freqs = cp.asarray(1.0 / (1e7 ** (np.arange(0, d, 2) / d)))
    frontier = cp.asarray(np.array([4096, 77], np.int64))  # one per batch row (2 M rows at W 16: two)

    for mq in (M, 2 * M):  # the RoPE table before the wait (<= fast_block.EARLY_TABLE_MAX_ROWS rows) and after
        def qkv(i, mq=mq):
            q, k, v = (cp.empty((mq, h, d), np.uint16) for h in (hq, hk, hk))
            eng.qkv_post(i["qkv"], mq, W, hq, hk, d, qn, kn, freqs, frontier, 1e-6, q, k, v)
            return [q, k, v]

        twice(qkv, {"qkv": cp.asarray(rng.standard_normal((mq, (hq + 2 * hk) * d)).astype(np.float32))})


def _x_read_and_output_written_after_the_wait(cp, mod, run, w, x, xb, out, junk, what):
    """run(x, w, out) the ordinary way, then twice with the kernel ahead a producer that triggers at once and writes
    20 ms later: x's values into xb (which held other values), then junk into the output. The output's bits must be
    the first run's both times."""

    def raw(a):  # the output's bits
        return cp.asnumpy(a).view(np.uint32 if a.dtype == np.float32 else np.uint16)

    assert run(x, w, out)
    plain = raw(out).copy()
    _produce(cp, mod, x, xb)
    assert run(xb, w, out)
    assert np.array_equal(raw(out), plain), f"{what}: x read before the wait"
    _produce(cp, mod, junk, out)
    assert run(x, w, out)
    assert np.array_equal(raw(out), plain), f"{what}: output written before the wait"


@pytest.mark.parametrize("form,M,N,K", [("plain", 8, 2048, 6144), ("plain", 16, 1280, 5120), ("act", 8, 12288, 2048)])
def test_gemv_reads_x_and_writes_its_output_only_after_the_wait(cupy, mod, form, M, N, K):
    """fast_gemv stages its weight rows before the wait (constants); x must be read, and the output (out, or act
    for the SiLU-mul form at the 35B [gate; up] shape) written, only after it. A producer that
    triggers at once writes x (or garbage into the output) 20 ms later."""
    from kernels_cu.fast import gemv as fast_gemv

    cp = cupy
    rng = np.random.default_rng(11 if form == "plain" else 12)
    run = fast_gemv.gemv_into if form == "plain" else fast_gemv.act_into
    w, x, xb = (cp.asarray(gauss_bits(rng, shape)) for shape in ((N, K), (M, K), (M, K)))
    out = cp.empty((M, N), np.float32) if form == "plain" else cp.empty((M, N // 2), np.uint16)
    # NaN patterns as the late junk in the output
    junk = cp.full(out.shape, np.nan, np.float32) if form == "plain" else cp.full(out.shape, 0x7fc0, np.uint16)
    _x_read_and_output_written_after_the_wait(cp, mod, run, w, x, xb, out, junk, form)
