"""Launchers of kernels_cu/fast/selector.cu: the fast mode's DFlash2 selector (g and the walk) with
the exact mode's numerics, into given buffers (no allocation, no host synchronisation: the fast
round's captured graph, kernels_cu/fast/round.py).

- ``rowdot_into(x, w, out)``: out = x @ w.T summed in double and rounded once (BF16 bits, or fp32
  with ``bits_out=False``), as select.cu bf16_rowdot up to the order of the double sum (the .cu
  says when and why the results are equal); FP64 tensor cores (DMMA), one launch of clusters of 8
  blocks.
  ROWDOT_SMALL = fast_rowdot_s_v (blocks of 8 rows, mma.m8n8k4) up to 16 rows, ROWDOT_LARGE =
  fast_rowdot_m16_v (16 rows, mma.m16n8k16) above; the 2-byte load kernels where H % 8 != 0 or a
  pointer is not 16-byte aligned. H200, CUPTI, H 5120, R 256, cold L2: 120 rows m_v 30.1 -> m16_v 24.0 us;
  7 rows s_v 8.3 (m16_v 12.5). Every kernel's bits equal bf16_rowdot's there.
- ``walk_into(...)``: select.cu selector_walk, bit for bit, with every step's k x k energies
  computed up front in parallel; ``walk_supported(K, k, R)`` says where (k <= 32, R <= 256 and the
  tables within the default shared memory limit), elsewhere the caller launches selector_walk.

``rowdot_plan`` / ``walk_plan`` give the kernel, grid, block and shared memory of a launch (the CPU
test checks them; tests/test_fast_selector_plan.py).
"""

from __future__ import annotations

import numpy as np

from kernels_cu.fast.gemm import data_ptr
from kernels_cu.loader import load_module

MODULE = "fast/selector"
CLUSTER = 8  # fast/selector.cu FS_CLUSTER: blocks per cluster of the walk (grid x)
_NULL = np.uint64(0)
# fast/selector.cu's FS_ROWDOT instances: name -> (TMW, TNW, WN, WK, UB, CS, KS); a block computes
# 8 TMW rows x 8 TNW WN columns with 32 WN WK threads, a cluster of CS blocks splits h; KS the MMA's
# k: 4 (mma.m8n8k4.f64) or 16 (mma.m16n8k16.f64, Hopper's own shape).
ROWDOT_KERNELS = {
    "fast_rowdot_s_v": (1, 4, 1, 8, 2, 8, 4),  # M <= 16 (B1 K7: 7 rows)
    "fast_rowdot_s": (1, 4, 1, 8, 2, 8, 4),
    "fast_rowdot_m_v": (2, 4, 2, 4, 1, 8, 4),  # m16_v's tiling on m8n8k4 (slower than m16_v at 120 rows)
    "fast_rowdot_l": (4, 4, 2, 2, 1, 8, 4),  # the 2-byte fallback of m_v and m16_v
    "fast_rowdot_m16_v": (2, 4, 2, 4, 1, 8, 16),  # more rows (B8 K15: 120)
}
# the 2-byte load kernel that stands in for a 16-byte one where those loads do not apply
_TWO_BYTE = {"fast_rowdot_s_v": "fast_rowdot_s", "fast_rowdot_m_v": "fast_rowdot_l", "fast_rowdot_m16_v": "fast_rowdot_l"}
ROWDOT_SMALL_MAX_M = 16  # up to this many rows ROWDOT_SMALL (B1 K7 = 7 rows), else ROWDOT_LARGE
ROWDOT_SMALL = "fast_rowdot_s_v"
ROWDOT_LARGE = "fast_rowdot_m16_v"
_MAX_GRID_Z = 65535
WALK_THREADS = 512  # FS_WALK_THREADS
WALK_KERNELS = {"fast_selector_walk": WALK_THREADS}  # name -> threads
WALK_KMAX = 32  # FS_WALK_KMAX
WALK_RMAX = 256  # FS_WALK_RT * 32
WALK_SMEM_MAX = 48 * 1024 - 1024  # dynamic shared memory without raising the attribute (static: 640 B)


def rowdot_shape(name: str):
    """(rows per block, columns per block, threads, cluster size) of a rowdot kernel."""
    tmw, tnw, wn, wk, _ub, cs, _ks = ROWDOT_KERNELS[name]
    return 8 * tmw, 8 * tnw * wn, 32 * wn * wk, cs


def cp():
    import cupy

    return cupy


def _fn(module: str, name: str):
    return load_module(module).get_function(name)


def rowdot_plan(M: int, N: int, H: int, x_ptr: int = 0, w_ptr: int = 0, kernel: str | None = None):
    """(kernel name, rows per block, grid without z, block) of out[M, N] = x[M, H] @ w[N, H].T.
    16-byte loads when H % 8 == 0 and both pointers are 16-byte aligned. ``kernel`` names one of
    ROWDOT_KERNELS instead of the default choice (its _v form only where 16-byte loads apply)."""
    vec = H % 8 == 0 and x_ptr % 16 == 0 and w_ptr % 16 == 0
    if kernel is None:
        kernel = ROWDOT_SMALL if M <= ROWDOT_SMALL_MAX_M else ROWDOT_LARGE
    if not vec and kernel.endswith("_v"):
        kernel = _TWO_BYTE[kernel]
    bm, bn, threads, cs = rowdot_shape(kernel)
    return kernel, bm, (cs, -(-N // bn)), (threads,)


def rowdot_into(x, w, out, *, bits_out: bool = True, kernel: str | None = None):
    """out[M, N] (uint16 BF16 bits, or fp32 with bits_out=False) = x[M, H] @ w[N, H].T, BF16 bits
    in, C-contiguous device arrays. ``kernel``: see rowdot_plan."""
    M, H = x.shape
    N = w.shape[0]
    if w.shape[1] != H:
        raise ValueError(f"inner dimensions differ: {x.shape} and {w.shape}")
    if tuple(out.shape) != (M, N):
        raise ValueError(f"rowdot_into: out {out.shape}, expected {(M, N)}")
    if not (M and N):
        return out
    name, bm, grid_xy, block = rowdot_plan(M, N, H, data_ptr(x), data_ptr(w), kernel)
    fn = _fn(MODULE, name)
    step = _MAX_GRID_Z * bm
    for m0 in range(0, M, step):
        m1 = min(M, m0 + step)
        o = out[m0:m1]
        fn((*grid_xy, -(-(m1 - m0) // bm)), block,
           (x[m0:m1], w, np.int32(m1 - m0), np.int32(N), np.int32(H), _NULL if bits_out else o,
            o if bits_out else _NULL))
    return out


def walk_smem_bytes(K: int, k: int) -> int:
    """fast_selector_walk's dynamic shared memory: ws [k][256] fp32, lnl [K][k] double,
    tab [K][k][k] fp32, tok [K][k] int32."""
    return k * 256 * 4 + K * k * 8 + K * k * k * 4 + K * k * 4


def walk_supported(K: int, k: int, R: int) -> bool:
    return 0 < k <= WALK_KMAX and 0 < R <= WALK_RMAX and walk_smem_bytes(K, k) <= WALK_SMEM_MAX


def walk_plan(B: int, K: int, k: int, R: int, kernel: str | None = None):
    """(kernel name, grid, block, dynamic shared memory bytes) of the walk: a cluster of 8 blocks
    per batch row."""
    kernel = kernel or "fast_selector_walk"
    return kernel, (CLUSTER, B), (WALK_KERNELS[kernel],), walk_smem_bytes(K, k)


def walk_into(g, scores, ids, anchor, w_pred, w_succ, temperature, seed, frontier, path, tokens, q, *,
              kernel: str | None = None):
    """select.cu selector_walk's outputs (path, tokens [B, K] int32, q [B, K, k] fp32), bit for bit,
    into the given buffers: g [B, K, R] BF16 bits, scores [B, K, k] fp32, ids [B, K, k] int32,
    anchor int32, temperature fp32, seed uint64, frontier int64, one per row."""
    B, K, k = ids.shape
    R = g.shape[-1]
    if not walk_supported(K, k, R):
        raise ValueError(f"fast_selector_walk: K {K}, k {k}, R {R} outside its limits (walk_supported)")
    if not (B and K):
        return
    name, grid, block, smem = walk_plan(B, K, k, R, kernel)
    _fn(MODULE, name)(
        grid, block,
        (g, scores, ids, anchor, w_pred, w_succ, temperature, seed, frontier, np.int32(B), np.int32(K),
         np.int32(k), np.int32(R), path, tokens, q),
        shared_mem=smem)
