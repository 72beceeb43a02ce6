"""kernels_cu/fast_wgemm (issue 12, session v16) without a GPU: the stream-K split's plan, the routing of the
block's layer GEMMs, and the by-value kernel argument of its tensor maps.

The split model (fast_wgemm.first / owner / pieces) is checked against a brute-force formulation (each block's
range laid out, each iteration's block found by search), and tied to the kernel by its formulas' text: the kernel
must compute what the model computes, since the GPU tests can reach only some grids.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels_cu import fast_wgemm as fw
from kernels_cu.loader import KERNEL_DIR


def _brute(tiles: int, KC: int, G: int):
    """Block b's range [b T / G, (b + 1) T / G) laid out; for each tile the blocks that touch it, in order, and for
    each block the tiles it touches."""
    T = tiles * KC
    bounds = [b * T // G for b in range(G + 1)]
    touch = {t: [] for t in range(tiles)}
    of_block = {b: [] for b in range(G)}
    for b in range(G):
        for i in range(bounds[b], bounds[b + 1]):
            t = i // KC
            if not touch[t] or touch[t][-1] != b:
                touch[t].append(b)
            if not of_block[b] or of_block[b][-1] != t:
                of_block[b].append(t)
    return T, bounds, touch, of_block


@settings(max_examples=300, deadline=None)
@given(tiles=st.integers(1, 40), KC=st.integers(1, 40), data=st.data())
def test_split_plan_matches_the_brute_force_layout(tiles, KC, data):
    T = tiles * KC
    G = data.draw(st.integers(1, min(T, 200)))
    _, bounds, touch, of_block = _brute(tiles, KC, G)
    assert all(bounds[b + 1] > bounds[b] for b in range(G))  # G <= T: no block without an iteration
    for i in range(T):  # owner() finds the block whose range holds i
        b = fw.owner(i, T, G)
        assert bounds[b] <= i < bounds[b + 1]
    used = set()
    for t in range(tiles):
        plan = fw.pieces(t, KC, T, G)
        assert [b for b, _ in plan] == touch[t]  # the blocks that cut the tile, in block order
        if len(plan) == 1:
            assert plan[0][1] == -1  # whole: written straight to out, no slot
            continue
        for b, slot in plan:
            # slot 2b is the block's first tile's, 2b + 1 its last one's; a cut tile is one of the two
            assert slot == (2 * b if t == of_block[b][0] else 2 * b + 1)
            assert t in (of_block[b][0], of_block[b][-1])
            assert (b, slot) not in used  # no slot written twice in a launch
            used.add((b, slot))


def test_a_floor_owner_would_misplace_a_boundary_iteration():
    """The mutant owner floor(i G / T) (the inverse read the wrong way) names the wrong block for some iteration:
    the brute-force comparison above would catch it."""
    T, G = 30, 7
    bounds = [b * T // G for b in range(G + 1)]
    wrong = [i for i in range(T) if not bounds[i * G // T] <= i < bounds[i * G // T + 1]]
    assert wrong and all(bounds[fw.owner(i, T, G)] <= i < bounds[fw.owner(i, T, G) + 1] for i in range(T))


def test_the_kernel_computes_the_models_formulas():
    src = (KERNEL_DIR / "fast_wgemm.cu").read_text()
    for text in ("return ((i + 1) * G - 1) / T;",  # owner
                 "return b * T / G;",  # first
                 "const int slot = 2 * b + (tile != i0 / KC);",  # the writer's slot
                 "2 * p + (tile != wg_first(p, T, G) / KC)",  # the reducer's lookup of block p's slot
                 "atomicAdd(&counters[tile], 1) == bl - bf",  # the last of bl - bf + 1 pieces reduces
                 "for (int p = bf; p <= bl; ++p)"):  # in block order
        assert text in src, text


def test_takes_limits():
    assert fw.takes(128, 6144, 2048) and fw.takes(17, 128, 64)
    assert not fw.takes(16, 6144, 2048)  # fast_gemv's rows
    assert not fw.takes(129, 6144, 2048)  # past the wgmma's N
    assert not fw.takes(64, 6144, 2000)  # K not a multiple of 64
    assert not fw.takes(64, 128 * (fw.MAX_TILES + 1), 64)  # more tiles than counters


def test_smem_fits_one_block_a_multiprocessor():
    assert fw.smem_bytes(128) <= 227 * 1024  # the H200's opt-in limit a block


def test_pdl_passes_a_struct_by_value():
    from kernels_cu.pdl import ByValue, kernel_arg

    m = np.arange(16, dtype=np.uint64)
    v = kernel_arg(ByValue(m.tobytes()))
    assert ctypes.sizeof(v) == 128 and bytes(v) == m.tobytes()
    with pytest.raises(TypeError, match="pdl.launch"):  # a bare host array stays refused
        kernel_arg(m)


@pytest.mark.parametrize("gemv,gemv_ok,wgemm,ok,expected", [
    (False, True, True, True, ["wgemm"]),  # taken and launched: nothing else
    (False, True, True, False, ["wgemm", "gemm"]),  # refused: cuBLAS
    (False, True, False, True, ["gemm"]),  # not taken: never offered
    (True, True, True, True, ["gemv"]),  # fast_gemv first where it takes the shape
    (True, False, True, True, ["gemv", "wgemm"]),  # fast_gemv refused: then the wgmma kernel
])
def test_layer_gemm_routing(monkeypatch, gemv, gemv_ok, wgemm, ok, expected):
    import kernels_cu.fast_block as fb
    from kernels_cu import fast_gemv

    calls = []
    monkeypatch.setattr(fb, "cp", lambda: np)
    monkeypatch.setattr(fast_gemv, "chooses", lambda M, N, K: gemv)
    monkeypatch.setattr(fast_gemv, "gemv_into", lambda x, w, out: calls.append("gemv") or gemv_ok)
    monkeypatch.setattr(fw, "applies", lambda M, N, K: wgemm)
    monkeypatch.setattr(fw, "gemm_into", lambda x, w, out: calls.append("wgemm") or ok)
    eng = fb.CudaEngine(attention=(None, "none"))
    monkeypatch.setattr(eng, "gemm", lambda x, w, out: calls.append("gemm"))
    eng.layer_gemm(np.zeros((128, 64), np.uint16), np.zeros((256, 64), np.uint16), np.zeros((128, 256), np.float32))
    assert calls == expected


def test_workspace_holds_the_whole_output_where_wgemm_takes_the_shape(monkeypatch):
    """A split_k shape (35B o: (2048, 4096), split in GEMM_SPLITS' S) gets [M, N] where the wgmma kernel takes it,
    [S, M, N] where not: the kernel writes the whole sum, the consumer must not read S partials."""
    import kernels_cu.fast_block as fb

    class Eng:
        empty = staticmethod(lambda shape, dtype: np.zeros(shape, dtype))
        gemv_takes = staticmethod(lambda M, N, K: False)

        def __init__(self, takes):
            self.wgemm_takes = lambda M, N, K: takes

    S = fb.split_k(128, 2048, 4096)
    assert S > 1  # the shape is split (else this test checks nothing)
    assert fb._split_out(Eng(True), 128, 2048, 4096).shape == (128, 2048)
    assert fb._split_out(Eng(False), 128, 2048, 4096).shape == (S, 128, 2048)


def test_the_block_workspace_key_follows_the_wgemm_switches(monkeypatch):
    """A changed fast_wgemm switch makes a new block workspace (its outputs whole or K-split), as fast_gemv's do."""
    base = fw.config_key()
    monkeypatch.setattr(fw, "ENABLED", not fw.ENABLED)
    assert fw.config_key() != base
    monkeypatch.setattr(fw, "ENABLED", not fw.ENABLED)
    monkeypatch.setattr(fw, "MIN_ROWS", fw.MIN_ROWS + 1)
    assert fw.config_key() != base
    monkeypatch.setattr(fw, "MIN_ROWS", fw.MIN_ROWS - 1)
    monkeypatch.setattr(fw, "SHAPES", frozenset({(2048, 4096)}))
    assert fw.config_key() != base


def test_gemm_into_refuses_arrays_that_are_not_matrices():
    x = np.zeros((2, 32, 64), np.uint16)  # never reaches the device: refused on shape
    assert fw.gemm_into(x, np.zeros((128, 64), np.uint16), np.zeros((32, 128), np.float32)) is False


def test_the_gpu_split_cases_reach_every_branch():
    """tests/gpu/test_fast_wgemm.py's split cases (N, K, grid) reach both branches of the epilogue (the model is fast_wgemm.pieces), both scratch slots,
    and blocks whose range holds a whole tile and a cut one (both stores in one range)."""
    cut = whole = 0
    slots, mixed = set(), set()
    for N, K, G in ((256, 256, 1), (384, 640, 7), (128, 1024, 12), (128, 1024, 16), (200, 192, 5), (1000, 64, 3),
                    (640, 256, 3)):
        KC, tiles = K // 64, -(-N // fw.VT)
        kinds = {}
        for t in range(tiles):
            p = fw.pieces(t, KC, tiles * KC, G)
            cut += p[0][1] >= 0
            whole += p[0][1] < 0
            for b, slot in p:
                kinds.setdefault(b, set()).add("cut" if slot >= 0 else "whole")
                if slot >= 0:
                    slots.add(slot % 2)
        mixed |= {(N, K, G) for k in kinds.values() if k == {"cut", "whole"}}
    assert cut and whole and slots == {0, 1}
    assert (640, 256, 3) in mixed
