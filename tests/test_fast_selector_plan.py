"""kernels_cu/fast/selector.py's launch plans on the CPU (no GPU: kernels replaced by a recorder,
CuPy by NumPy): the constants shared with fast/selector.cu, the rowdot's kernel choice, grid and
arguments (16-byte path only for H % 8 == 0 and aligned pointers; grid z split past 65535 blocks),
the h slices of the cluster covering every unit once, and the walk's limits and shared memory.
The kernels' numbers are checked on a GPU (tests/gpu/test_fast_selector.py)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from kernels_cu.fast import selector as fs
from kernels_cu.loader import source_path

SRC = source_path("fast/selector").read_text()


def _define(name: str) -> int:
    return int(re.search(rf"#define {name} (\d+)", SRC).group(1))


def _instances() -> dict:
    """FS_ROWDOT(name, TMW, TNW, WN, WK, UB, CS, VEC, KS) instantiations of the .cu: name ->
    (TMW, TNW, WN, WK, UB, CS, KS, VEC)."""
    pat = r"^FS_ROWDOT\((\w+), (\d+), (\d+), (\d+), (\d+), (\d+), (\d+), (true|false), (\d+)\)"
    return {m[0]: tuple(int(v) for v in m[1:7]) + (int(m[8]), m[7] == "true") for m in re.findall(pat, SRC, re.MULTILINE)}


def test_constants_match_the_source():
    assert _define("FS_CLUSTER") == fs.CLUSTER
    assert _define("FS_WALK_THREADS") == fs.WALK_THREADS == fs.WALK_KERNELS["fast_selector_walk"]
    assert _define("FS_WALK_KMAX") == fs.WALK_KMAX
    assert _define("FS_WALK_RT") * 32 == fs.WALK_RMAX
    walks = dict(re.findall(r"^FS_WALK\((\w+), (\w+)\)", SRC, re.MULTILINE))
    assert {n: fs.WALK_THREADS if t == "FS_WALK_THREADS" else int(t) for n, t in walks.items()} == fs.WALK_KERNELS
    inst = _instances()
    assert {n: v[:7] for n, v in inst.items()} == fs.ROWDOT_KERNELS
    for name, (tmw, tnw, wn, wk, _ub, cs, ks, vec) in inst.items():
        bm, bn, threads, got_cs = fs.rowdot_shape(name)
        assert (8 * tmw, 8 * tnw * wn, 32 * wn * wk, cs) == (bm, bn, threads, got_cs) and vec == name.endswith("_v")
        assert (bm * bn) % cs == 0 and threads <= 1024  # the cluster's blocks share the outputs evenly
        assert ks == 4 or (ks == 16 and tmw % 2 == 0)  # m16n8k16 takes the 8-row x tiles in pairs
    assert {"fast_rowdot_s", "fast_rowdot_l"} <= set(inst)  # the 2-byte fallbacks of the defaults


@pytest.mark.parametrize("M,N,H,xp,wp,name,bm,threads", [
    (7, 256, 5120, 0, 256, "fast_rowdot_s_v", 8, 256), (120, 256, 5120, 512, 0, "fast_rowdot_m16_v", 16, 256),
    (16, 256, 5120, 0, 0, "fast_rowdot_s_v", 8, 256), (17, 256, 5120, 0, 0, "fast_rowdot_m16_v", 16, 256),
    (7, 256, 5121, 0, 0, "fast_rowdot_s", 8, 256), (120, 256, 5120, 2, 0, "fast_rowdot_l", 32, 128),
    (7, 256, 5120, 0, 8, "fast_rowdot_s", 8, 256)])
def test_rowdot_plan(M, N, H, xp, wp, name, bm, threads):
    got, got_bm, grid_xy, block = fs.rowdot_plan(M, N, H, xp, wp)
    bn = fs.rowdot_shape(name)[1]
    assert got == name and grid_xy == (fs.CLUSTER, -(-N // bn)) and block == (threads,) and got_bm == bm


@pytest.mark.parametrize("kernel", sorted(fs.ROWDOT_KERNELS))
def test_rowdot_plan_named_kernel(kernel):
    got, bm, grid_xy, block = fs.rowdot_plan(120, 256, 5120, 0, 0, kernel)
    assert got == kernel and (bm, block[0]) == (fs.rowdot_shape(kernel)[0], fs.rowdot_shape(kernel)[2])
    assert grid_xy == (fs.rowdot_shape(kernel)[3], -(-256 // fs.rowdot_shape(kernel)[1]))
    slow = fs.rowdot_plan(120, 256, 5121, 0, 0, kernel)[0]  # no 16-byte loads: a 2-byte kernel
    assert not slow.endswith("_v") and slow in fs.ROWDOT_KERNELS


@pytest.mark.parametrize("H", [8, 31, 32, 200, 5120, 5128, 8192, 40000])
def test_rowdot_slices_cover_every_unit_once(H):
    """fast/selector.cu rowdot_body: slice g of G = 8 WK takes units [g n / G, (g + 1) n / G) of
    n = ceil(H / 32); together they cover each unit exactly once."""
    n = (H + 31) // 32
    for G in {v[3] * v[5] for v in _instances().values()}:
        seen = np.zeros(n, int)
        for g in range(G):
            seen[g * n // G:(g + 1) * n // G] += 1
        assert (seen == 1).all()


class _Rec:
    def __init__(self):
        self.calls = []

    def __call__(self, module, name):
        def launch(grid, block, args, **kw):
            self.calls.append((module, name, tuple(grid), tuple(block), args, kw))

        return launch


@pytest.fixture
def rec(monkeypatch):
    r = _Rec()
    monkeypatch.setattr(fs, "_fn", r)
    monkeypatch.setattr(fs, "cp", lambda: np)
    return r


def test_rowdot_into_arguments_and_grid_z_split(rec, monkeypatch):
    monkeypatch.setattr(fs, "_MAX_GRID_Z", 3)  # 3 blocks of rows per launch
    M, N, H = 200, 70, 64
    x, w = np.zeros((M, H), np.uint16), np.zeros((N, H), np.uint16)
    out = np.empty((M, N), np.float32)
    fs.rowdot_into(x, w, out, bits_out=False, kernel="fast_rowdot_l")  # 32 rows per block
    assert [c[2] for c in rec.calls] == [(8, 2, 3), (8, 2, 3), (8, 2, 1)]
    for c, m0 in zip(rec.calls, (0, 96, 192)):
        xs, ws, m, n, h, o, bits = c[4]
        assert xs.shape == (min(96, M - m0), H) and ws is w and (int(m), int(n), int(h)) == (xs.shape[0], N, H)
        assert o.shape == (xs.shape[0], N) and np.shares_memory(o, out[m0:]) and bits == np.uint64(0)
    rec.calls = []
    fs.rowdot_into(x, w, out)  # the default plan, whatever the rows per block: every row once
    name, bm, grid_xy, _ = fs.rowdot_plan(M, N, H, x.ctypes.data, w.ctypes.data)
    assert {c[1] for c in rec.calls} == {name} and sum(c[4][0].shape[0] for c in rec.calls) == M
    assert all(c[2][:2] == grid_xy and c[2][2] == -(-c[4][0].shape[0] // bm) <= 3 for c in rec.calls)
    rec.calls = []
    fs.rowdot_into(x[:0], w, out[:0])
    assert rec.calls == []
    with pytest.raises(ValueError):
        fs.rowdot_into(x, w, np.empty((M, N + 1), np.uint16))


@pytest.mark.parametrize("K,k,R,ok", [(15, 16, 256, True), (7, 16, 256, True), (1, 1, 1, True), (24, 16, 256, True),
                                      (40, 16, 256, False), (15, 33, 256, False), (15, 16, 257, False),
                                      (2, 32, 256, True), (8, 32, 256, False), (15, 0, 256, False)])
def test_walk_limits(K, k, R, ok):
    assert fs.walk_supported(K, k, R) == ok
    assert fs.walk_smem_bytes(K, k) == k * 1024 + K * k * (8 + 4 * k + 4)


def test_walk_into_launch_and_refusal(rec):
    B, K, k, R = 8, 15, 16, 256
    arrays = [np.zeros((B, K, R), np.uint16), np.zeros((B, K, k), np.float32), np.zeros((B, K, k), np.int32)]
    rest = [np.zeros(B, np.int32), np.zeros((9, R), np.uint16), np.zeros((9, R), np.uint16), np.zeros(B, np.float32),
            np.zeros(B, np.uint64), np.zeros(B, np.int64), np.zeros((B, K), np.int32), np.zeros((B, K), np.int32),
            np.zeros((B, K, k), np.float32)]
    fs.walk_into(*arrays, *rest)
    [(module, name, grid, block, args, kw)] = rec.calls
    assert (module, name, grid, block) == ("fast/selector", "fast_selector_walk", (fs.CLUSTER, B), (512,))
    assert kw == {"shared_mem": fs.walk_smem_bytes(K, k)} and [int(a) for a in args[9:13]] == [B, K, k, R]

    with pytest.raises(ValueError):
        fs.walk_into(np.zeros((B, K, 300), np.uint16), *arrays[1:], *rest)
