"""The head GEMM with the per-row top-k in its epilogue (kernels_cu/fast/head.cu), for the fast mode's
candidate_topk and proposal_head: their time independent of B x K.

The cuBLAS path writes fp32 logits for every hidden row (238 MB at B8 K15 on the 27B head) and reads them back
for the selection, and its GEMM grows with the rows. Here one persistent wgmma kernel streams the head once, keeps
each block's best k keys per hidden row in shared memory, and fast/topk.cu's merge takes the blocks' lists to
the final k; the logits never reach memory. Two kernels (``FastOptions.head_pingpong`` picks, default True):

- fast_head_topk_pp: two consumer warpgroups take turns over 128-row tiles, one computing on the stream while the
  other selects from the tile's logits staged in shared memory (a lane a hidden row, each row compacted at the
  tile's end, its threshold shared with the other blocks through global memory; up to
  ``FastOptions.head_warp_form_max_rows`` hidden rows a warp a row instead), a producer warpgroup issuing the tensor
  copies (fast/head.cu's header says how the turns keep the barriers' phases apart);
- fast_head_topk: 256-row tiles, the selection from the accumulators while the stream waits. Slower from 56 rows
  on (its selection is not hidden).

Built by NVRTC for sm_90a (wgmma), one module per hidden-row count rounded up to 8 (the wgmma's N), with the
m64nNk16 wrapper generated here (its register list depends on N). It applies on a compute-capability 9.0 GPU,
without a shortlist, for 1 <= k <= 16, M <= 128 hidden rows and H a multiple of 64; ``applies`` says so and
the backend keeps the cuBLAS path otherwise.

Where the Ops take it: ``FastOptions.fused_head`` and its row limits per Op (128 for both: the ping-pong kernel
measured faster than the cuBLAS path at every row count it takes). The two tensor maps reach the device by a host
copy at each launch (``maps=None``) or, for a CUDA graph, from device memory made once (``device_maps``:
FastRound's workspaces, whose hidden buffer and head stay put).

Compile options: the loader's (``-std=c++17 --fmad=true -ftz=true``) with ``--gpu-architecture=sm_90a``. The
kernel does no floating-point arithmetic besides the wgmma chain; its epilogue compares floats and forms keys.
Under -ftz a denormal logit compares equal to 0, so fk_key files it with +-0 (as fast/topk.cu's kernels, built
with the same option, do); the float pre-filters (fast_head_topk's, and the ping-pong kernel's test a set of 16
logits) only let more values through to the key compare.
"""

from __future__ import annotations

import functools

import numpy as np

from kernels_cu.fast.options import DEFAULT_OPTIONS, FastOptions
from kernels_cu.loader import KERNEL_DIR, NVRTC_OPTIONS, include_options, nvrtc_arch_module

ARCH = "sm_90a"
THREADS = 256
VT = 256  # head rows a tile (fast/head.cu HT_VT)
KC = 64  # K a stage (HT_KC)
STAGES = 4  # HT_STAGES
CAP = 32  # HT_CAP
KMAX = 16  # k the candidate buffers hold (HT_CAP / 2)
NMAX = 128  # hidden rows (wgmma N up to 256; the accumulators of two m64 blocks, N fp32 a thread, cap it here)


def n_for(M: int) -> int:
    """The wgmma N (HT_N) for M hidden rows: M rounded up to a multiple of 8."""
    return max(8, -(-M // 8) * 8)


def smem_bytes(n: int, stages: int = STAGES) -> int:
    """fast/head.cu HT_SMEM_BYTES: alignment slack, the stages, the per-row candidate buffers, thresholds and counts,
    the stages' barriers."""
    return 1024 + stages * (VT * KC * 2 + n * KC * 2) + n * (CAP * 8 + 8 + 4) + stages * 8


WARP_FORM = (("HP_WARP_ROWS", 1),)  # the warp-a-hidden-row selection (hp_select); without it a lane a row


def select_defines(M: int, options: FastOptions = DEFAULT_OPTIONS) -> tuple[tuple[str, int], ...]:
    """The selection's defines for M hidden rows: the warp form up to options.head_warp_form_max_rows rows (the lane
    form's seed and first scan cost the same at any row count, so at few rows the warp form is faster), the lane form
    above."""
    return WARP_FORM if M <= options.head_warp_form_max_rows else ()


PP_THREADS = 384  # fast/head.cu HP_THREADS
PP_VT = 128  # HP_VT
PP_LS = 132  # HP_LS: floats a hidden row of the staged logits
PP_BS = CAP + 1  # HP_BS: u64 a hidden row's candidate buffer (its slots + 1: the lanes' stores spread over the banks)


def pp_stages(n: int) -> int:
    """fast/head.cu HP_STAGES: 4 stages beside the staged logits up to N 120, 3 at N 128."""
    return 4 - (n > 120)


def smem_bytes_pp(n: int, stages: int | None = None) -> int:
    """fast/head.cu HP_SMEM_BYTES: alignment slack, the stages, the staged logits, the per-row buffers and thresholds,
    a full and an empty barrier a stage, the counts, the two turn tokens."""
    st = pp_stages(n) if stages is None else stages
    return 1024 + st * (PP_VT * KC * 2 + n * KC * 2) + n * PP_LS * 4 + n * (PP_BS * 8 + 8) + 2 * st * 8 + n * 4 + 8


def wgmma_wrapper(n: int) -> str:
    """CUDA source of ``ht_wgmma``: D (64 x n fp32, n / 2 registers a thread) (+)= A (64 x 16) B (n x 16)^T, both
    BF16 K-major from shared memory through descriptors; accumulate 0 overwrites D."""
    if n % 8 or not 8 <= n <= 256:
        raise ValueError(f"wgmma N = {n}: a multiple of 8 in 8..256")
    r = n // 2
    regs = ", ".join(f"%{i}" for i in range(r))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(r))
    return (
        f"__device__ __forceinline__ void ht_wgmma(float (&d)[{r}], u64 da, u64 db, int accumulate) {{\n"
        f'    asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{r + 2}, 0;\\n"\n'
        f'                 "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.bf16.bf16 {{{regs}}}, %{r}, %{r + 1}, p, 1, 1, 0, 0;\\n}}\\n"\n'
        f'                 : {outs}\n'
        f'                 : "l"(da), "l"(db), "r"(accumulate));\n'
        "}\n"
    )


def source(n: int, defines: tuple[tuple[str, int], ...] = ()) -> str:
    """The module's full source for N = n: HT_N (and any further defines: the probe's), the wrapper (inside the
    sm_90a guard's reach), fast/head.cu."""
    body = (KERNEL_DIR / "fast" / "head.cu").read_text()
    head, sep, rest = body.partition("#if defined(__CUDA_ARCH_FEAT_SM90_ALL)\n")
    if not sep:
        raise RuntimeError("fast/head.cu: the sm_90a guard is missing")
    lines = "".join(f"#define {k} {v}\n" for k, v in (("HT_N", n), *defines))
    return lines + head + sep + wgmma_wrapper(n) + rest


def compile_options() -> list[str]:
    return [f"--gpu-architecture={ARCH}", *NVRTC_OPTIONS, *include_options()]


@functools.cache
def _kernel(n: int, defines: tuple[tuple[str, int], ...] = (), smem: int | None = None, pingpong: bool = False):
    """The fast_head_topk (or, pingpong, fast_head_topk_pp) kernel of the module built for N = n (NVRTC, sm_90a;
    CuPy's RawModule picks plain sm_90, which has no wgmma), its dynamic shared memory limit raised (to
    smem_bytes(n) / smem_bytes_pp(n), or ``smem``)."""
    import cupy as cp

    mod = nvrtc_arch_module(source(n, defines), f"fast_head_n{n}.cu", compile_options())
    fn = mod.get_function("fast_head_topk_pp" if pingpong else "fast_head_topk")
    cp.cuda.driver.funcSetAttribute(fn.ptr, cp.cuda.driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                    smem or (smem_bytes_pp(n) if pingpong else smem_bytes(n)))
    return mod, fn


@functools.cache
def _device_ok() -> bool:
    """A compute-capability 9.0 GPU (sm_90a code runs there only) with room for the largest module's shared memory."""
    try:
        import cupy as cp

        dev = cp.cuda.Device()
        cc = dev.compute_capability
        optin = dev.attributes.get("MaxSharedMemoryPerBlockOptin", 0)
    except Exception:  # noqa: BLE001 - no CuPy or no GPU
        return False
    return cc == "90" and optin >= max(smem_bytes(NMAX), smem_bytes_pp(NMAX))


# cuTensorMapEncodeTiled's enums (cuda.h): BF16 data, no interleave, 128-byte swizzle, L2 promotion to 256 bytes,
# out-of-bounds elements read as zeros
_BF16, _INTERLEAVE_NONE, _SWIZZLE_128B, _L2_256B, _OOB_ZERO = 9, 0, 3, 3, 0


@functools.cache
def _encode_fn():
    import ctypes

    lib = ctypes.CDLL("libcuda.so.1")
    fn = lib.cuTensorMapEncodeTiled
    fn.restype = ctypes.c_int
    u32p, u64p = ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint64)
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, u64p, u64p, u32p, u32p,
                   ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    return fn


def tensor_map(a, box_rows: int) -> np.ndarray:
    """The 128-byte CUtensorMap of a [rows, H] BF16 array on the device, boxes of 64 K x box_rows rows, 128-byte
    swizzle (the layout fast/head.cu's wgmma descriptors read), as 16 uint64 for the kernel's global-memory copy."""
    import ctypes

    rows, h = a.shape
    out = np.zeros(16, dtype=np.uint64)
    dims = (ctypes.c_uint64 * 2)(h, rows)
    strides = (ctypes.c_uint64 * 1)(h * 2)
    box = (ctypes.c_uint32 * 2)(KC, box_rows)
    estr = (ctypes.c_uint32 * 2)(1, 1)
    rc = _encode_fn()(out.ctypes.data, _BF16, 2, ctypes.c_void_p(a.data.ptr), dims, strides, box, estr,
                      _INTERLEAVE_NONE, _SWIZZLE_128B, _L2_256B, _OOB_ZERO)
    if rc != 0:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed (CUresult {rc}) for a {a.shape} array, box {box_rows} rows")
    return out


def applies(M: int, Vr: int, H: int, k: int, shortlist=None, op: str | None = None,
            options: FastOptions = DEFAULT_OPTIONS) -> bool:
    """Whether the kernel takes this head: enabled, an sm_90 GPU, no shortlist, 1 <= k <= KMAX, 1 <= M <= NMAX
    (and, for an Op, M <= its options.fused_head_max_rows_*), H a positive multiple of KC, at least one head row."""
    op_rows = {"candidate_topk": options.fused_head_max_rows_topk,
               "proposal_head": options.fused_head_max_rows_proposal}
    rows = NMAX if op is None else min(NMAX, op_rows.get(op, 0))
    return (options.fused_head and shortlist is None and 1 <= k <= KMAX and 1 <= M <= rows and H > 0 and H % KC == 0
            and Vr > 0 and _device_ok())


@functools.cache
def _sm_count(dev_id: int) -> int:
    import cupy as cp

    return int(cp.cuda.runtime.deviceGetAttribute(cp.cuda.runtime.cudaDevAttrMultiProcessorCount, dev_id))


def grid(Vr: int) -> int:
    """Blocks: one a multiprocessor, fewer where the head has under a tile a multiprocessor. (The count is read once
    per device: ``Device().attributes`` queries every attribute, a host cost each call paid three times.)"""
    import cupy as cp

    return max(1, min(_sm_count(cp.cuda.runtime.getDevice()), -(-Vr // VT)))


MAP_WORDS = 32  # the two 128-byte tensor maps, as u64
# device_maps: the maps, then the shared thresholds (a u64 a hidden row, NMAX = fast/head.cu HP_GTHR_ROWS) and the
# count of blocks done with them (HP_CLEAN)
MAPS_WORDS = MAP_WORDS + NMAX + 1


def device_maps(x, w, out=None):
    """The two tensor maps of x [M, H] and w [Vr, H] (BF16 bits on the device) in device memory, for launches that
    must not copy from the host (a CUDA graph's: FastRound's workspace makes them once for its fixed hidden buffer
    and head; the Ops keep them per address, FastSelectBackend._head_plan), followed by NMAX words for the ping-pong
    kernel's shared thresholds (fast/head.cu HP_SHARED_THR) and a count, all zero: each launch leaves them zero for
    the next (the kernel's last block zeroes them), so only the kernel may write them, one launch at a time (two
    launches in flight through the same maps would count into one word). The maps hold the arrays' addresses: valid
    while both arrays live, unmoved.

    The words reach the device as the parameters of one small kernel (fast/maps.cu fh_put_maps) on the current
    stream: no host copy and no host wait, and capturable (the kernel node keeps them by value). ``out``: a
    (MAPS_WORDS,) uint64 device array to write (default: a new one)."""
    import ctypes

    import cupy as cp

    from kernels_cu import pdl
    from kernels_cu.loader import load_module

    words = np.concatenate([tensor_map(w, 64), tensor_map(x, n_for(x.shape[0]))])
    if out is None:
        out = cp.empty(MAPS_WORDS, dtype=np.uint64)
    if out.shape != (MAPS_WORDS,) or out.dtype != np.uint64 or not out.flags.c_contiguous:
        raise ValueError(f"device_maps: out {out.shape} {out.dtype}, needs ({MAPS_WORDS},) uint64")
    fn = load_module("fast/maps").get_function("fh_put_maps")
    dst = ctypes.c_void_p(int(out.data.ptr))
    zero = ctypes.c_int(MAPS_WORDS - MAP_WORDS)
    maps = (ctypes.c_uint64 * MAP_WORDS)(*(int(v) for v in words))
    params = (ctypes.c_void_p * 3)(*[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in (dst, zero)],
                                   ctypes.cast(maps, ctypes.c_void_p))
    cfg, _attrs = pdl.config((1,), (128,), 0, cp.cuda.get_current_stream().ptr, False)
    launch_ex, _ = pdl._driver()
    pdl._check(launch_ex(ctypes.byref(cfg), ctypes.c_void_p(int(fn.kernel.ptr)), params, None),
               "cuLaunchKernelEx (fh_put_maps)")
    return out


def topk_partial_into(x, w, n_elig: int, k: int, partial, dump=None, maps=None,
                      options: FastOptions = DEFAULT_OPTIONS) -> None:
    """The fused kernel: x [M, H] and w [Vr, H] BF16 bits (uint16, C-contiguous, on the device) -> partial
    [M, G, k] uint64 (each block's best k keys of each hidden row among head rows < n_elig, descending, 0 past
    them; G = grid(Vr)). dump: None, or fp32 [M, Vr] that receives the logits (tests: a build with the stores,
    HT_DUMP; the Ops' build has none). maps: None (encoded now and copied from the host, ordered on the stream), or
    device_maps(x, w) (no host copy: capturable). No host sync."""
    M, H = x.shape
    Vr = w.shape[0]
    G = grid(Vr)
    if w.shape[1] != H or x.dtype != np.uint16 or w.dtype != np.uint16:
        raise ValueError(f"fast_head: x {x.shape} {x.dtype} and w {w.shape} {w.dtype}: BF16 bits, one H")
    if not (x.flags.c_contiguous and w.flags.c_contiguous):
        raise ValueError("fast_head: x and w must be C-contiguous")
    if not applies(M, Vr, H, k, options=options):
        raise ValueError(f"fast_head: M {M}, Vr {Vr}, H {H}, k {k} outside what the kernel takes")
    if tuple(partial.shape) != (M, G, k) or partial.dtype != np.uint64:
        raise ValueError(f"fast_head: partial {partial.shape} {partial.dtype}, needs {(M, G, k)} uint64")
    if dump is not None and (tuple(dump.shape) != (M, Vr) or dump.dtype != np.float32):
        raise ValueError(f"fast_head: dump {dump.shape} {dump.dtype}, needs {(M, Vr)} float32")
    n = n_for(M)
    pingpong = options.head_pingpong
    defines = (select_defines(M, options) if pingpong else ()) + (() if dump is None else (("HT_DUMP", 1),))
    if maps is not None and (maps.shape != (MAPS_WORDS,) or maps.dtype != np.uint64):
        raise ValueError(f"fast_head: maps {maps.shape} {maps.dtype}, needs device_maps(x, w)'s ({MAPS_WORDS},) uint64")
    _, fn = _kernel(n, defines, None, pingpong)
    launch(fn, n, x, w, n_elig, k, partial, dump, smem_bytes_pp(n) if pingpong else smem_bytes(n),
           PP_THREADS if pingpong else THREADS, maps)


def launch(fn, n: int, x, w, n_elig: int, k: int, partial, dump, smem: int, threads: int = THREADS,
           maps=None) -> None:
    """One launch of a built kernel: the two tensor maps to the device (ordered on the stream before the kernel)
    unless given there, then the grid."""
    M, H = x.shape
    Vr = w.shape[0]
    if maps is None:
        maps = device_maps(x, w)
    gthr = maps[MAP_WORDS:]
    fn((grid(Vr),), (threads,), (maps, np.int32(M), np.int32(Vr), np.int32(max(0, min(n_elig, Vr))), np.int32(H),
                                 np.int32(k), partial, dump if dump is not None else np.uint64(0), gthr),
       shared_mem=smem)
