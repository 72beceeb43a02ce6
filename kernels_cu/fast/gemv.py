"""The block's layer GEMMs at few rows on kernels_cu/fast/gemv.cu.

``gemv_into(x, w, out)``: out [M, N] fp32 = x [M, K] @ w [N, K]^T, BF16 bits, FP32 accumulation on the
tensor cores, M <= MAX_M (16). ``act_into(x, w, act)``: the MLP's [gate; up] GEMM with fb_silu_mul in its
epilogue, act = BF16(SiLU(gate) * up), the same bits as the two steps. ``chooses(M, N, K)`` says whether
the block's engine sends a shape here instead of cuBLAS (``CudaEngine.layer_gemm``, whole: no K-split
partials; the [gate; up] GEMM through ``CudaEngine.mlp_act``, which takes ``act_into`` where
``options.gemv_act``).

The kernel is launched under programmatic dependent launch (kernels_cu/pdl.py, while ``options.gemv_pdl``
and ``pdl.active()``): it issues up to ``options.gemv_stage_bytes`` of its block's weight rows into shared
memory before it waits for the kernel ahead, so the weight stream of a GEMM overlaps the latency-bound
kernels before it. Weights are the round's constants (prepared once, never written by a kernel of the
round), which is what pdl.py's rule asks of anything read before the wait. See the .cu header for layout
and numerics.
"""

from __future__ import annotations

import functools

import numpy as np

from kernels_cu.fast.options import DEFAULT_OPTIONS, FastOptions
from kernels_cu.loader import allow_dynamic_shared_memory, load_module
from kernels_cu.pdl import launch

# The launch choices (whether the block sends a shape here, the SiLU-mul form, PDL, the bytes a block stages before
# the PDL wait, the grid limits) are FastOptions' gemv_* fields (kernels_cu/fast/options.py). A grid's first wave only
# can stage before the wait: grids of more than options.gemv_max_waves waves stay on cuBLAS (at the 27B layers, 2.4 to
# 16.5 waves, the kernel measured slower than cuBLAS with and without staging), and so do grids with blocks for fewer
# than options.gemv_min_fill of the multiprocessors (one block streams its rows on one multiprocessor, so the
# DFlash2 conv delta's 80 blocks on 132 SMs read at 80/132 of the bandwidth). 192 KiB of staging holds a whole block
# of the 35B layers (K 2048 / 4096 / 6144: 64 / 128 / 192 KiB) and leaves the static 4-8 KiB of the reduction under
# the H200's 227 KiB a block.
MAX_M = 16
WARPS = 8  # fast/gemv.cu FGV_WARPS
STEP_BYTES = WARPS * 2 * 32 * 16  # one step of every warp: two 16-byte slots per thread


def cp():
    import cupy

    return cupy


@functools.cache
def _fn(name: str):
    return load_module("fast/gemv").get_function(name)


def takes(M: int, N: int, K: int, options: FastOptions = DEFAULT_OPTIONS) -> bool:
    return bool(options.gemv) and 1 <= M <= MAX_M and K >= 32 and K % 32 == 0 and N >= 16 and N % 16 == 0


def staged_steps(K: int, budget: int | None = None, cap: int | None = None) -> int:
    """Steps (per warp) staged before the wait: all of a warp's chunks, or what ``budget`` (default
    options.gemv_stage_bytes) holds, at most ``cap`` bytes (the device's shared memory per block less the static
    reduction)."""
    steps = -(-(K // 32) // WARPS)
    b = int(DEFAULT_OPTIONS.gemv_stage_bytes if budget is None else budget)
    if cap is not None:
        b = min(b, int(cap))
    return max(0, min(steps, b // STEP_BYTES))


@functools.cache
def _device(dev_id: int) -> tuple[int, int]:
    """(multiprocessors, dynamic shared memory a block may opt in to, less the 8 KiB static reduction)."""
    a = cp().cuda.Device(dev_id).attributes
    return int(a["MultiProcessorCount"]), int(a.get("MaxSharedMemoryPerBlockOptin", 227 * 1024)) - 8 * 1024


def kernel_name(M: int, act: bool = False) -> str:
    """fast/gemv.cu's kernel for M rows: one n-tile of 8 rows, or two; ``act``: the SiLU-mul form."""
    return ("fast_gemv_act_" if act else "fast_gemv_") + ("n1" if M <= 8 else "n2")


def _plan(M: int, K: int, act: bool = False, options: FastOptions = DEFAULT_OPTIONS):
    """(kernel, staged steps, dynamic shared memory) of a launch on the current device, the kernel allowed
    that much shared memory."""
    _, cap = _device(cp().cuda.Device().id)
    pre = staged_steps(K, options.gemv_stage_bytes, cap=cap)
    return allow_dynamic_shared_memory(_fn(kernel_name(M, act)), pre * STEP_BYTES), pre, pre * STEP_BYTES


@functools.cache
def _per_sm(name: str, smem: int, dev_id: int) -> int:
    """Blocks of kernel ``name`` at ``smem`` bytes a multiprocessor holds (the driver's occupancy calculator)."""
    fn = allow_dynamic_shared_memory(_fn(name), smem)
    return int(cp().cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(fn.kernel.ptr, 32 * WARPS, smem))


def waves(M: int, N: int, K: int, options: FastOptions = DEFAULT_OPTIONS) -> float:
    """The grid's blocks over those the device holds at once at the staged footprint."""
    _, _, smem = _plan(M, K, options=options)
    dev = cp().cuda.Device().id
    return (N // 16) / max(1, _per_sm(kernel_name(M), smem, dev) * _device(dev)[0])


def chooses(M: int, N: int, K: int, options: FastOptions = DEFAULT_OPTIONS) -> bool:
    """Whether the block sends a GEMM of this shape here: ``takes`` it, its grid is at most options.gemv_max_waves,
    and it has a block for at least options.gemv_min_fill of the multiprocessors."""
    if not takes(M, N, K, options):
        return False
    sms, _ = _device(cp().cuda.Device().id)
    return N // 16 >= options.gemv_min_fill * sms and waves(M, N, K, options) <= options.gemv_max_waves


def _run(x, w, dst, act: bool, options: FastOptions) -> bool:
    """Launch the plain (dst = out [M, N] fp32) or SiLU-mul (dst = act [M, N / 2] BF16 bits) form; False, nothing
    launched, where the arrays do not fit the contract (shape, dtype, C order, 16-byte rows)."""
    M, K = x.shape
    N = w.shape[0]
    shape, dtype = ((M, N // 2), np.uint16) if act else ((M, N), np.float32)
    if (not takes(M, N, K, options) or w.shape[1] != K or tuple(dst.shape) != shape or dst.dtype != dtype
            or x.dtype != np.uint16 or w.dtype != np.uint16
            or not (x.flags.c_contiguous and w.flags.c_contiguous and dst.flags.c_contiguous)
            or x.data.ptr % 16 or w.data.ptr % 16):
        return False
    fn, pre, smem = _plan(M, K, act, options)
    launch(fn, (N // 16,), (32 * WARPS,), (x, w, dst, np.int32(M), np.int32(N), np.int32(K), np.int32(pre)), smem,
           pdl=options.gemv_pdl)
    return True


def gemv_into(x, w, out, options: FastOptions = DEFAULT_OPTIONS) -> bool:
    """out = x @ w.T on fast/gemv.cu; False (nothing launched) where the arrays do not fit its contract
    (shape, dtype, C order, 16-byte rows): the caller runs its GEMM instead."""
    return _run(x, w, out, False, options)


def act_into(x, w, act, options: FastOptions = DEFAULT_OPTIONS) -> bool:
    """act [M, I] = BF16(SiLU(gate) * up) (uint16 bits) of gate/up = x @ w.T, w = [gate; up] [2I, K], on the
    SiLU-mul form of the kernel: the bits of ``gemv_into`` followed by fb_silu_mul. False (nothing launched)
    where options.gemv_act is off or the arrays do not fit the contract: the caller runs the GEMM and fb_silu_mul."""
    return bool(options.gemv_act) and _run(x, w, act, True, options)


def environment(options: FastOptions = DEFAULT_OPTIONS) -> str:
    o = options
    return (f"gemv={o.gemv}: the layer GEMMs with M <= {MAX_M} rows (K % 32, N % 16) on fast/gemv.cu (mma.sync "
            f"m16n8k16, FP32 accumulation, whole: no K split) where the grid is at most {o.gemv_max_waves} "
            f"waves and at least {o.gemv_min_fill} of the multiprocessors; gemv_act={o.gemv_act} (the [gate; up] GEMM "
            f"with SiLU-mul in its epilogue); gemv_pdl={o.gemv_pdl}, {o.gemv_stage_bytes} bytes of weight rows staged "
            "per block before "
            "griddepcontrol.wait; other shapes and the heads on cuBLAS")
