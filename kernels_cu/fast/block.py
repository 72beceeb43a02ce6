"""Fast mode of masked_block and draft_layer: ``FastBlockMixin``.

Composed in front of the fast backend (``class B(FastBlockMixin, FastCudaBackend)``); it uses
FastCudaBackend's resident weights (``self.resident``, ``self._bits``, ``self._f32``,
``self._inv_freq``) and its ``gemm_bf16`` (cuBLAS gemmEx, BF16 in, FP32 out, FP32 accumulation).

One layer, M = B * W rows (reference/draft_layer.py; the named BF16 intermediates are the
baseline's, so rounding there is inside the tight bound):

    X  = x (+ the previous layer's MLP branch, DFlash2: + BF16(conv finish))  fp32 residual stream
    n  = RMSNorm(X)                                  fused with the residual update (fb_resid_norm)
         DFlash:  BF16(n) feeds the GEMM (named "n")
         DFlash2: n stays fp32 (the spec keeps it private); the conv delta GEMM runs on the rows
                  [BF16(n); BF16(n - BF16(n))] stacked (2M rows, one weight read) and sums the two
                  halves, which is n's projection to ~2^-17 relative, then fb_conv_prepare
                  gives prepared = BF16(Conv_0(n)) and the BF16 finish delta
    qkv = gemm(n or prepared, [W_q; W_k; W_v])       one GEMM, weights concatenated once, resident
         (each layer GEMM: cuBLAS, or at <= 16 rows kernels_cu/fast/gemv.cu where its grid fits
         the GPU, CudaEngine.layer_gemm: it stages its weight rows before its PDL wait)
    q, k = RoPE(head RMSNorm), v, each rounded once to BF16 and kept as BF16 bits (fb_qkv_post; named
         q, k, v_proj)
    a  = attention (kernels_cu.fast.attention.attention_fast when that module exists, else the
         exact kernel of kernels_cu.exact.attention), BF16 out (named "attn")
    o  = gemm(a, W_o)
    y  = X + o (DFlash2: + BF16(Conv_1(o)), as the exact mode), m = RMSNorm(y): fb_resid_norm
    gu = gemm(BF16(m) or prepared_m, [W_gate; W_up]);  act = BF16(SiLU(gate) * up) (named "act"; one
         kernel where fast_gemv runs the GEMM: the SiLU-mul in its epilogue, CudaEngine.mlp_act)
    z  = gemm(act, W_down);  x_next = y + z (+ conv finish), fused into the next layer's norm or
         into the final RMSNorm (masked_block: mask columns only, BF16) / the BF16 x_next.

The residual stream stays fp32 between layers (the reference's "x" and "y" may be BF16; fp32 is
closer to it). Per call: no host synchronisation, no weight conversion after the first call that
sees a weight array, and every intermediate lives in a workspace cached per shape. What a CUDA
graph capture of a call meets is listed in ``CAPTURE_NOTES``.

The orchestration (``block_forward``) is written against a small engine interface so that
tests/test_fast_block_plan.py can run the same sequence with a NumPy twin of the kernels on the CPU.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections import OrderedDict

import numpy as np

from kernels_cu.exact.attention import bf16_bits, device, f16_bits
from kernels_cu.fast import gemv as fast_gemv
from kernels_cu.fast.gemm import _key, gemm_bf16, loaded_library
from kernels_cu.fast.options import DEFAULT_OPTIONS, FastOptions
from kernels_cu.loader import load_module
from kernels_cu.pdl import launch

_NULL = np.uint64(0)
_THREADS = 256
_QKV_WARPS = 8  # fast/block.cu FB_QKV_WARPS: heads per fb_qkv_post block
_MAX_GRID = 65535 * 8
_WS_KEEP = 8  # workspaces kept per backend object (one per (shape, variant)), LRU

LAYER_NAMES = ("input_norm", "wq", "wk", "wv", "q_norm", "k_norm", "wo", "post_norm", "w_gate", "w_up", "w_down")
CONV_NAMES = ("attn_conv_base", "mlp_conv_base", "attn_conv_proj", "mlp_conv_proj")

# What a CUDA graph capture of a call meets. tests/gpu/test_fast_block.py captures one on a CuPy
# stream after an eager warm-up call and replays it (H200, CuPy 14.2, cuBLAS 13.1: the replay gives
# the eager bits, both variants; benchmarks/gpu_bench.py times it as masked_block[graph]):
CAPTURE_NOTES = (
    ("CuPy's cuBLAS wrappers raise NotImplementedError while a stream captures (H200, CuPy 14.2): "
    "CudaEngine.gemm then calls cublasGemmEx through ctypes on CuPy's handle with a workspace of its "
    "own (CaptureGemm), made by the first eager call"),
    ("the first call per weight array converts / concatenates it and the first call per shape "
    "allocates the workspace: capture after an eager warm-up call"),
    ("the outputs (hidden / x_next) and the attention helper's outputs are allocated per call from "
    "the capturing stream's CuPy pool arena: the graph keeps those addresses, so nothing else may "
    "allocate from that stream's arena while the graph is replayed"),
    "inputs are read at the addresses captured: replay with the same arrays, updated in place",
)


def cp():
    import cupy

    return cupy


_FUNCS: dict = {}


def _fn(name: str):
    f = _FUNCS.get(name)
    if f is None:
        f = _FUNCS[name] = load_module("fast/block").get_function(name)
    return f


class CaptureGemm:
    """The gemm_bf16 call (cublasGemmEx: BF16 A/B, FP32 C, CUBLAS_COMPUTE_32F, default algorithm,
    host scalars) made through ctypes on CuPy's cuBLAS handle, for use while the current stream is
    being captured into a CUDA graph: CuPy's own cuBLAS wrappers raise NotImplementedError then.
    cuBLAS itself may be captured once the handle has a workspace set by the user
    (cublasSetWorkspace, reset again by CuPy's next cublasSetStream), which this keeps allocated."""

    WORKSPACE_BYTES = 32 << 20

    def __init__(self):
        import ctypes

        lib = loaded_library("libcublas")  # the libcublas CuPy loaded (gemm_bf16 ran before)
        vp, i = ctypes.c_void_p, ctypes.c_int
        self._set_stream = lib.cublasSetStream_v2
        self._set_stream.argtypes, self._set_stream.restype = [vp, vp], i
        self._set_workspace = lib.cublasSetWorkspace_v2
        self._set_workspace.argtypes, self._set_workspace.restype = [vp, vp, ctypes.c_size_t], i
        self._set_pointer_mode = lib.cublasSetPointerMode_v2
        self._set_pointer_mode.argtypes, self._set_pointer_mode.restype = [vp, i], i
        self._gemm = lib.cublasGemmEx
        self._gemm.argtypes = [vp, i, i, i, i, i, vp, vp, i, i, vp, i, i, vp, vp, i, i, i, i]
        self._gemm.restype = i
        i64 = ctypes.c_int64
        self._gemm_sb = lib.cublasGemmStridedBatchedEx
        self._gemm_sb.argtypes = [vp, i, i, i, i, i, vp, vp, i, i, i64, vp, i, i, i64, vp, vp, i, i, i64, i, i, i]
        self._gemm_sb.restype = i
        self.workspace = cp().empty(self.WORKSPACE_BYTES, dtype=np.uint8)
        self._alpha = np.ones(1, dtype=np.float32)
        self._beta = np.zeros(1, dtype=np.float32)

    @staticmethod
    def _check(status: int, what: str):
        if status != 0:
            raise RuntimeError(f"{what} returned cuBLAS status {status}")

    def _bind(self):
        c = cp()
        handle = c.cuda.device.get_cublas_handle()
        self._check(self._set_stream(handle, c.cuda.get_current_stream().ptr), "cublasSetStream")
        self._check(self._set_workspace(handle, self.workspace.data.ptr, self.WORKSPACE_BYTES), "cublasSetWorkspace")
        self._check(self._set_pointer_mode(handle, 0), "cublasSetPointerMode")
        return handle

    def split(self, x, w, out):
        """out [S, M, N]: out[s] = x[:, s K/S : (s+1) K/S] @ w[:, same].T, the S K-slice partials of
        x @ w.T (one cublasGemmStridedBatchedEx: BF16 in, FP32 out and accumulation; the slices
        are K / S apart along the rows, leading dimension K). K % (8 S) == 0 (16-byte slices)."""
        S, M, N = out.shape
        K = x.shape[1]
        if (tuple(x.shape) != (M, K) or tuple(w.shape) != (N, K) or K % (8 * S)
                or not (x.flags.c_contiguous and w.flags.c_contiguous and out.flags.c_contiguous)):
            raise ValueError(f"CaptureGemm.split: shapes {x.shape} @ {w.shape}.T -> {out.shape} (C-contiguous, "
                             f"K a multiple of 8 S)")
        kk = K // S
        self._check(self._gemm_sb(self._bind(), 1, 0, N, M, kk, self._alpha.ctypes.data, w.data.ptr, 14, K, kk,
                                  x.data.ptr, 14, K, kk, self._beta.ctypes.data, out.data.ptr, 0, N, M * N, S, 68,
                                  -1), "cublasGemmStridedBatchedEx")

    def __call__(self, x, w, out):
        """out [M, N] = x @ w.T (cublasGemmEx); out [S, M, N]: the K-slice partials (split)."""
        if out.ndim == 3:
            return self.split(x, w, out)
        M, K = x.shape
        N = w.shape[0]
        if w.shape[1] != K or tuple(out.shape) != (M, N) or not (x.flags.c_contiguous and w.flags.c_contiguous
                                                                   and out.flags.c_contiguous):
            raise ValueError(f"CaptureGemm: shapes {x.shape} @ {w.shape}.T -> {out.shape} (C-contiguous)")
        handle = self._bind()
        # row-major C [M, N] = column-major C^T = w (op T) * x, as gemm_bf16
        self._check(self._gemm(handle, 1, 0, N, M, K, self._alpha.ctypes.data, w.data.ptr, 14, K, x.data.ptr, 14, K,
                               self._beta.ctypes.data, out.data.ptr, 0, N, 68, -1), "cublasGemmEx")


def _row_grid(n: int, rows: int) -> tuple[int, int]:
    """(column blocks covering n per row, rows): fb_conv_prepare / fb_silu_mul's 2-D grid."""
    if rows > 65535:
        raise ValueError(f"{rows} rows: the glue kernels' grid takes at most 65535")
    return (max(1, min((n + _THREADS - 1) // _THREADS, _MAX_GRID)), max(1, rows))


# fb_resid_norm (options.resid_norm_path): "auto" takes the cluster kernel (fb_resid_norm_cluster, a row over
# 8 CTAs) where it applies, else the single-CTA one (rows up to 8192 wide in registers); "cluster", "block" and
# "strided" (the single-CTA kernel's loop, any width, the register path's bits) force one (tests/gpu/test_fast_block.py
# compares them). "auto" takes the cluster kernel up to options.resid_norm_cluster_max_rows rows: at 8 rows it halved
# the norm's time at H 5120 (9.7 -> 5.0 us); at 128 rows of H 2048 its 8 CTAs of 128 threads a row outnumber the SMs
# and it was slower (5.0 -> 7.2 us).
_CLUSTER, _CLUSTER_THREADS = 8, 128  # fast/block.cu FB_CL, FB_CL_THREADS



@functools.cache
def _compute_capability(dev_id: int) -> int:
    return int(cp().cuda.Device(dev_id).compute_capability)  # CuPy: "90" for 9.0, "100" for 10.0


def cluster_capable() -> bool:
    """Whether the current device runs thread-block clusters (compute capability 9.0 or later): the
    fb_resid_norm_cluster kernel and every kernel of fast/selector.cu exist only there (below
    sm_90 the .cu files compile without them)."""
    try:
        return _compute_capability(cp().cuda.Device().id) >= 90
    except Exception:  # noqa: BLE001 - no CuPy or no device: no clusters
        return False


def resid_norm_path(M: int, H: int, f32=(), bits=(), capable: bool | None = None,
                    options: FastOptions = DEFAULT_OPTIONS) -> str:
    """Which fb_resid_norm kernel a call takes (options.resid_norm_path; "auto": the cluster kernel for at
    most options.resid_norm_cluster_max_rows rows when the device runs clusters (``capable``, default
    cluster_capable()), H is a multiple of 32 up to 8192 and every fp32 array is 16-byte, every
    BF16 array 8-byte aligned)."""
    want = options.resid_norm_path
    if want not in ("auto", "cluster", "block", "strided"):
        raise ValueError(f"resid_norm_path {want!r}: auto, cluster, block or strided")
    if want in ("block", "strided"):
        return want
    if capable is None:
        capable = cluster_capable()
    fits = (capable and H % (4 * _CLUSTER) == 0 and H <= 8192
            and all(a is None or a.data.ptr % 16 == 0 for a in f32)
            and all(a is None or a.data.ptr % 8 == 0 for a in bits))
    if want == "cluster" and not fits:
        raise ValueError(f"fb_resid_norm_cluster does not take H {H}, these alignments or this device "
                         f"(clusters: {capable})")
    if want == "auto" and M > options.resid_norm_cluster_max_rows:
        return "block"
    return "cluster" if fits else "block"


# fb_conv_prepare (options.conv_prepare_vec): 4 columns per thread with 16-byte loads where aligned and the grid
# still has at least 256 blocks (B8 W16: 640; at B1 W8 one column per thread keeps 160 blocks: the 4-column grid's
# 40 took 1.9 -> 2.8 us a call in the 27B B1 trace); "always": wherever aligned; False: one column per thread. The
# same bits either way (tests/gpu/test_fast_block.py).


def resid_norm_threads(H: int) -> int:
    """fb_resid_norm's block size for rows H wide: one float4 group of the row per thread where
    H / 4 <= 1024, else about two (a multiple of 32, at most 1024). H200, 128 rows of 5120 after a
    GEMM (DRAM): the 256-thread block held 8 warps an SM, each stalled on its loads, ~10 us a call in
    the round (ncu)."""
    groups = max(1, -(-H // 4))
    per = -(-groups // 1024)  # groups per thread
    threads = -(-groups // per)
    return min(1024, 32 * -(-threads // 32))


MAX_PARTS = 4  # fast/block.cu FB_MAX_PARTS: K-slice partials a consumer kernel reads


def _parts(a, rows: int, cols: int) -> tuple[int, int]:
    """(parts, stride in elements) of a branch / delta array given as [rows, cols] or as K-slice
    partials [parts, rows, cols] (a split GEMM's output)."""
    if a is None or a.ndim == 2:
        return 1, 0
    if (a.ndim != 3 or tuple(a.shape[1:]) != (rows, cols) or not a.flags.c_contiguous
            or not 1 <= a.shape[0] <= MAX_PARTS):
        raise ValueError(f"partials {a.shape}: expected C-contiguous [parts <= {MAX_PARTS}, {rows}, {cols}]")
    return int(a.shape[0]), rows * cols


# K splits of the block's GEMMs (options.gemm_splits: a strided-batched GEMM over S slices of K, the S fp32 partials
# summed in slice order by the consumer kernel: fb_conv_prepare for the conv delta, fb_resid_norm for o and down),
# keyed by the weight's (N, K), for M <= options.split_max_m. On the H200 (graph replays with rotating weights) the
# split took the DFlash2 27B conv delta from 11.3 to 7.9 us (S 4, M 256) and the 27B down from 56.9 to 48.5 (S 2,
# M 128); the 35B o and down run in 2 slices: in the round fb_resid_norm then sums half the partials of 4, which
# measured faster than 4 although the GEMMs alone favour 4. Shapes where splitting measured no gain run one GEMM.


def split_k(M: int, N: int, K: int, options: FastOptions = DEFAULT_OPTIONS) -> int:
    """How many K slices the block's GEMM x [M, K] @ w [N, K].T runs as (options.gemm_splits; 1: not split).
    Each slice is 16-byte aligned (K % (8 S) == 0)."""
    s = min(options.splits_for(N, K), MAX_PARTS) if M <= options.split_max_m else 1
    return s if s > 1 and K % (8 * s) == 0 else 1


# fb_qkv_post builds its RoPE table before its PDL wait (overlapping the kernel ahead) for blocks of at most
# options.early_table_max_rows rows, after it otherwise: at B1 it took ~1 us a layer off the round; at B8 fb_qkv_post
# starts beside the cuBLAS GEMM (launch-order edges) and building the table early measured slower.

def _glue(name: str, grid, block, args, shared_mem: int = 0) -> None:
    """A fast/block.cu kernel, under programmatic dependent launch (kernels_cu/pdl.py; each waits for the
    kernel ahead before it reads anything)."""
    launch(_fn(name), grid, block, args, shared_mem, pdl=True)


def attention_impl(options: FastOptions = DEFAULT_OPTIONS):
    """(function, name): the fast attention (kernels_cu/fast/attention.py) under these options (same contract as the
    exact kernel: fp32 or BF16-bit q/k/v, BF16/FP16 cache bits -> (f32 or None, bits or None))."""
    from kernels_cu.fast.attention import attention_fast

    return functools.partial(attention_fast, options=options), "kernels_cu.fast.attention.attention_fast"


# --- the engine interface: one method per kernel (CUDA here; a NumPy twin in the CPU test) ----------


class CudaEngine:
    """Launches the fast/block.cu kernels and the BF16 GEMM on the current CuPy stream."""

    def __init__(self, attention=None, options: FastOptions = DEFAULT_OPTIONS):
        self.options = options
        self.attention_fn, self.attention_name = attention if attention is not None else attention_impl(options)
        try:  # attention_fast takes pdl=; a stand-in (tests, benchmarks) may not
            self._attention_pdl = "pdl" in inspect.signature(self.attention_fn).parameters
        except (TypeError, ValueError):
            self._attention_pdl = False
        self._capture_gemm = None

    @staticmethod
    def empty(shape, dtype):
        return cp().empty(shape, dtype=dtype)

    @staticmethod
    def full(shape, value, dtype):
        return cp().full(shape, value, dtype=dtype)

    def gemm(self, x_bits, w_bits, out):
        """out [M, N] fp32 = x @ w.T; out [S, M, N]: the S K-slice partials (split_k, CaptureGemm only)."""
        if out.ndim == 3 and self._capture_gemm is None:
            self._capture_gemm = CaptureGemm()
        if out.ndim == 3 or cp().cuda.get_current_stream().is_capturing():  # a host query, no synchronisation
            if not self._capture_gemm:
                raise RuntimeError(getattr(self, "_capture_error", "capture a call only after an eager warm-up call "
                                           "(the capture GEMM and its workspace are made there)"))
            self._capture_gemm(x_bits, w_bits, out)
            return
        gemm_bf16(x_bits, w_bits, out)
        if self._capture_gemm is None:
            try:
                self._capture_gemm = CaptureGemm()
            except Exception as exc:  # noqa: BLE001 - eager calls do not need it; a capture will say why
                self._capture_gemm = False
                self._capture_error = f"{type(exc).__name__}: {exc}"

    def gemv_takes(self, M: int, N: int, K: int) -> bool:
        """A layer GEMM of this shape runs on kernels_cu/fast/gemv.cu (whole: no K-split partials)."""
        return fast_gemv.chooses(M, N, K, self.options)

    def layer_gemm(self, x_bits, w_bits, out):
        """The block's layer GEMMs: fast/gemv.cu where gemv_takes the shape (few rows; under PDL it stages
        its weights before the kernel ahead finishes), else ``gemm``."""
        if out.ndim == 2:
            M, N, K = out.shape[0], out.shape[1], x_bits.shape[1]
            if self.gemv_takes(M, N, K) and fast_gemv.gemv_into(cp().ascontiguousarray(x_bits), w_bits, out,
                                                                 self.options):
                return
        self.gemm(x_bits, w_bits, out)

    def mlp_act(self, x_bits, w_bits, gu, act, M, inter):
        """act [M, I] = BF16(SiLU(gate) * up) of the MLP's [gate; up] GEMM: one fast_gemv kernel (SiLU-mul in its
        epilogue, the same bits) where the GEMM runs there, else ``layer_gemm`` into gu then fb_silu_mul."""
        if (self.gemv_takes(M, 2 * inter, x_bits.shape[1])
                and fast_gemv.act_into(cp().ascontiguousarray(x_bits), w_bits, act, self.options)):
            return
        self.layer_gemm(x_bits, w_bits, gu)
        self.silu_mul(gu, M, inter, act)

    def resid_norm(self, M, H, W, *, resid_in=None, src_bits=None, tok=None, mask_id=0, branch=None, conv_base=None,
                   fd=None, resid_out=None, resid_bits=None, norm_w=None, eps=0.0, norm_f32=None, norm_hi=None,
                   norm_lo=None, skip_first=False):
        tok_mode = 0 if tok is None else (2 if tok.dtype == np.int64 else 1)  # int32 or int64 (masked_block)

        def p(a):
            return _NULL if a is None else a

        if M == 0:
            return
        bparts, bstride = _parts(branch, M, H)
        args = (np.int32(M), np.int32(H), np.int32(W), p(resid_in), p(src_bits), p(tok), np.int32(tok_mode),
                np.int64(mask_id), p(branch), p(conv_base), p(fd), p(resid_out), p(resid_bits), p(norm_w),
                np.float32(eps), p(norm_f32), p(norm_hi), p(norm_lo), np.int32(1 if skip_first else 0),
                np.int32(bparts), np.int64(bstride))
        path = resid_norm_path(M, H, f32=(resid_in, branch, conv_base, resid_out, norm_w, norm_f32),
                               bits=(src_bits, resid_bits, norm_hi, norm_lo), options=self.options)
        if path == "cluster":
            _glue("fb_resid_norm_cluster", (_CLUSTER * M,), (_CLUSTER_THREADS,), args)
        else:
            _glue("fb_resid_norm", (M,), (resid_norm_threads(H),),
                  (*args, np.int32(1 if path == "strided" else 0)))

    def qkv_post(self, qkv, M, W, hq, hk, d, q_norm, k_norm, freqs, frontier, eps, q, k, v):
        _glue("fb_qkv_post", (M, math.ceil((hq + 2 * hk) / _QKV_WARPS)), (32 * _QKV_WARPS,),
              (qkv, np.int32(M), np.int32(W), np.int32(hq), np.int32(hk), np.int32(d), q_norm, k_norm, freqs,
               frontier, np.float32(eps), q, k, v, np.int32(1 if q.dtype == np.uint16 else 0),
               np.int32(1 if M <= self.options.early_table_max_rows else 0)),
              4 * d * (1 + _QKV_WARPS))

    def conv_prepare(self, x, dl, base0, W, M, H, prepared, fd):
        dparts, dstride = _parts(dl, 2 * M, H // 4)
        want = self.options.conv_prepare_vec
        vec = (want and H % 4 == 0 and x.data.ptr % 16 == 0 and base0.data.ptr % 16 == 0
               and prepared.data.ptr % 8 == 0 and (want == "always" or -(-H // 1024) * M >= 256))
        _glue("fb_conv_prepare", _row_grid(-(-H // 4) if vec else H, M), (_THREADS,),
              (x, dl, base0, np.int32(W), np.int32(M), np.int32(H), prepared, fd, np.int32(dparts),
               np.int64(dstride), np.int32(1 if vec else 0)))

    @staticmethod
    def silu_mul(gu, M, inter, act):
        if M == 0:
            return
        if inter % 4 == 0 and (gu.data.ptr % 16 or act.data.ptr % 8):  # the kernel's 16-byte path
            raise ValueError("fb_silu_mul: gu must be 16-byte and act 8-byte aligned when I % 4 == 0 "
                             "(workspace arrays are)")
        _glue("fb_silu_mul", _row_grid(-(-inter // 4), M), (_THREADS,), (gu, np.int32(M), np.int32(inter), act))

    def attention(self, q, k, v, kc, vc, frontier, live, window):
        """block_forward calls it right after qkv_post: the fast kernel may then run under PDL
        (kernels_cu/pdl.py), prefetching ring tiles while qkv_post finishes."""
        extra = {"pdl": True} if self._attention_pdl else {}
        _, out = self.attention_fn(q, k, v, kc, vc, frontier, live, int(window), f32_out=False, bf16_out=True,
                                   **extra)
        return out


# --- shapes, workspace, orchestration ------------------------------------------------------------


class Dims:
    """The shape of one call: B, W, H, heads, head_dim, intermediate width, conv or not."""

    def __init__(self, b, w, h, hq, hk, d, inter, conv):
        self.B, self.W, self.H, self.Hq, self.Hk, self.D, self.I, self.conv = b, w, h, hq, hk, d, inter, bool(conv)
        self.M = b * w
        self.G = h // 16
        if hq % hk:
            raise ValueError(f"{hq} query heads are not a multiple of {hk} KV heads")
        if self.conv and h % 16:
            raise ValueError(f"grouped_conv: hidden width {h} is not a multiple of 16")
        if d % 2 or d > 1024:
            raise ValueError(f"head_dim {d}: RoPE needs an even head_dim <= 1024")

    def key(self):
        return (self.B, self.W, self.H, self.Hq, self.Hk, self.D, self.I, self.conv)


class Workspace:
    """Every intermediate of one call, allocated once per shape (no per-call allocation)."""

    def __init__(self, eng, dm: Dims):
        f32, u16 = np.float32, np.uint16
        M, H = dm.M, dm.H
        self.X = eng.empty((M, H), f32)  # residual stream
        self.NB = eng.empty((2 * M, H), u16)  # BF16 norm output (hi rows, then lo rows for the conv GEMM)
        self.QKV = eng.empty((M, (dm.Hq + 2 * dm.Hk) * dm.D), f32)
        self.Q = eng.empty((dm.B, dm.W, dm.Hq, dm.D), u16)  # q, k, v: BF16 bits for the attention
        self.K = eng.empty((dm.B, dm.W, dm.Hk, dm.D), u16)
        self.V = eng.empty((dm.B, dm.W, dm.Hk, dm.D), u16)
        self.O = _split_out(eng, M, H, dm.Hq * dm.D)  # [M, H], or [S, M, H] partials (split_k)
        self.GU = eng.empty((M, 2 * dm.I), f32)
        self.ACT = eng.empty((M, dm.I), u16)
        self.Z = _split_out(eng, M, H, dm.I)
        self.LIVE_ALL = eng.full((dm.B,), dm.W, np.int32)  # masked_block DFlash2 attends every block column
        if dm.conv:
            self.NF = eng.empty((M, H), f32)  # fp32 normalized input (kept private)
            self.DL = _split_out(eng, 2 * M, 4 * dm.G, H)  # conv delta GEMM (hi rows, lo rows)
            self.P = eng.empty((M, H), u16)  # prepared input (BF16)
            self.FDA = eng.empty((M, 2 * dm.G), u16)  # finish deltas (BF16)
            self.FDM = eng.empty((M, 2 * dm.G), u16)


def _split_out(eng, M: int, N: int, K: int):
    """A GEMM output [M, N] fp32, or its split_k(M, N, K) K-slice partials [S, M, N] (never for a shape the
    engine's gemv_takes: that kernel writes the whole sum)."""
    s = 1 if eng.gemv_takes(M, N, K) else split_k(M, N, K, getattr(eng, "options", DEFAULT_OPTIONS))
    return eng.empty((M, N) if s == 1 else (s, M, N), np.float32)


def _norm_targets(ws: Workspace, dm: Dims) -> dict:
    """Where the layer's norms write: DFlash BF16(n) for the GEMM; DFlash2 fp32 n plus hi/lo bits."""
    if dm.conv:
        return {"norm_f32": ws.NF, "norm_hi": ws.NB[: dm.M], "norm_lo": ws.NB[dm.M:]}
    return {"norm_hi": ws.NB[: dm.M]}


def _gemm_input(eng, ws: Workspace, dm: Dims, wts: dict, l: int, side: str):
    """The BF16 rows that feed a branch's first GEMM: DFlash BF16(n); DFlash2 the prepared input
    (the conv delta GEMM on the hi/lo rows, then fb_conv_prepare, which also writes the branch's
    finish delta)."""
    if not dm.conv:
        return ws.NB[: dm.M]
    eng.layer_gemm(ws.NB, wts[f"{side}_proj"][l], ws.DL)
    eng.conv_prepare(ws.NF, ws.DL, wts[f"{side}_base"][l][0], dm.W, dm.M, dm.H, ws.P,
                     ws.FDA if side == "attn" else ws.FDM)
    return ws.P


def block_forward(eng, ws: Workspace, dm: Dims, wts: dict, layers, *, frontier, live, eps, freqs, entry: dict,
                  exit: dict):
    """Run ``layers`` (a list of (layer index, window, k ring bits, v ring bits)) on the rows
    ``entry`` names (fb_resid_norm source arguments), then write ``exit`` (fb_resid_norm output
    arguments: the final norm or the BF16 x_next) from the last residual update. Attention sees
    the block rows j < live[b]: the caller's extent (draft_layer: its live; masked_block: live for
    DFlash, all W columns for DFlash2).

    wts: wqkv [L, (Hq + 2 Hk) D, H], wo [L, H, Hq D], wgu [L, 2I, H], wdown [L, H, I] (BF16 bits),
    input_norm / post_norm [L, H], q_norm / k_norm [L, D] (fp32); DFlash2 also attn_base /
    mlp_base [L, 2, 2, H] (fp32) and attn_proj / mlp_proj [L, 4G, H] (BF16 bits)."""
    M, H, W = dm.M, dm.H, dm.W
    tail = None  # the previous layer's MLP branch, joined to the stream by the next residual update
    for l, window, kc, vc in layers:
        src = entry if tail is None else tail
        eng.resid_norm(M, H, W, **src, resid_out=ws.X, norm_w=wts["input_norm"][l], eps=eps,
                       **_norm_targets(ws, dm))
        eng.layer_gemm(_gemm_input(eng, ws, dm, wts, l, "attn"), wts["wqkv"][l], ws.QKV)
        eng.qkv_post(ws.QKV, M, W, dm.Hq, dm.Hk, dm.D, wts["q_norm"][l], wts["k_norm"][l], freqs, frontier, eps,
                     ws.Q, ws.K, ws.V)
        a = eng.attention(ws.Q, ws.K, ws.V, kc, vc, frontier, live, window)
        eng.layer_gemm(a.reshape(M, dm.Hq * dm.D), wts["wo"][l], ws.O)
        conv_a = {"conv_base": wts["attn_base"][l][1], "fd": ws.FDA} if dm.conv else {}
        eng.resid_norm(M, H, W, resid_in=ws.X, branch=ws.O, **conv_a, resid_out=ws.X,
                       norm_w=wts["post_norm"][l], eps=eps, **_norm_targets(ws, dm))
        eng.mlp_act(_gemm_input(eng, ws, dm, wts, l, "mlp"), wts["wgu"][l], ws.GU, ws.ACT, M, dm.I)
        eng.layer_gemm(ws.ACT, wts["wdown"][l], ws.Z)
        tail = {"resid_in": ws.X, "branch": ws.Z}
        if dm.conv:
            tail.update(conv_base=wts["mlp_base"][l][1], fd=ws.FDM)
    eng.resid_norm(M, H, W, **(entry if tail is None else tail), eps=eps, **exit)


# --- the Op's own CUDA graph (options.op_graphs) --------------------------------------------------
#
# A masked_block call launches about 15 kernels a layer from Python (each PDL launch a ctypes cuLaunchKernelEx), so
# a call spends a few milliseconds of host time against 0.4-1.4 ms of device time. With options.op_graphs the Op
# keeps, per (shape, scalars, weight arrays, ring arrays), an OpGraph: static buffers for the small inputs (anchor,
# frontier, live, draft_layer's x), its own stream, and from the second call a CUDA graph of the call captured on
# that stream (the same kernels with the same arguments as the plain path: the same bits). A later call copies the
# small inputs in on the stream (device to device, no host sync), replays the graph and returns a fresh copy of the
# output. The weights and the rings are read in place at the addresses captured: the plan is keyed by the arrays'
# identity and holds them, so the same objects are the same memory; the caller may write their contents (the rings
# between rounds), never mutate a weight in place after its first call (as for the resident cache).


def _copy_in(dst, src, convert, what: str) -> None:
    """src's values into the static dst on the current stream: one device-to-device copy when src is already a CuPy
    array of dst's dtype and size, else ``convert(src)`` (a device array) assigned (host inputs: a host copy)."""
    c = cp()
    if isinstance(src, c.ndarray) and src.dtype == dst.dtype and src.size == dst.size and src.flags.c_contiguous:
        if dst.nbytes:
            c.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, dst.nbytes, c.cuda.runtime.memcpyDeviceToDevice,
                                       c.cuda.get_current_stream().ptr)
        return
    a = convert(src)
    if a.size != dst.size:
        raise ValueError(f"{what}: {a.size} elements, the call's shape needs {dst.size}")
    dst[...] = a.reshape(dst.shape).astype(dst.dtype, copy=False)


class OpGraph:
    """One Op call shape's plan: static inputs, the output buffer, a stream of its own and (from the second call) the
    CUDA graph of ``run`` captured on it. ``holds`` keeps every array the graph reads in place alive (weights, rings,
    workspace), so their addresses stay the captured ones.

    ``__call__(inputs)``: orders the plan's stream after the caller's current stream (an event, no host wait), copies
    ``inputs`` into the statics, runs (first call: eagerly, which makes the capture GEMM's workspace and compiles what
    the call needs; second: captures then launches; later: replays), copies the output into a fresh array allocated
    from the caller's stream, and orders the caller's stream after it. The fresh array is the caller's own: nothing
    aliases the plan's buffers. The copy is made on the plan's stream, so a call from another stream cannot overwrite
    the output before it is copied. ``path`` says how the latest call ran ("eager", "capture", "graph",
    "eager (capture failed: ...)")."""

    def __init__(self, run, statics: dict, converts: dict, out, holds, launch_order: bool):
        c = cp()
        self.run, self.statics, self.converts, self.out, self.holds = run, statics, converts, out, holds
        self.launch_order = bool(launch_order)
        self.stream = c.cuda.Stream(non_blocking=True)
        self._ev_in = c.cuda.Event(disable_timing=True)
        self._ev_out = c.cuda.Event(disable_timing=True)
        self.graph = None
        self.calls = 0
        self.error = None
        self.path = None

    def __call__(self, inputs: dict):
        c = cp()
        caller = c.cuda.get_current_stream()
        res = c.empty(self.out.shape, dtype=self.out.dtype)  # from the caller's stream's arena: the caller's array
        s = self.stream
        self._ev_in.record(caller)
        s.wait_event(self._ev_in)
        with s:
            for name, src in inputs.items():
                _copy_in(self.statics[name], src, self.converts[name], name)
            if self.graph is not None:
                self.graph.launch(s)
                self.path = "graph"
            elif self.calls >= 1 and self.error is None:
                self.path = self._capture()
            else:
                self.run()
                self.path = "eager" if self.error is None else f"eager (capture failed: {self.error})"
            self.calls += 1
            if res.nbytes:
                c.cuda.runtime.memcpyAsync(res.data.ptr, self.out.data.ptr, res.nbytes,
                                           c.cuda.runtime.memcpyDeviceToDevice, s.ptr)
        self._ev_out.record(s)
        caller.wait_event(self._ev_out)
        return res

    def _capture(self) -> str:
        from kernels_cu import pdl

        s = self.stream
        s.begin_capture()
        try:
            self.run()
        except Exception as exc:  # noqa: BLE001 - no graph for this plan: eager, saying why
            try:
                s.end_capture()
            except Exception:  # noqa: BLE001,S110 - the capture's own error is the one to keep
                pass
            return self._failed(exc)
        try:  # PDL edges relaxed to launch order as FastRound does (pdl.end_capture), else CuPy's graph
            self.graph = pdl.end_capture(s, launch_order=pdl.LAUNCH_ORDER and self.launch_order) if pdl.active() \
                else s.end_capture()
        except Exception as exc:  # noqa: BLE001
            return self._failed(exc)
        self.graph.launch(s)
        return "capture"

    def _failed(self, exc) -> str:
        self.graph = None
        self.error = f"{type(exc).__name__}: {exc}"
        self.run()
        return f"eager (capture failed: {self.error})"

    def release(self) -> None:
        """Wait for the plan's work (a graph may not be destroyed while it runs), then drop the graph."""
        self.stream.synchronize()
        self.graph = None


def _tok_dtype(a):
    """The dtype _fb_int keeps for an index input (int32 / int64, else int64)."""
    dt = getattr(a, "dtype", None)
    dt = np.asarray(a).dtype if dt is None else np.dtype(dt)
    return dt if dt in (np.int32, np.int64) else np.dtype(np.int64)


def _in_place(src, dev, dtype) -> bool:
    """Whether the plain path reads ``src`` itself (``dev`` is its device view, no conversion copy): then a graph may
    read it at its address."""
    c = cp()
    return (isinstance(src, c.ndarray) and isinstance(dev, c.ndarray) and dev.dtype == dtype
            and dev.data.ptr == src.data.ptr and dev.flags.c_contiguous)


# --- the Op methods ------------------------------------------------------------------------------


class FastBlockMixin:
    """masked_block and draft_layer of the fast mode (CONTRACTS C9 signatures, as
    kernels_cu.exact.attention.AttentionOps). Needs FastCudaBackend's resident weights.

    Every array passes through the ``_fb_*`` hooks below (CUDA: resident BF16 bits / fp32 copies
    of weights, device views of inputs); tests/test_fast_block_plan.py overrides them with NumPy
    so that these same methods and ``block_forward`` run on the CPU against the reference."""

    # --- hooks (CUDA) ------------------------------------------------------------------------

    def _fb_engine(self):
        eng = getattr(self, "_fb_eng", None)
        if eng is None:
            eng = self._fb_eng = CudaEngine(options=self.options)
        return eng

    def _fb_weight_bits(self, a):
        return self._bits(a)  # resident BF16 bits (FastCudaBackend)

    def _fb_weight_f32(self, a):
        return self._f32(a)  # resident fp32 copy (norm gains, conv bases)

    def _fb_cat(self, tag: str, arrays):
        """[a; b; ...] along the output-row axis (-2), BF16 bits, resident once per source tuple."""

        def build():
            return cp().ascontiguousarray(cp().concatenate([bf16_bits(a) for a in arrays], axis=-2))

        return self.resident.get((tag,) + tuple(_key(a) for a in arrays), tuple(arrays), build)

    @staticmethod
    def _fb_bits(a):
        return bf16_bits(a)  # an activation / cache input (not cached)

    @staticmethod
    def _fb_f16_bits(a):
        return f16_bits(a)

    @staticmethod
    def _fb_int(a, dtype=None):
        """A device integer array; ``dtype`` None keeps int32/int64 (else int64)."""
        a = device(a)
        if dtype is None:
            return a if a.dtype in (np.int32, np.int64) else a.astype(np.int64)
        return a.astype(dtype, copy=False)

    def _fb_freqs(self, d: int, theta: float):
        return self._inv_freq(d, theta)

    def _fb_workspace(self, dm: Dims) -> Workspace:
        cache = getattr(self, "_fb_ws", None)
        if cache is None:
            cache = self._fb_ws = OrderedDict()
        key = dm.key()  # the options are the backend's, fixed: the shape decides the workspace
        ws = cache.get(key)
        if ws is None:
            ws = cache[key] = Workspace(self._fb_engine(), dm)
            while len(cache) > _WS_KEEP:
                cache.popitem(last=False)
        cache.move_to_end(key)
        return ws

    # --- shared ------------------------------------------------------------------------------

    def _fb_weights(self, kw: dict, variant: str, stacked: bool) -> dict:
        """The layer weights with a leading layer axis (a single layer gets a view with L = 1)."""
        if variant not in ("dflash", "dflash2"):
            raise ValueError(f"variant must be 'dflash' or 'dflash2', got {variant!r}")
        names = LAYER_NAMES + (CONV_NAMES if variant == "dflash2" else ())
        missing = [n for n in names if kw.get(n) is None]
        if missing:
            raise ValueError(f"{'masked_block' if stacked else 'draft_layer'} ({variant}): missing inputs {missing}")

        def lead(a):
            return a if stacked else a.reshape((1,) + tuple(a.shape))

        w = {
            "wqkv": lead(self._fb_cat("fb_qkv", (kw["wq"], kw["wk"], kw["wv"]))),
            "wgu": lead(self._fb_cat("fb_gu", (kw["w_gate"], kw["w_up"]))),
            "wo": lead(self._fb_weight_bits(kw["wo"])),
            "wdown": lead(self._fb_weight_bits(kw["w_down"])),
        }
        for n in ("input_norm", "post_norm", "q_norm", "k_norm"):
            w[n] = lead(self._fb_weight_f32(kw[n]))
        if variant == "dflash2":
            w["attn_base"] = lead(self._fb_weight_f32(kw["attn_conv_base"]))
            w["mlp_base"] = lead(self._fb_weight_f32(kw["mlp_conv_base"]))
            w["attn_proj"] = lead(self._fb_weight_bits(kw["attn_conv_proj"]))
            w["mlp_proj"] = lead(self._fb_weight_bits(kw["mlp_conv_proj"]))
        return w

    @staticmethod
    def _fb_dims(wts: dict, kw: dict, b: int, w: int, h: int, d: int, variant: str) -> Dims:
        hq, hk = np.shape(kw["wq"])[-2] // d, np.shape(kw["wk"])[-2] // d
        dm = Dims(b, w, h, hq, hk, d, np.shape(kw["w_gate"])[-2], variant == "dflash2")
        if tuple(wts["wqkv"].shape[-2:]) != ((hq + 2 * hk) * d, h) or tuple(wts["wo"].shape[-2:]) != (h, hq * d):
            raise ValueError(f"projection shapes {wts['wqkv'].shape} / {wts['wo'].shape} do not fit H {h}, "
                             f"{hq}/{hk} heads of {d}")
        if tuple(wts["wgu"].shape[-2:]) != (2 * dm.I, h) or tuple(wts["wdown"].shape[-2:]) != (h, dm.I):
            raise ValueError(f"MLP shapes {wts['wgu'].shape} / {wts['wdown'].shape} do not fit H {h}")
        return dm

    def environment(self) -> dict:
        rec = super().environment()
        rec["fast_block"] = ("masked_block / draft_layer: BF16 GEMMs (gemm_bf16) through resident [Wq;Wk;Wv] and "
                             "[Wgate;Wup], fast/block.cu glue kernels, attention: " + self._fb_engine().attention_name)
        o = self.options
        rec["fast_block_paths"] = (f"resid_norm_path={o.resid_norm_path} (cluster up to {o.resid_norm_cluster_max_rows} "
                                   f"rows), conv_prepare_vec={o.conv_prepare_vec}, gemm_splits={o.gemm_splits} (M <= "
                                   f"{o.split_max_m}, at most {MAX_PARTS} parts), thread-block clusters: "
                                   f"{cluster_capable()}")
        rec["fast_block_gemv"] = fast_gemv.environment(o)
        return rec

    # --- the Op's own graph (OpGraph) ----------------------------------------------------------

    def _fb_graph_key(self, op: str, scalars: tuple, in_place: tuple, weights: dict):
        """The OpGraph key of a call, or None where the plain path runs: options.op_graphs off, an engine other than
        CudaEngine (the CPU plan tests' NumPy twin), or the current stream capturing (the caller's own graph takes
        the plain launches, which need no host work). The key names the arrays read in place by identity; the
        OpGraph holds them, so an id seen again is the same object."""
        if not getattr(self, "options", DEFAULT_OPTIONS).op_graphs or not isinstance(self._fb_engine(), CudaEngine):
            return None
        if cp().cuda.get_current_stream().is_capturing():  # a host query, no synchronisation
            return None
        return (op, scalars, tuple(id(a) for a in in_place), tuple(sorted((n, id(a)) for n, a in weights.items())))

    def _fb_plans(self) -> OrderedDict:
        plans = getattr(self, "_fb_plan_cache", None)
        if plans is None:
            plans = self._fb_plan_cache = OrderedDict()
        return plans

    def _fb_plan(self, key):
        plans = self._fb_plans()
        plan = plans.get(key)
        if plan is not None:
            plans.move_to_end(key)
        return plan

    def _fb_keep(self, key, plan: OpGraph) -> OpGraph:
        plans = self._fb_plans()
        plans[key] = plan
        while len(plans) > max(1, int(self.options.op_graph_keep)):
            plans.popitem(last=False)[1].release()  # a host wait, only when a plan is dropped
        return plan

    def op_graph_path(self) -> str | None:
        """How the latest masked_block / draft_layer call through an OpGraph ran (None: none yet)."""
        return getattr(self, "_fb_last_path", None)

    def _fb_launch_order(self, dm: Dims) -> bool:
        return dm.M >= self.options.launch_order_min_rows

    # --- the Ops -----------------------------------------------------------------------------

    def draft_layer(self, *, x, k_cache, v_cache, frontier, live, eps, theta, head_dim, window=0,
                    variant="dflash", **weights):
        key = self._fb_graph_key("draft_layer", (variant, float(eps), float(theta), int(head_dim), int(window),
                                                 tuple(np.shape(x))), (k_cache, v_cache), weights)
        plan = None if key is None else self._fb_plan(key)
        if plan is not None:
            out = plan({"x": x, "frontier": frontier, "live": live})
            self._fb_last_path = plan.path
            return {"x_next": out}
        wts = self._fb_weights(weights, variant, stacked=False)
        xb = self._fb_bits(x)
        b, w, h = xb.shape
        d = int(head_dim)
        dm = self._fb_dims(wts, weights, b, w, h, d, variant)
        eng, ws = self._fb_engine(), self._fb_workspace(dm)
        kc, vc = self._fb_bits(k_cache), self._fb_f16_bits(v_cache)
        freqs = self._fb_freqs(d, theta)
        if key is not None and _in_place(k_cache, kc, np.uint16) and _in_place(v_cache, vc.view(np.float16),
                                                                                np.float16):
            st = {"x": eng.empty((b, w, h), np.uint16), "frontier": eng.empty((b,), np.int64),
                  "live": eng.empty((b,), np.int32)}
            out = eng.empty((b, w, h), np.uint16)

            def run():
                block_forward(eng, ws, dm, wts, [(0, int(window), kc, vc)], frontier=st["frontier"], live=st["live"],
                              eps=float(eps), freqs=freqs, entry={"src_bits": st["x"]}, exit={"resid_bits": out})

            conv = {"x": self._fb_bits, "frontier": lambda a: self._fb_int(a, np.int64),
                    "live": lambda a: self._fb_int(a, np.int32)}
            plan = self._fb_keep(key, OpGraph(run, st, conv, out, (k_cache, v_cache, weights, wts, ws, freqs),
                                              self._fb_launch_order(dm)))
            res = plan({"x": x, "frontier": frontier, "live": live})
            self._fb_last_path = plan.path
            return {"x_next": res}
        out = eng.empty((b, w, h), np.uint16)
        block_forward(eng, ws, dm, wts, [(0, int(window), kc, vc)],
                      frontier=self._fb_int(frontier, np.int64), live=self._fb_int(live, np.int32), eps=float(eps),
                      freqs=freqs, entry={"src_bits": xb}, exit={"resid_bits": out})
        return {"x_next": out}

    def masked_block(self, *, anchor, embed, frontier, live, context_k, context_v, final_norm, mask_token_id,
                     windows, eps, theta, head_dim, variant="dflash", num_drafts, **weights):
        key = self._fb_graph_key("masked_block", (variant, int(num_drafts), tuple(int(s) for s in windows), float(eps),
                                                  float(theta), int(head_dim), int(mask_token_id), tuple(np.shape(anchor)),
                                                  str(_tok_dtype(anchor))),
                                 (context_k, context_v, embed, final_norm), weights)
        plan = None if key is None else self._fb_plan(key)
        if plan is not None:
            out = plan({"anchor": anchor, "frontier": frontier, "live": live})
            self._fb_last_path = plan.path
            return {"hidden": out}
        wts = self._fb_weights(weights, variant, stacked=True)
        n_layers = len(windows)
        ck, cv = self._fb_bits(context_k), self._fb_f16_bits(context_v)
        if ck.shape[0] != n_layers or wts["wqkv"].shape[0] != n_layers:
            raise ValueError(f"masked_block: {n_layers} windows, {ck.shape[0]} rings, {wts['wqkv'].shape[0]} layers")
        emb = self._fb_weight_bits(embed)
        anchor_d = self._fb_int(anchor)
        b, w, h, d = anchor_d.shape[0], int(num_drafts) + 1, emb.shape[1], int(head_dim)
        if w < 2:
            raise ValueError(f"masked_block: num_drafts {num_drafts} < 1")
        dm = self._fb_dims(wts, weights, b, w, h, d, variant)
        eng, ws = self._fb_engine(), self._fb_workspace(dm)
        layers = [(l, int(win), ck[l], cv[l]) for l, win in enumerate(windows)]
        freqs, norm_w = self._fb_freqs(d, theta), self._fb_weight_f32(final_norm)
        if key is not None and _in_place(context_k, ck, np.uint16) and _in_place(context_v, cv.view(np.float16),
                                                                                  np.float16):
            st = {"anchor": eng.empty((b,), anchor_d.dtype), "frontier": eng.empty((b,), np.int64),
                  "live": eng.empty((b,), np.int32)}
            out = eng.empty((b, w - 1, h), np.uint16)

            def run():
                # DFlash attends only the live columns; DFlash2 computes all W (spec extent table)
                block_forward(eng, ws, dm, wts, layers, frontier=st["frontier"],
                              live=ws.LIVE_ALL if dm.conv else st["live"], eps=float(eps), freqs=freqs,
                              entry={"src_bits": emb, "tok": st["anchor"], "mask_id": int(mask_token_id)},
                              exit={"norm_w": norm_w, "norm_hi": out, "skip_first": True})

            conv = {"anchor": self._fb_int, "frontier": lambda a: self._fb_int(a, np.int64),
                    "live": lambda a: self._fb_int(a, np.int32)}
            plan = self._fb_keep(key, OpGraph(run, st, conv, out, (context_k, context_v, embed, final_norm, weights,
                                                                   wts, ws, emb, norm_w, freqs),
                                              self._fb_launch_order(dm)))
            res = plan({"anchor": anchor, "frontier": frontier, "live": live})
            self._fb_last_path = plan.path
            return {"hidden": res}
        hidden = eng.empty((b, w - 1, h), np.uint16)
        # DFlash attends only the live columns; DFlash2 computes all W (spec extent table)
        attn_live = ws.LIVE_ALL if dm.conv else self._fb_int(live, np.int32)
        block_forward(eng, ws, dm, wts, layers, frontier=self._fb_int(frontier, np.int64), live=attn_live,
                      eps=float(eps), freqs=freqs,
                      entry={"src_bits": emb, "tok": anchor_d, "mask_id": int(mask_token_id)},
                      exit={"norm_w": norm_w, "norm_hi": hidden, "skip_first": True})
        return {"hidden": hidden}
