"""The block's layer GEMMs at up to 128 rows on wgmma (kernels_cu/fast_wgemm.cu), for the fast mode's B8 rounds.

At 128 rows (B8 W16) the four cuBLAS GEMMs of a 35B layer took 49.5 us against 27.6 us of weight bytes at 4.1 TB/s
(docs/PERFORMANCE.md, "Session v12"): their grids leave multiprocessors idle at these N and K, and cuBLAS kernels
never start before the kernel ahead has finished. This kernel streams the weight once by tensor copies with every
multiprocessor taking the same share of it (stream-K over 128-row tiles and 64-wide K stages), asks for its first
weight stages before the PDL wait, and writes the whole fp32 sum (tiles cut between blocks are added in block order
by the tile's last block: the same bits every run for one grid).

Off by default (``ENABLED``): the H200 measured it slower than the cuBLAS path at every layer shape (below). Built by
NVRTC for sm_90a (wgmma), one module per row count rounded up to 8 (the wgmma's N; fast_head.py's m64nNk16 wrapper).
``applies`` says where: enabled, a compute-capability 9.0 GPU, MIN_ROWS <= M <= 128, K a positive multiple of 64, and
the (N, K) in SHAPES unless SHAPES is None. CudaEngine.layer_gemm routes there and the workspace then holds the whole
output (fast_block._split_out).

Compile options: the loader's (``-std=c++17 --fmad=true -ftz=true``) with ``--gpu-architecture=sm_90a``; the only
floating-point arithmetic besides the wgmma chain is the in-order sum of a cut tile's pieces.
"""

from __future__ import annotations

import functools

import numpy as np

from kernels_cu import fast_head
from kernels_cu.loader import KERNEL_DIR, ModuleFunction, nvrtc_arch_module

# CudaEngine.layer_gemm routes the shapes ``applies`` takes here when True. False (the default): the H200 measured this
# kernel slower than the cuBLAS path at every layer shape of both geometries at 128 rows (benchmarks/wgemm_ab.py, us a
# call; this form, docs/reports/h200-wgemm-ab-v16-v3.json: 35B q/k/v 17.2 against 9.1, o 19.2 / 7.7, gate/up 24.0 /
# 17.4, down 20.7 / 9.8; 27B gate/up 103.7 / 97.3), and with the first form on the rounds at B8 W16 were slower (35B
# 0.973 -> 1.196 ms, 27B 2.073 -> 2.344; h200-round-ab-v16-a.json). Why (docs/PERFORMANCE.md "Session v16"): at 128
# rows a stage brings as many x bytes as weight bytes and a multiprocessor takes in a bounded rate (the first form,
# which issued after a block-wide barrier, 37-46 GB/s: h200-wgemm-ingest-v16.json), so the weight streams below the
# copy rate; and with 132 blocks over tens of tiles most tiles are cut, each piece a 64 KiB fp32 round trip through L2
# and one block adding a tile's pieces (at the 35B shapes 2-9 pieces a tile: 10-15 us a call beyond the floor). Kept,
# tested, for the next step (x multicast to a cluster's blocks, splits that cut few tiles).
ENABLED = False
PDL = True  # launched under programmatic dependent launch (kernels_cu/pdl.py; the first weight stages asked for before
# the wait)
MIN_ROWS = 17  # fast_gemv.cu takes the official B1 shapes (8 and 16 rows); above them this kernel
NMAX = 128  # rows (the wgmma's N; two warpgroups' N / 2 accumulators a thread)
THREADS = 384  # WG_THREADS: two consumer warpgroups and a producer warpgroup
CONSUMERS = 256  # WG_CONSUMERS: the threads whose accumulators a scratch slot holds
VT = 128  # weight rows a tile (WG_VT)
KC = 64  # K a stage (WG_KC)
STAGES = 5  # WG_STAGES (each 16 KiB of weight + 16 KiB of x at 128 rows; read at every launch)
MAX_TILES = 4096  # counters allocated a stream (one a tile)
# (N, K) the block sends here at MIN_ROWS..NMAX rows while ENABLED; None: every shape ``applies`` otherwise takes.
SHAPES: frozenset | None = None


def smem_bytes(n: int, stages: int = STAGES) -> int:
    """fast_wgemm.cu WG_SMEM_BYTES: alignment slack, the stages, their full and empty barriers, the reducer flag."""
    return 1024 + stages * (VT * KC * 2 + n * KC * 2) + 2 * stages * 8 + 16


def source(n: int, defines: tuple[tuple[str, int], ...] = ()) -> str:
    """The module's source for N = n: WG_N (and any further defines), fast_head's m64nNk16 wrapper inside the sm_90a
    guard, fast_wgemm.cu."""
    body = (KERNEL_DIR / "fast_wgemm.cu").read_text()
    guard = "#if defined(__CUDA_ARCH_FEAT_SM90_ALL)\n#include \"tma_wgmma.cuh\"\n"
    head, sep, rest = body.partition(guard)
    if not sep:
        raise RuntimeError("fast_wgemm.cu: the sm_90a guard and its include are missing")
    lines = "".join(f"#define {k} {v}\n" for k, v in (("WG_N", n), *defines))
    return lines + head + sep + fast_head.wgmma_wrapper(n) + rest


@functools.cache
def _kernel(n: int, stages: int, defines: tuple[tuple[str, int], ...] = ()):
    mod = nvrtc_arch_module(source(n, (("WG_STAGES", stages), *defines)), f"fast_wgemm_n{n}.cu",
                            fast_head.compile_options())
    return mod, ModuleFunction(mod.get_function("fast_wgemm"), "fast_wgemm", smem_bytes(n, stages))


@functools.cache
def _device_ok() -> bool:
    try:
        import cupy as cp

        dev = cp.cuda.Device()
        return dev.compute_capability == "90" and dev.attributes.get("MaxSharedMemoryPerBlockOptin", 0) >= smem_bytes(NMAX)
    except Exception:  # noqa: BLE001 - no CuPy or no GPU
        return False


def iterations(N: int, K: int) -> int:
    """T: the GEMM's (tile, K stage) iterations, 128-row tiles (the last one partly past N) by 64-wide stages."""
    return -(-N // VT) * (K // KC)


def takes(M: int, N: int, K: int) -> bool:
    """The kernel's own limits (no device query): rows, K a multiple of 64, tiles within the counters, and the
    stream-K arithmetic in 32 bits (T G < 2^31 for G <= 1024 blocks)."""
    return (MIN_ROWS <= M <= NMAX and K > 0 and K % KC == 0 and N > 0 and -(-N // VT) <= MAX_TILES
            and iterations(N, K) * 1024 < 2**31)


def applies(M: int, N: int, K: int) -> bool:
    """Whether the block sends x [M, K] @ w [N, K].T here: ENABLED, ``takes``, the shape in SHAPES (None: any), and
    an sm_90 GPU."""
    return ENABLED and takes(M, N, K) and (SHAPES is None or (N, K) in SHAPES) and _device_ok()


def grid(N: int, K: int) -> int:
    """Blocks: one a multiprocessor, at most one an iteration."""
    import cupy as cp

    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    return max(1, min(sms, iterations(N, K)))


_MAPS: dict[tuple, object] = {}  # (address, rows, cols, box rows) -> the encoded tensor map (pdl.ByValue)
_MAPS_MAX = 4096  # entries kept (a map holds only its array's address, shape and box: an entry never goes stale)
_SCRATCH: dict[tuple, tuple] = {}  # (device, stream) -> (scratch fp32, counters int32)


def _map(a, box_rows: int):
    """The 128-byte tensor map of a [rows, K] BF16 device array (fast_head.tensor_map), passed to the kernel by value
    (a __grid_constant__ parameter: a captured graph keeps it). Encoded once per (address, shape, box)."""
    key = (int(a.data.ptr), *a.shape, box_rows)
    m = _MAPS.get(key)
    if m is None:
        if len(_MAPS) >= _MAPS_MAX:
            _MAPS.clear()
        from kernels_cu.pdl import ByValue

        m = _MAPS[key] = ByValue(fast_head.tensor_map(a, box_rows).tobytes())
    return m


def _scratch():
    """The cut tiles' scratch (2 slots a block of CONSUMERS threads x NMAX / 2 floats) and the tile counters (zero between
    launches: each tile's last block resets its own), one pair a (device, stream): launches on one stream run in
    order (under PDL every access follows the kernel ahead's completion). So two launches must never run at once on
    one pair: a graph captured on a stream is replayed on that stream, not beside eager calls on it (FastRound replays
    on its capture stream). A launch that died mid-way can leave a counter short of its reset; later results on that
    stream would then be wrong, as after any device fault. About 17 MB a stream used (132 multiprocessors)."""
    import cupy as cp

    key = (cp.cuda.Device().id, cp.cuda.get_current_stream().ptr)
    hit = _SCRATCH.get(key)
    if hit is None:
        if cp.cuda.get_current_stream().is_capturing():
            raise RuntimeError("fast_wgemm: scratch made during stream capture (run the call eagerly first)")
        sms = cp.cuda.Device().attributes["MultiProcessorCount"]
        hit = _SCRATCH[key] = (cp.empty(2 * sms * CONSUMERS * (NMAX // 2), np.float32),
                               cp.zeros(MAX_TILES, np.int32))
    return hit


def first(b: int, T: int, G: int) -> int:
    """fast_wgemm.cu wg_first: block b's first iteration, floor(b T / G)."""
    return b * T // G


def owner(i: int, T: int, G: int) -> int:
    """fast_wgemm.cu wg_owner: the block whose range holds iteration i, ceil((i + 1) G / T) - 1."""
    return ((i + 1) * G - 1) // T


def pieces(tile: int, KC: int, T: int, G: int) -> list[tuple[int, int]]:
    """The kernel's plan for one tile: [(block, scratch slot)] of the blocks that cut it, in the order their pieces
    are added (block order), or [(block, -1)] where one block covers it whole (written straight to out)."""
    bf, bl = owner(tile * KC, T, G), owner(tile * KC + KC - 1, T, G)
    if bf == bl:
        return [(bf, -1)]
    return [(p, 2 * p + (tile != first(p, T, G) // KC)) for p in range(bf, bl + 1)]


def gemm_into(x, w, out, defines: tuple[tuple[str, int], ...] = (), blocks: int | None = None) -> bool:
    """out [M, N] fp32 = x [M, K] @ w [N, K].T (BF16 bits, C-contiguous, on the device). False, nothing launched,
    where the arrays do not fit (shape, dtype, order, 16-byte alignment, ``takes``). No host sync; capturable once an
    eager call on the stream made its scratch. ``blocks`` (tests): the grid instead of ``grid``'s, at most one a
    multiprocessor (the scratch's slots) and at most one an iteration (every block between a tile's first and last
    owner must bring a piece)."""
    if x.ndim != 2 or w.ndim != 2 or out.ndim != 2:
        return False
    M, K = x.shape
    N = w.shape[0]
    if (not takes(M, N, K) or w.shape[1] != K or tuple(out.shape) != (M, N) or out.dtype != np.float32
            or x.dtype != np.uint16 or w.dtype != np.uint16
            or not (x.flags.c_contiguous and w.flags.c_contiguous and out.flags.c_contiguous)
            or x.data.ptr % 16 or w.data.ptr % 16):
        return False
    from kernels_cu.pdl import launch

    n = fast_head.n_for(M)
    _, fn = _kernel(n, STAGES, defines)
    scratch, counters = _scratch()
    G = grid(N, K) if blocks is None else int(blocks)
    T = iterations(N, K)
    if not 1 <= G <= min(T, scratch.size // (2 * CONSUMERS * (NMAX // 2))):
        raise ValueError(f"fast_wgemm: {G} blocks; 1 .. min(iterations {T}, one a multiprocessor): a block without "
                         f"an iteration would leave its tile's piece count short")
    launch(fn, (G,), (THREADS,), (_map(w, VT), _map(x, n), np.int32(M), np.int32(N), np.int32(K), out,
                                            scratch, counters), smem_bytes(n, STAGES), pdl=PDL)
    return True


def config_key() -> tuple:
    """The switches that decide which layer GEMM outputs are whole (this kernel) when a block workspace is made: part
    of FastBlockMixin's workspace key (as fast_gemv.config_key), so a changed switch gets a new workspace."""
    return bool(ENABLED), int(MIN_ROWS), None if SHAPES is None else tuple(sorted(SHAPES))


def environment() -> str:
    return (f"fast_wgemm.cu (ENABLED={ENABLED}, PDL={PDL}, rows {MIN_ROWS}..{NMAX}, SHAPES={sorted(SHAPES) if SHAPES else SHAPES}, "
            f"{STAGES} stages of {VT} x {KC} issued by a producer warp, stream-K over one block a multiprocessor; NVRTC "
            f"{' '.join(fast_head.compile_options()[:-1])})")
