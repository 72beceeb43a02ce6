"""kernels_cu/fast/gemv.cu's layout and host plan, checked without a GPU.

The kernel feeds mma.sync m16n8k16 a permutation of each 32-wide K chunk: thread (g, t) uses the
16 bytes at k0 + 8 t of w rows g, g + 8 and of x row g, and hands their four 32-bit words to two mma
as the A / B fragments of k slots (2t, 2t + 1 | 2t + 8, 2t + 9). Emulated here with the PTX
fragment layout (A: a0 row g slots 2t.., a1 row g + 8, a2 row g slots 2t + 8.., a3 row g + 8;
B: b0 slots 2t.. column g, b1 slots 2t + 8..): every physical k of the chunk meets its own x
element exactly once, so the chunk's result is x_chunk @ w_chunk^T. The staging plan
(fast_gemv.staged_steps) and the contract (fast_gemv.takes) are checked by hand-computed values.
"""

from __future__ import annotations

import numpy as np
import pytest

from kernels_cu.fast.options import DEFAULT_OPTIONS, FastOptions


def _emulate_chunk(w16x32, x8x32):
    """The two mma of one chunk, element by element from the threads' registers."""
    c = np.zeros((16, 8))
    for mma in range(2):
        A = np.zeros((16, 16))
        B = np.zeros((16, 8))
        for lane in range(32):
            g, t = lane // 4, lane % 4
            base = 8 * t + 4 * mma  # this mma's two words: physical k base .. base + 3
            for e in range(2):
                A[g, 2 * t + e] = w16x32[g, base + e]  # a0 (word 0 / 2)
                A[g + 8, 2 * t + e] = w16x32[g + 8, base + e]  # a1
                A[g, 2 * t + 8 + e] = w16x32[g, base + 2 + e]  # a2 (word 1 / 3)
                A[g + 8, 2 * t + 8 + e] = w16x32[g + 8, base + 2 + e]  # a3
                B[2 * t + e, g] = x8x32[g, base + e]  # b0
                B[2 * t + 8 + e, g] = x8x32[g, base + 2 + e]  # b1
        c += A @ B
    return c  # [w row, x row]


def test_chunk_permutation_pairs_every_k_with_its_own_x():
    rng = np.random.default_rng(0)
    for _ in range(20):
        w = rng.integers(-8, 9, (16, 32)).astype(np.float64)
        x = rng.integers(-8, 9, (8, 32)).astype(np.float64)
        assert np.array_equal(_emulate_chunk(w, x), w @ x.T)
    # one-hot: each physical k is used once (a doubled or a missing k changes the count)
    for k in range(32):
        w = np.zeros((16, 32))
        x = np.zeros((8, 32))
        w[:, k] = 1.0
        x[:, k] = 1.0
        assert np.array_equal(_emulate_chunk(w, x), np.ones((16, 8)))


def test_staged_steps_by_hand():
    from kernels_cu.fast import gemv as fast_gemv

    assert fast_gemv.STEP_BYTES == 8 * 1024  # 8 warps x 32 threads x two 16-byte slots
    # the 35B layers: K 2048 / 4096 / 6144 are 64 / 128 / 192 chunks, 8 / 16 / 24 steps a warp, all staged
    assert [fast_gemv.staged_steps(k, 192 * 1024) for k in (2048, 4096, 6144)] == [8, 16, 24]
    # the 27B down projection (K 17408: 544 chunks, 68 steps) stages what 192 KiB holds
    assert fast_gemv.staged_steps(17408, 192 * 1024) == 24
    assert fast_gemv.staged_steps(96, 192 * 1024) == 1  # 3 chunks: one step (warps 0-2), warps 3-7 none
    assert fast_gemv.staged_steps(4096, 0) == 0 and fast_gemv.staged_steps(4096, 8 * 1024 - 1) == 0
    # the default budget fits under the H200's 227 KiB per block with the 8 KiB reduction of two n-tiles
    assert DEFAULT_OPTIONS.gemv_stage_bytes + 8 * 1024 <= 227 * 1024
    assert fast_gemv.staged_steps(6144) == 24  # the default budget is the options' gemv_stage_bytes


def test_takes_states_the_contract():
    from kernels_cu.fast import gemv as fast_gemv

    assert DEFAULT_OPTIONS.gemv
    assert fast_gemv.takes(8, 6144, 2048) and fast_gemv.takes(16, 1280, 5120) and fast_gemv.takes(1, 16, 32)
    assert not fast_gemv.takes(17, 6144, 2048)  # rows past two n-tiles: cuBLAS
    assert not fast_gemv.takes(8, 6144, 2040)  # K % 32
    assert not fast_gemv.takes(8, 6150, 2048)  # N % 16
    assert not fast_gemv.takes(0, 16, 32)
    assert not fast_gemv.takes(8, 6144, 2048, FastOptions(gemv=False))



def test_kernel_by_rows():
    from kernels_cu.fast import gemv as fast_gemv

    assert [fast_gemv.kernel_name(m) for m in (1, 8, 9, 16)] == ["fast_gemv_n1"] * 2 + ["fast_gemv_n2"] * 2
    assert [fast_gemv.kernel_name(m, act=True) for m in (8, 9)] == ["fast_gemv_act_n1", "fast_gemv_act_n2"]


class _Spy:
    """Records the engine steps CudaEngine.mlp_act takes (no GPU: the launches are stand-ins)."""

    def __init__(self, takes, act_ok):
        self.takes, self.act_ok, self.calls = takes, act_ok, []

    def act_into(self, x, w, act, options):
        self.calls.append("act_into")
        return self.act_ok


@pytest.mark.parametrize("takes,act_ok,expected", [
    (True, True, ["gemv_takes", "act_into"]),  # the fused kernel, nothing else
    (True, False, ["gemv_takes", "act_into", "layer_gemm", "silu_mul"]),  # refused: the two steps
    (False, True, ["gemv_takes", "layer_gemm", "silu_mul"]),  # not taken: never offered to the fused kernel
])
def test_engine_mlp_act_routing(monkeypatch, takes, act_ok, expected):
    """CudaEngine.mlp_act itself (the twins in test_fast_block_plan.py copy its rule): the fused kernel where
    gemv_takes the [gate; up] shape (M, 2I, K) and act_into launches; else layer_gemm into gu, then silu_mul."""
    from kernels_cu.fast import block as fb
    from kernels_cu.fast import gemv as fast_gemv

    spy = _Spy(takes, act_ok)
    monkeypatch.setattr(fb, "cp", lambda: np)
    monkeypatch.setattr(fast_gemv, "act_into", spy.act_into)
    eng = fb.CudaEngine(attention=(None, "none"))
    shapes = []

    def gemv_takes(M, N, K):
        spy.calls.append("gemv_takes")
        shapes.append((M, N, K))
        return spy.takes

    monkeypatch.setattr(eng, "gemv_takes", gemv_takes)
    monkeypatch.setattr(eng, "layer_gemm", lambda x, w, out: spy.calls.append("layer_gemm"))
    monkeypatch.setattr(eng, "silu_mul", lambda gu, M, inter, act: spy.calls.append("silu_mul"))
    M, inter, K = 8, 48, 64
    x, w = np.zeros((M, K), np.uint16), np.zeros((2 * inter, K), np.uint16)
    eng.mlp_act(x, w, np.zeros((M, 2 * inter), np.float32), np.zeros((M, inter), np.uint16), M, inter)
    assert spy.calls == expected
    assert shapes == [(M, 2 * inter, K)]


def test_dynamic_shared_memory_is_allowed_once_per_kernel_and_size():
    """loader.allow_dynamic_shared_memory (fast_gemv and fast_attention): the attribute is set only above
    the 48 KiB default and only when a kernel needs more than it was already allowed."""
    from kernels_cu.loader import allow_dynamic_shared_memory

    class Kernel:  # a RawKernel's attribute, recorded
        def __init__(self):
            self.sets = []

        @property
        def max_dynamic_shared_size_bytes(self):
            return self.sets[-1] if self.sets else 0

        @max_dynamic_shared_size_bytes.setter
        def max_dynamic_shared_size_bytes(self, v):
            self.sets.append(v)

    a, b = Kernel(), Kernel()
    assert allow_dynamic_shared_memory(a, 32 * 1024) is a and a.sets == []  # under the default: nothing
    allow_dynamic_shared_memory(a, 64 * 1024)
    allow_dynamic_shared_memory(a, 64 * 1024)
    allow_dynamic_shared_memory(a, 60 * 1024)
    allow_dynamic_shared_memory(a, 192 * 1024)
    allow_dynamic_shared_memory(b, 64 * 1024)  # another kernel keeps its own record
    assert a.sets == [64 * 1024, 192 * 1024] and b.sets == [64 * 1024]
