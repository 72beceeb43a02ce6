"""The GPU Philox4x32-10 (kernels_cu/device/philox.cuh) against Random123's known answers and
against reference/rng.py, bit for bit (CONTRACTS C3): the words, the keyed uniforms at
the edges of the 64-bit seed and position, and the exponential race built on them."""

from __future__ import annotations

import numpy as np
import pytest

from reference import rng


def _gpu_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - no CuPy, no driver or no device: all mean "skip"
        return False


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _gpu_available(), reason="needs CuPy and a CUDA GPU")]

# Random123's kat_vectors lines for philox4x32_10 (counter, key, expected), quoted in C3.
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]

EDGE_SEEDS = np.array([0, 1, 2**32 - 1, 2**32, 2**32 + 1, 2**63, 2**64 - 2, 2**64 - 1], dtype=np.uint64)
EDGE_POSITIONS = np.array([0, 1, 2**31 - 1, 2**31, 2**32 - 2, 2**32 - 1, 2**32, 2**32 + 1, 2**40 + 7, 2**63 - 1],
                          dtype=np.int64)


def _ops():
    from kernels_cu.exact import select as ops_select

    return ops_select


def _host(x) -> np.ndarray:
    import cupy

    return cupy.asnumpy(x)


def test_known_answers():
    ctr = np.array([c for c, _, _ in KAT], dtype=np.uint32)
    key = np.array([k for _, k, _ in KAT], dtype=np.uint32)
    got = _host(_ops().philox_words(ctr, key))
    np.testing.assert_array_equal(got, np.array([e for _, _, e in KAT], dtype=np.uint32))


def test_words_match_reference_on_random_and_extreme_counters():
    g = np.random.default_rng(20240611)
    n = 1 << 16
    ctr = g.integers(0, 2**32, (n, 4), dtype=np.uint64)
    key = g.integers(0, 2**32, (n, 2), dtype=np.uint64)
    # every word at its extremes too: carries in the key schedule and mulhi of 0 and 2^32-1
    ext = np.array([0, 1, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFE, 0xFFFFFFFF], dtype=np.uint64)
    ctr[: ext.size**2, 0] = np.repeat(ext, ext.size)
    ctr[: ext.size**2, 2] = np.tile(ext, ext.size)
    key[: ext.size**2, 0] = np.tile(ext, ext.size)
    key[: ext.size**2, 1] = np.repeat(ext, ext.size)
    got = _host(_ops().philox_words(ctr.astype(np.uint32), key.astype(np.uint32)))
    np.testing.assert_array_equal(got, rng.philox4x32(ctr, key))


def test_uniforms_match_reference_at_seed_and_position_edges():
    g = np.random.default_rng(7)
    seed, pos = np.meshgrid(EDGE_SEEDS, EDGE_POSITIONS, indexing="ij")
    seed, pos = seed.ravel(), pos.ravel()
    purpose = np.resize(np.array([1, 2, 3, 4], dtype=np.uint32), seed.size)
    index = g.integers(0, 2**32, seed.size, dtype=np.uint64).astype(np.uint32)
    index[:4] = [0, 1, 2**31, 2**32 - 1]
    # plus random 64-bit keys and positions: the hi words must reach the key and counter
    m = 1 << 15
    seed = np.concatenate([seed, g.integers(0, 2**64, m, dtype=np.uint64, endpoint=False)])
    pos = np.concatenate([pos, g.integers(0, 2**63, m, dtype=np.int64)])
    purpose = np.concatenate([purpose, g.integers(1, 5, m).astype(np.uint32)])
    index = np.concatenate([index, g.integers(0, 2**18, m).astype(np.uint32)])
    got = _host(_ops().keyed_uniforms(seed, pos, purpose, index))
    want = rng.uniform(seed, pos.astype(np.uint64), purpose, index)
    assert got.dtype == np.float32
    # U is exact in float32 (C3), so the comparison is on bits, not within a tolerance
    np.testing.assert_array_equal(got, want.astype(np.float32))
    assert np.all(want.astype(np.float32).astype(np.float64) == want)
    assert got.min() > 0 and got.max() < 1


def test_race_matches_reference():
    g = np.random.default_rng(11)
    rows, V = 48, 777
    w = g.exponential(size=(rows, V)).astype(np.float32)
    w[g.random((rows, V)) < 0.3] = 0  # zero weights never enter the race
    w[0] = 0
    w[0, 123] = 1e-30  # a single contender wins however small
    w[1, :] = 1.0  # uniform weights: the uniforms alone decide
    w[2, :] = np.float32(2.0**-140)  # subnormal fp32 weights still race (no flush on the way in)
    seed = np.resize(EDGE_SEEDS, rows)
    pos = np.resize(EDGE_POSITIONS, rows)
    purpose = np.resize(np.array([1, 2, 3, 4], dtype=np.uint32), rows)
    got = _host(_ops().race_winners(w, seed, pos, purpose))
    for r in range(rows):
        want, margin = rng.exponential_race(w[r].astype(np.float64), seed[r], np.uint64(pos[r]), purpose[r])
        # the GPU scores the same float64 expression from the same fp32 weights; only the
        # last bit of log() may differ, so a disagreement needs a margin at that level
        assert got[r] == want or margin < 1e-12, (r, got[r], want, margin)


def test_race_without_contender_reports_none():
    got = _host(_ops().race_winners(np.zeros((2, 40), np.float32), [5, 6], [1, 2], [3, 4]))
    np.testing.assert_array_equal(got, [-1, -1])
