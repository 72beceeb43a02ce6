"""Fast mode of the CUDA backend: ``FastCudaBackend``.

The exact mode (kernels_cu.backend.CudaBackend) rounds where the reference rounds and
accumulates the decisive dot products in double; it is PASS everywhere and slow. The fast mode
is a production-style engine judged by the suite like any third-party one (CONTRACTS C2:
0 FAIL, its ACCEPTABLE count stated). What changes, Op by Op (every other Op is the exact
mode's, inherited):

- masked_block / draft_layer: resident concatenated BF16 weights, BF16 tensor-core GEMMs and
  fused glue kernels (kernels_cu/fast/block.py); capture-safe for a CUDA graph after one warm-up.
- draft_attention: a one-pass flash-decoding kernel over ring + block, GQA-aware, split over keys
  (kernels_cu/fast/attention.py); masked_block uses it too.
- candidate_topk: up to 128 hidden rows on an sm_90 GPU (k <= 16, no shortlist), one wgmma kernel with the
  top-k selected beside its stream (kernels_cu/fast/head.py: the head read once, no logits in memory); otherwise
  one BF16 GEMM over the whole head for all B*K hidden rows (cuBLAS gemmEx,
  BF16 inputs, FP32 output, CUBLAS_COMPUTE_32F: FP32 accumulation on the tensor cores), then a
  split stable top-k per row (kernels_cu/fast/topk.cu; C4 order, exact on the fp32 logits).
  The exact mode re-reads the 2.5 GB head once per hidden row with a double-precision dot.
- proposal_head: the same (the fused head, or the GEMM and the selection) with k = 1 (argmax, lowest row on
  ties).
- target_distribution: the exact kernel's numbers, but top-k and top-p thresholds found by
  filtering (a histogram pass and a few radix passes, kernels_cu/fast/target_distribution.cu) instead of a
  64-step bisection over the key space per filter.
- context_kv: one BF16 GEMM through [W_k; W_v] (prepared once), then one fused kernel: head
  RMSNorm, RoPE, BF16/FP16 rounding and the cache write, in place into the caller's caches
  (the C9 outputs are those same arrays; no cache copies). K accumulates in FP32 here, not in
  double: at deep RoPE cancellations the tight bound of the first verdict rules could FAIL it.

Weights are made resident once: ``prepare(name=array, ...)`` (or the first call that sees an
array) uploads/keeps the BF16 bits on the device, keyed by the array object, and derived
weights (the [W_k; W_v] concatenation) are cached the same way, so a repeated call with the
same weight arrays moves no weight bytes except the GEMM's one read.

Compile options: the loader's NVRTC options (kernels_cu/loader.py; CuPy appends -ftz=true, FMA
contraction on), recorded by ``environment()`` together with the GEMM path.
"""

from __future__ import annotations

import functools
import math
from collections import OrderedDict

import numpy as np

from kernels_cu.exact.attention import bf16_bits, cache_layout, device, f16_bits, f32, inv_freq
from kernels_cu.exact.backend import CudaBackend
from kernels_cu.exact.select import _sampling_args
from kernels_cu.fast import head as fast_head
from kernels_cu.fast import lt as fast_lt
from kernels_cu.fast.gemm import ResidentWeights, _key, cp, data_ptr, gemm_bf16, gemm_path  # noqa: F401 - re-exported
from kernels_cu.fast.options import DEFAULT_OPTIONS, FastOptions
from kernels_cu.loader import load_module

_NULL = np.uint64(0)
_TOPK_MAX = 64  # fast/topk.cu FT_KMAX
_FT_THREADS = 256
_FTD_THREADS = 512
TOPK_TARGET_BLOCKS = 16 * 132  # partial top-k blocks to aim for (several waves on an H200's 132 SMs)
# ... for the vec kernel's shapes (k <= 32, rows of 4n floats): one wave of 4 blocks per SM. H200 (bound + vec
# kernels, 528 against 2112 blocks, ms): 120 rows k 16 0.101 vs 0.108, k 1 0.057 vs 0.059; 7 rows k 16 0.039 vs
# 0.045, k 1 0.016 vs 0.017
TOPK_VEC_TARGET_BLOCKS = 4 * 132
_HEAD_PLANS_KEEP = 16  # the fused head's (maps, lists) entries kept per backend object (FastSelectBackend._head_plan)

@functools.cache
def _fn(module: str, name: str):
    return load_module(module).get_function(name)


# --- target_distribution, split path (kernels_cu/fast/target_distribution.cu ftd_split_*) ----------------------
_FTD_SMS = 132  # an H200's SMs: the block counts to aim for
_FTD_BINS = 2048  # fast/target_distribution.cu FTD_BINS
_FTD_CAP = 2048  # fast/target_distribution.cu FTD_CAP
_FTD_CHAINS = 16  # fast/target_distribution.cu FTD_CHAINS (x 32 chains = the exact kernel's 512 threads)
_FTD_STATE_BYTES = 512  # per row, >= sizeof(RowState) (static_assert in fast/target_distribution.cu)


def _ftd_split_plan(N: int, Vr: int) -> dict:
    """Launch shapes of the split path for N rows of Vr tokens (fixed per (N, Vr): capturable).
    chunk / C: the streaming passes (process, compact, write), about 2 waves of 512-thread blocks;
    hchunk / HC: the histogram pass 0, about one wave (each chunk writes a 2048-bin partial that
    the row's last block merges, so fewer, larger chunks). Chunks are multiples of 512 tokens."""
    if N <= 0 or Vr <= 0:
        raise ValueError(f"_ftd_split_plan: N {N}, Vr {Vr}")

    def cut(blocks_per_row: int, min_chunk: int):
        units = -(-Vr // _FTD_THREADS)  # 512-token units
        c = max(1, min(blocks_per_row, -(-Vr // min_chunk)))
        chunk = -(-units // c) * _FTD_THREADS
        return chunk, -(-Vr // chunk)

    chunk, C = cut(-(-2 * _FTD_SMS // N), 4096)
    hchunk, HC = cut(min(32, -(-_FTD_SMS // N)), 8192)
    return {"chunk": chunk, "C": C, "hchunk": hchunk, "HC": HC, "chains": _FTD_CHAINS}


def _target_split(logits, prompt, counts, sampling, N: int, Vr: int, vocab_size: int, scratch, probs):
    """The split path: ten launches, no host synchronisation; per-row state and partials in
    device scratch (the state zeroed per call: its tickets and counters start at 0)."""
    c = cp()
    plan = _ftd_split_plan(N, Vr)
    C, HC, chunk, hchunk = plan["C"], plan["HC"], np.int32(plan["chunk"]), np.int32(plan["hchunk"])
    state = c.zeros(N * _FTD_STATE_BYTES // 8, dtype=np.uint64)
    pcnt = c.empty(N * HC * _FTD_BINS, dtype=np.int32)
    pmass = c.empty(N * HC * _FTD_BINS, dtype=np.float64)
    cand = c.empty(N * _FTD_CAP, dtype=np.uint64)
    n, v = np.int32(N), np.int32(Vr)
    T = (_FTD_THREADS,)
    _fn("fast/target_distribution", "ftd_split_process")(
        (C, N), T, (logits, prompt, counts, *sampling, n, v, np.int32(vocab_size), chunk, scratch, state))
    for stage in (0, 1):  # 0: top-k (counts), 1: top-p (kept mass, over the top-k survivors)
        st = np.int32(stage)
        if stage == 1:  # the top-p total over the top-k survivors: the chain kernel's stage 0
            _fn("fast/target_distribution", "ftd_split_chain")((_FTD_CHAINS, N), (32,),
                                                   (scratch, *sampling, n, v, np.int32(0), state))
        _fn("fast/target_distribution", "ftd_split_hist0")((HC, N), T, (scratch, *sampling, n, v, hchunk, st, state, pcnt, pmass))
        _fn("fast/target_distribution", "ftd_split_compact")((C, N), T, (scratch, *sampling, n, v, chunk, st, state, cand))
        _fn("fast/target_distribution", "ftd_split_fallback")((N,), T, (scratch, *sampling, n, v, st, state))
    _fn("fast/target_distribution", "ftd_split_chain")((_FTD_CHAINS, N), (32,), (scratch, *sampling, n, v, np.int32(1), state))
    _fn("fast/target_distribution", "ftd_split_write")((C, N), T, (scratch, *sampling, n, v, chunk, state, probs))



def topk_plan(M: int, Vr: int, k: int, options: FastOptions = DEFAULT_OPTIONS) -> tuple[int, int, bool, bool, int]:
    """(S splits per row, chunk columns per split, warp variant, merged in the block, partial lists
    per row) of the split top-k (fast/topk.cu): about TOPK_TARGET_BLOCKS blocks (TOPK_VEC_TARGET_BLOCKS
    where the vec kernel's shape conditions hold), chunks of at least
    2048 columns (a multiple of 4); k <= 32 keeps one register list per warp (fast_topk_partial_vec
    or fast_topk_partial_warp, topk_vec_applies says which), else one per thread (one list per
    block). The warp variants merge their 8 warp lists in the block for few rows and k > 1 (one
    list per block), else write all 8 (fast/topk.cu says why)."""
    target = TOPK_VEC_TARGET_BLOCKS if _vec_shape(Vr, k, options) else TOPK_TARGET_BLOCKS
    S = max(1, min(-(-Vr // 2048), -(-target // max(M, 1))))
    chunk = -(-Vr // S)
    chunk += -chunk % 4  # a multiple of 4: the vector kernel's 16-byte groups start on one
    S = -(-Vr // chunk)
    warp = k <= 32
    merged = warp and k >= options.topk_merge_min_k and M <= options.topk_merge_in_block_max_rows
    return S, chunk, warp, merged, S * (_FT_THREADS // 32 if warp and not merged else 1)


def _vec_shape(Vr: int, k: int, options: FastOptions = DEFAULT_OPTIONS) -> bool:
    """The shape half of topk_vec_applies (what topk_plan can know): k <= 32, rows of 4n floats."""
    return options.topk_vec and k <= 32 and Vr % 4 == 0


def topk_vec_applies(logits, shortlist, k: int, options: FastOptions = DEFAULT_OPTIONS) -> bool:
    """Whether topk_into runs fast_topk_partial_vec: the vec shape (k <= 32, rows a multiple of 4
    floats), no shortlist (the id is the column) and a 16-byte aligned array (its 16-byte loads)."""
    return _vec_shape(logits.shape[1], k, options) and shortlist is None and data_ptr(logits) % 16 == 0


def topk_into(logits, shortlist, vocab_size: int, k: int, multiplier: float, softcap: float, partial, scores, ids,
              bound=None, options: FastOptions = DEFAULT_OPTIONS):
    """The split top-k of fp32 logits [M, Vr] into given buffers (no allocation, no host sync):
    partial [M, lists, k] uint64 scratch, scores [M, k] fp32 (or None), ids [M, k] int32, bound [M]
    uint64 scratch or None (the vector kernel's per-row bound, fast_topk_bound; None: no bound)."""
    M, Vr = logits.shape
    S, chunk, warp, merged, lists = topk_plan(M, Vr, k, options)
    if tuple(partial.shape) != (M, lists, k):
        raise ValueError(f"topk_into: partial {partial.shape}, the plan needs {(M, lists, k)}")
    if not M:
        return
    sl = _NULL if shortlist is None else shortlist
    args = (logits, sl, np.int32(M), np.int32(Vr), np.int32(vocab_size), np.int32(k), np.int32(chunk))
    if topk_vec_applies(logits, shortlist, k, options):
        bounded = options.topk_bound and bound is not None
        if bounded:
            if tuple(bound.shape) != (M,) or bound.dtype != np.uint64:
                raise ValueError(f"topk_into: bound {bound.shape} {bound.dtype}, needs ({M},) uint64")
            _fn("fast/topk", "fast_topk_bound")((M,), (_FT_THREADS,), (logits, *args[2:6], bound))
        _fn("fast/topk", "fast_topk_partial_vec")(
            (S, M), (_FT_THREADS,), (logits, bound if bounded else _NULL, *args[2:], np.int32(merged), partial))
    elif warp:
        _fn("fast/topk", "fast_topk_partial_warp")((S, M), (_FT_THREADS,), (*args, np.int32(merged), partial))
    else:
        _fn("fast/topk", "fast_topk_partial")((S, M), (_FT_THREADS,), (*args, partial))
    merge_into(partial, logits, shortlist, Vr, k, multiplier, softcap, scores, ids, options)


def merge_into(partial, logits, shortlist, Vr: int, k: int, multiplier: float, softcap: float, scores, ids,
               options: FastOptions = DEFAULT_OPTIONS):
    """fast/topk.cu's merge of keyed lists partial [M, lists, k] into scores [M, k] fp32 (or None) and ids [M, k]
    int32: global ids through the shortlist (or None), u = c tanh(m z / c) of the selected logits in double. logits
    [M, Vr] fp32, or None: each logit read back from its key (fast/head.cu's lists, whose logits never reach memory)."""
    M, lists = partial.shape[0], partial.shape[1]
    _fn("fast/topk", "fast_topk_merge_warp" if options.topk_merge_warp and k <= 32 else "fast_topk_merge")(
        (M,), (_FT_THREADS,),
        (partial, _NULL if logits is None else logits, _NULL if shortlist is None else shortlist, np.int32(M),
         np.int32(Vr), np.int32(lists), np.int32(k), np.float32(multiplier), np.float32(softcap),
         _NULL if scores is None else scores, ids))


def head_topk_into(x, w, maps, vocab_size: int, k: int, multiplier: float, softcap: float, partial, scores, ids,
                   options: FastOptions = DEFAULT_OPTIONS):
    """The fused head (kernels_cu/fast/head.py: the head GEMM with the top-k in its epilogue, one pass over the head,
    no logits in memory) over x [M, H] and the head w, then fast/topk.cu's merge of the blocks' lists partial
    [M, fast_head.grid(Vr), k] into scores (or None) and ids, the scores read from the keys. maps: None (the tensor
    maps copied from the host at the launch) or fast_head.device_maps(x, w) (capturable: FastRound's workspaces)."""
    fast_head.topk_partial_into(x, w, vocab_size, k, partial, maps=maps, options=options)
    merge_into(partial, None, None, w.shape[0], k, multiplier, softcap, scores, ids, options)


class FastSelectBackend(CudaBackend):
    """The fast selection, head, target and context Ops over the exact backend (the part of the
    fast mode defined in this module; FastCudaBackend below adds the block and the attention)."""

    name = "kernels_cu-fast"
    mode = "fast"

    def __init__(self, max_resident_bytes: int = 48 << 30, options: FastOptions = DEFAULT_OPTIONS):
        """options: the fast mode's tunables (kernels_cu/fast/options.py); every kernel choice is read from them."""
        if not isinstance(options, FastOptions):
            raise TypeError(f"options must be a FastOptions, got {type(options).__name__}")
        self.options = options
        self.resident = ResidentWeights(max_resident_bytes)
        self._freqs: dict = {}
        self._head_lt: dict = {}  # fast_lt.tuned's cache: (M, N, K) -> LtGemm tuned at the shape's first call

    # --- weights ---------------------------------------------------------------------------

    def _bits(self, a):
        """Resident BF16 bits of a weight (uploaded/converted once per source array)."""
        if not isinstance(a, np.ndarray) and getattr(a, "dtype", None) == np.uint16 and a.flags.c_contiguous:
            return a  # already device-resident BF16 bits
        return self.resident.get(("bits", _key(a)), (a,), lambda: bf16_bits(a))

    def _kv_weight(self, wk, wv):
        def build():
            return cp().ascontiguousarray(cp().concatenate([bf16_bits(wk), bf16_bits(wv)], axis=0))

        return self.resident.get(("kv", _key(wk), _key(wv)), (wk, wv), build)

    def _f32(self, a):
        return self.resident.get(("f32", _key(a)), (a,), lambda: f32(a))

    def _inv_freq(self, head_dim: int, theta: float):
        k = (int(head_dim), float(theta))
        if k not in self._freqs:
            self._freqs[k] = inv_freq(head_dim, theta)
        return self._freqs[k]

    def prepare(self, **weights):
        """Make weights resident now (BF16 bits on the device), so that the first timed call
        does no upload. Names are free; returns the resident arrays under the same names.
        Pass wk= and wv= together to also prepare context_kv's concatenated projection."""
        out = {name: self._bits(w) for name, w in weights.items()}
        if "wk" in weights and "wv" in weights and np.ndim(weights["wk"]) == 2:
            out["wkv"] = self._kv_weight(weights["wk"], weights["wv"])
        return out

    def environment(self) -> dict:
        rec = super().environment()
        rec.update(backend=self.name, mode=self.mode, gemm=gemm_path(),
                   fast_kernels="fast/topk.cu, fast/target_distribution.cu, fast/context_kv.cu (loader NVRTC options)",
                   resident_weights="BF16 bits cached per source array (FastCudaBackend.prepare)",
                   fast_options=self.options.describe(),
                   fast_topk=(f"split top-k (topk.cu), target blocks {TOPK_VEC_TARGET_BLOCKS} (vec) / "
                              f"{TOPK_TARGET_BLOCKS}"),
                   fused_head=(f"fused_head={self.options.fused_head}: candidate_topk / proposal_head without a "
                               f"shortlist, k <= {fast_head.KMAX}, rows <= {self.options.fused_head_max_rows_topk} / "
                               f"{self.options.fused_head_max_rows_proposal}, H % {fast_head.KC} == 0 "
                               f"on a compute-capability 9.0 GPU: one wgmma kernel with the top-k in its epilogue "
                               f"(kernels_cu/fast/head.cu, NVRTC {' '.join(fast_head.compile_options()[:-1])})"),
                   proposal_head_gemm=(f"proposal_head_lt={self.options.proposal_head_lt}: heads of >= 256 MiB on the "
                                       "fastest of gemmEx and up to 8 cuBLASLt algorithms (FP32 reductions), timed "
                                       "at each shape's first call (kernels_cu/fast/lt.py); tunings so far: "
                                       + str(fast_lt.describe(self._head_lt))))
        try:
            from cupy_backends.cuda.libs import cublas

            rec["cublas_version"] = cublas.getVersion(cp().cuda.device.get_cublas_handle())
        except Exception as exc:  # noqa: BLE001
            rec["cublas_version"] = f"unknown ({type(exc).__name__})"
        return rec

    # --- selection ---------------------------------------------------------------------------

    def _topk_rows(self, logits, sl, vocab_size: int, k: int, multiplier=0.0, softcap=0.0, want_scores=True):
        c = cp()
        M, Vr = logits.shape
        lists = topk_plan(M, Vr, k, self.options)[4]
        partial = c.empty((M, lists, k), dtype=np.uint64)
        scores = c.empty((M, k), dtype=np.float32) if want_scores else None
        ids = c.empty((M, k), dtype=np.int32)
        bound = c.empty(M, dtype=np.uint64)
        topk_into(logits, sl, vocab_size, k, multiplier, softcap, partial, scores, ids, bound, self.options)
        return scores, ids

    def candidate_topk(self, *, hidden, head, vocab_size, top_k, output_multiplier=0.0, softcap=0.0,
                       shortlist=None):
        hb = bf16_bits(hidden)
        head_b = self._bits(head)
        *lead, H = hb.shape
        Vr = head_b.shape[0]
        k = int(top_k)
        if not 0 < k <= _TOPK_MAX:
            raise ValueError(f"candidate_topk: top_k = {k} outside 1..{_TOPK_MAX}")
        if shortlist is None:
            n_eligible, sl = min(Vr, max(int(vocab_size), 0)), None
        else:
            sl = device(shortlist).astype(np.int32, copy=False)
            if sl.shape != (Vr,):
                raise ValueError(f"candidate_topk: shortlist has shape {sl.shape}, head has {Vr} rows")
            n_eligible = int(((sl >= 0) & (sl < int(vocab_size))).sum())
        if n_eligible < k:
            raise ValueError(f"candidate_topk: {n_eligible} eligible rows, top_k = {k}")
        M = int(np.prod(lead)) if lead else 1
        if self._head_route(M, Vr, H, k, sl, "candidate_topk"):
            scores, ids = self._fused_topk(hb.reshape(M, H), head_b, int(vocab_size), k, float(output_multiplier),
                                           float(softcap))
        else:
            logits = gemm_bf16(hb.reshape(M, H), head_b)
            scores, ids = self._topk_rows(logits, sl, int(vocab_size), k, float(output_multiplier), float(softcap))
        return {"scores": scores.reshape(*lead, k), "ids": ids.reshape(*lead, k)}

    def proposal_head(self, *, hidden, head, vocab_size, shortlist=None):
        hb = bf16_bits(hidden)
        head_b = self._bits(head)
        *lead, H = hb.shape
        Vr = head_b.shape[0]
        if shortlist is None:
            sl = None
            if min(Vr, int(vocab_size)) <= 0:
                raise ValueError("proposal_head: no head row has a global id below vocab_size")
        else:
            sl = device(shortlist).astype(np.int32, copy=False)
            if not bool(((sl >= 0) & (sl < int(vocab_size))).any()):
                raise ValueError("proposal_head: no head row has a global id below vocab_size")
        M = int(np.prod(lead)) if lead else 1
        if self._head_route(M, Vr, H, 1, sl, "proposal_head"):
            _, ids = self._fused_topk(hb.reshape(M, H), head_b, int(vocab_size), 1, want_scores=False)
        else:
            logits = self._head_logits(cp().ascontiguousarray(hb.reshape(M, H)), head_b)
            _, ids = self._topk_rows(logits, sl, int(vocab_size), 1, want_scores=False)
        return {"tokens": ids.reshape(*lead)}

    def _head_route(self, M: int, Vr: int, H: int, k: int, shortlist, op: str) -> bool:
        """Whether ``op`` takes the fused head for this shape (options.fused_head and fast_head.applies)."""
        return fast_head.applies(M, Vr, H, k, shortlist, op, self.options)

    def _head_plan(self, x, w, k: int):
        """(device tensor maps of x and w with their shared thresholds, the blocks' lists scratch) for this launch,
        made once per (x address and shape, w address and shape, k, stream) and kept (LRU, _HEAD_PLANS_KEEP): the
        maps hold only the two addresses and shapes, so an entry found again under the same key is exact, and no call
        that finds one encodes maps or copies them from the host. The thresholds are zero between launches (the
        kernel's last block zeroes them) and the lists are rewritten whole by each launch; the stream in the key keeps
        two launches through one entry ordered (fast_head.device_maps' rule)."""
        c = cp()
        key = (x.data.ptr, x.shape, w.data.ptr, w.shape, k, c.cuda.get_current_stream().ptr)
        plans = self.__dict__.setdefault("_head_plans", OrderedDict())
        plan = plans.get(key)
        if plan is None:
            plan = plans[key] = (fast_head.device_maps(x, w),
                                 c.empty((x.shape[0], fast_head.grid(w.shape[0]), k), dtype=np.uint64))
            while len(plans) > _HEAD_PLANS_KEEP:
                plans.popitem(last=False)
        else:
            plans.move_to_end(key)
        return plan

    def _fused_topk(self, x, w, vocab_size: int, k: int, multiplier=0.0, softcap=0.0, want_scores=True):
        """head_topk_into with its buffers: (scores [M, k] fp32 or None, ids [M, k] int32); the maps and the lists
        from _head_plan (not under a stream capture: there the maps are made per call as before, since a plan's
        scratch would be shared between the captured graph and later calls)."""
        c = cp()
        x = c.ascontiguousarray(x)
        w = c.ascontiguousarray(w)
        M, Vr = x.shape[0], w.shape[0]
        if c.cuda.get_current_stream().is_capturing():
            maps, partial = None, c.empty((M, fast_head.grid(Vr), k), dtype=np.uint64)
        else:
            maps, partial = self._head_plan(x, w, k)
        scores = c.empty((M, k), dtype=np.float32) if want_scores else None
        ids = c.empty((M, k), dtype=np.int32)
        head_topk_into(x, w, maps, vocab_size, k, multiplier, softcap, partial, scores, ids, self.options)
        return scores, ids

    def _head_logits(self, x, w):
        """fp32 logits x @ w^T (BF16 bits): gemmEx, or for a head of fast_lt.MIN_BYTES or more the algorithm
        fast_lt.LtGemm timed fastest at this shape's first call."""
        M, N = x.shape[0], w.shape[0]
        if not (self.options.proposal_head_lt and M > 0 and w.nbytes >= fast_lt.MIN_BYTES and w.flags.c_contiguous):
            return gemm_bf16(x, w)
        out = cp().empty((M, N), dtype=np.float32)
        fast_lt.tuned(self._head_lt, x, w, out, gemm_bf16)
        return out

    def target_distribution(self, *, logits, prompt_mask, output_counts, temperature, top_p, min_p,
                            repetition_penalty, frequency_penalty, presence_penalty, top_k, vocab_size):
        c = cp()
        logits = device(logits).astype(np.float32, copy=False)
        N, Vr = logits.shape
        prompt = device(prompt_mask).astype(np.uint8, copy=False)
        counts = device(output_counts).astype(np.int32, copy=False)
        if prompt.shape != (N, Vr) or counts.shape != (N, Vr):
            raise ValueError(f"target_distribution: prompt_mask {prompt.shape} / output_counts {counts.shape}")
        kw = {"temperature": temperature, "top_p": top_p, "min_p": min_p, "repetition_penalty": repetition_penalty,
              "frequency_penalty": frequency_penalty, "presence_penalty": presence_penalty, "top_k": top_k}
        probs = c.empty((N, Vr), dtype=np.float32)
        if N and Vr:
            scratch = c.empty((N, Vr), dtype=np.float32)
            if N <= self.options.target_split_max_rows:  # few rows: each row split over many blocks
                _target_split(logits, prompt, counts, _sampling_args(N, kw), N, Vr, int(vocab_size), scratch, probs)
            else:  # one block per row (already fills the GPU)
                _fn("fast/target_distribution", "fast_target_distribution_rows")(
                    (N,), (_FTD_THREADS,),
                    (logits, prompt, counts, *_sampling_args(N, kw), np.int32(N), np.int32(Vr), np.int32(vocab_size),
                     scratch, probs))
        return {"probs": probs}

    # --- context -----------------------------------------------------------------------------

    def context_kv(self, *, context, k_cache, v_cache, wk, wv, k_norm, start, eps, theta, head_dim,
                   storage="ring", page_size=None, page_table=None):
        cb = bf16_bits(context)
        t = cb.shape[0]
        start = int(start)
        if start < 0:
            raise ValueError(f"context_kv: start {start} < 0")
        kc = bf16_bits(k_cache)  # the caller's device arrays, written in place (returned as the outputs)
        vc = f16_bits(v_cache)
        first, paged, psize, hk, capacity, table = cache_layout(storage, kc, start, t, page_size, page_table)
        head_dim = int(head_dim)
        if t > first:
            wkv = self._kv_weight(wk, wv)
            if wkv.shape[0] != 2 * hk * head_dim:
                raise ValueError(f"context_kv: wk/wv give {wkv.shape[0]} rows, cache needs 2 * {hk} * {head_dim}")
            kv = gemm_bf16(cb[first:], wkv)
            _fn("fast/context_kv", "fast_context_kv_write")(
                ((t - first) * hk,), (32 * math.ceil(head_dim / 32),),
                (kv, np.int32(kv.shape[1]), self._f32(k_norm), self._inv_freq(head_dim, theta), np.float32(eps),
                 np.int64(start + first), np.int32(hk), np.int32(head_dim), np.int32(paged), np.int64(capacity),
                 np.int32(psize), table, kc, vc),
                shared_mem=4 * head_dim)
        return {"k_cache": kc, "v_cache": vc.view(np.float16), "frontier": cp().asarray(start + t, dtype=np.int64)}


# The fast block and attention are mixins in their own modules; fast_block imports this module's
# GEMM, so they are composed here, after everything it needs exists.
from kernels_cu.fast.attention import FastAttentionMixin  # noqa: E402
from kernels_cu.fast.block import FastBlockMixin  # noqa: E402
from kernels_cu.fast.capture import FastCaptureMixin  # noqa: E402
from kernels_cu.fast.grouped_conv import FastGroupedConvMixin  # noqa: E402


class FastCudaBackend(FastCaptureMixin, FastGroupedConvMixin, FastBlockMixin, FastAttentionMixin, FastSelectBackend):
    """CONTRACTS C9 implementation object, fast mode: masked_block / draft_layer
    (kernels_cu/fast/block.py), draft_attention (kernels_cu/fast/attention.py), feature_capture
    (kernels_cu/fast/capture.py), grouped_conv (kernels_cu/fast/grouped_conv.py) and the Ops of this module; every
    other Op is the exact mode's. ``options``: the tunables (kernels_cu/fast/options.py)."""
