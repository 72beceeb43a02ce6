"""kernels_cu/fast_gemv.cu's layout, checked without a GPU (issue 12).

The kernel feeds mma.sync m16n8k16 a permutation of each 32-wide K chunk: thread (g, t) loads the
16 bytes at k0 + 8 t of w rows g, g + 8 and of x row g, and hands their four 32-bit words to two mma
as the A / B fragments of k slots (2t, 2t + 1 | 2t + 8, 2t + 9). Emulated here with the PTX
fragment layout (A: a0 row g slots 2t.., a1 row g + 8, a2 row g slots 2t + 8.., a3 row g + 8;
B: b0 slots 2t.. column g, b1 slots 2t + 8..): every physical k of the chunk meets its own x
element exactly once, so the chunk's result is x_chunk @ w_chunk^T; and fast_gemv.takes states the
contract.
"""

from __future__ import annotations

import numpy as np


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


def test_takes_states_the_contract(monkeypatch):
    from kernels_cu import fast_gemv

    monkeypatch.setattr(fast_gemv, "GEMV", True)
    assert fast_gemv.takes(8, 6144, 2048) and fast_gemv.takes(16, 1280, 5120) and fast_gemv.takes(1, 16, 32)
    assert not fast_gemv.takes(17, 6144, 2048)  # rows past two n-tiles: cuBLAS
    assert not fast_gemv.takes(8, 6144, 2040)  # K % 32
    assert not fast_gemv.takes(8, 6150, 2048)  # N % 16
    assert not fast_gemv.takes(0, 16, 32)
    monkeypatch.setattr(fast_gemv, "GEMV", False)
    assert not fast_gemv.takes(8, 6144, 2048)
