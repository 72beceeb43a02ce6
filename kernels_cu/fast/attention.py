"""Fast draft attention for the fast mode: ``attention_fast`` and ``FastAttentionMixin``.

``attention_fast`` has the contract and outputs of ``kernels_cu.exact.attention.attention`` (q [B,W,Hq,D],
k/v [B,W,Hk,D], rings [B,C,Hk,D] as BF16 / FP16 bits, frontier int64 [B], live int32 [B], window S or 0;
returns (fp32 or None, BF16 bits or None), rows >= live zero) and runs kernels_cu/fast/attention.cu:
a one-pass flash-decoding kernel on the tensor cores (mma.sync m16n8k16, FP32 accumulation), the GQA
group's query heads and the W block rows sharing each K/V tile, keys split over thread blocks with a
combine kernel when the context is long. q/k/v may be FP32 (masked_block's path: split into two BF16
parts on the fly, ~16 significant bits) or BF16 bits (uint16, the Op's inputs: read as they are). The
caches are read directly (BF16 K, FP16 V; no conversion copies). See the .cu header for the numerics.

On sm_90 the BF16-bit kernel at D 128 with 64 query rows a block (masked_block's B8 W16 call: 4 query heads a KV
head x 16 rows) takes the wgmma form (``FastOptions.attention_wgmma``): one warpgroup computes each tile's QK^T and PV on wgmma from
128-byte-swizzled K/V tiles, with the same bits as the mma.sync kernel (tests/gpu/test_fast_attention.py).

Geometries the kernel does not cover (D not a multiple of 8 or above 128, W above 64) fall back to
the exact kernel (``ops_attention.attention``); ``last_path()`` says which ran.

``FastAttentionMixin`` carries the ``draft_attention`` Op method (CONTRACTS C9, same signature and
outputs as ``ops_attention.AttentionOps.draft_attention``) on ``attention_fast``; compose it before the
backend: ``class B(FastAttentionMixin, FastCudaBackend)``.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from kernels_cu.exact.attention import attention, bf16_bits, device, f16_bits, f32
from kernels_cu.fast.options import DEFAULT_OPTIONS, FastOptions
from kernels_cu.loader import (NVRTC_OPTIONS, ModuleFunction, allow_dynamic_shared_memory, include_options,
                               nvrtc_arch_module, source_path)
from kernels_cu.pdl import active as _pdl_active
from kernels_cu.pdl import launch

_NT, _ROWS, _WARPS = 64, 64, 4  # fast/attention.cu FA_NT, FA_ROWS, FA_WARPS
_MAX_D, _MAX_W = 128, 64
_NULL = np.uint64(0)
_LOG2E = 1.4426950408889634

# Key splits (options.attention_splits): None picks them per call, as many blocks as fit on the GPU at once
# (options.attention_blocks_per_sm a multiprocessor, None: the kernel's occupancy, resident_blocks; 2 for the D 128
# kernels on an H200), at least options.attention_min_tiles_per_split context tiles each; an int forces them (tests
# exercise the combine). One full wave is the H200's optimum: at 27B B8 W16 4 splits took 48.9 us against 55.9 for
# a partial wave and 64.3 for a second one; at B1 the tile minimum binds.

_last = {"path": None}


def cp():
    import cupy

    return cupy


def last_path() -> str | None:
    """'fast', 'fast-wgmma' (the wgmma form) or 'exact-fallback (<why>)' for the latest attention_fast call."""
    return _last["path"]


def _dp(d: int) -> int:
    return 16 if d <= 16 else 32 if d <= 32 else 64 if d <= 64 else 128


def _mt(rows: int) -> int:
    return 1 if rows <= 16 else 2 if rows <= 32 else 4


def smem_bytes(dp: int, mt: int, stages: int = 2, wg: bool = False) -> int:
    """``stages`` stages of K and V tiles [64][dp + 8] (16-bit; ``wg``, the wgmma form's swizzled layout: [64][dp],
    no padding, after up to 1 KiB of slack that aligns them to 1024 bytes), then one region shared by the q rows
    [16 mt][dp + 8] (16-bit) and the per-warp P scratch [4][16][16 mt] fp32: the larger of the two."""
    tiles = 2 * stages * _NT * (dp if wg else dp + 8) * 2 + (1024 if wg else 0)
    return tiles + max(16 * mt * (dp + 8) * 2, _WARPS * 16 * (16 * mt) * 4)


# K/V pipeline stages (options.attention_stages, 2 to 4): the kernel issues its first `stages` context tiles before it
# waits for the kernel ahead (under PDL, kernels_cu/pdl.py: while fb_qkv_post runs). Every count gives the same bits;
# 2 keeps two blocks a multiprocessor at D 128 (4 stages measured slower in the round at B1).

# The wgmma form (fast/attention.cu -DFA_WG=1, attn_body's WG; NVRTC for sm_90a): the BF16-bits kernel at D 128 with
# 64 query rows a block (masked_block's call at B8 W16: a GQA group of 4 x 16 rows) computes each tile's QK^T and
# PV as one warpgroup on wgmma, K and V read by the tensor cores from shared memory once a tile instead of once a
# warp through ldmatrix. The tiles sit with the 128-byte swizzle (no padding). Same softmax, masks, slow paths and
# epilogue, and the same bits as the mma.sync kernel (the tensor cores' k16 steps in the same order); on the H200
# 47.2 us against 56.0 a call at 35B B8 W16. options.attention_wgmma None: on where wg_capable() (a
# compute-capability 9.0 GPU); False: never; True: wherever the shape takes it (NVRTC's sm_90a build fails elsewhere).


def wg_shape(dp: int, d: int, mt: int, bits: bool) -> bool:
    """Whether the wgmma form covers this call's variant: D 128 (no padded columns), 4 m-tiles (a warpgroup over
    64 rows), BF16 bits."""
    return dp == _MAX_D and d == _MAX_D and mt == 4 and bits


def wg_for(dp: int, d: int, mt: int, bits: bool, options: FastOptions = DEFAULT_OPTIONS) -> bool:
    """The form attention_fast launches: wg_shape, and options.attention_wgmma (None: wg_capable())."""
    want = options.attention_wgmma
    if not wg_shape(dp, d, mt, bits) or want is False:
        return False
    return True if want else wg_capable()


@functools.cache
def wg_capable() -> bool:
    try:
        return cp().cuda.Device().compute_capability == "90"
    except Exception:  # noqa: BLE001 - no CuPy or no GPU
        return False


def module_options(dp: int, mt: int, f32_inputs: bool, stages: int = 2, wg: bool = False) -> tuple[str, ...]:
    """NVRTC's options for one variant (FA_SINGLE); the wgmma form adds -DFA_WG=1 (the caller names sm_90a)."""
    return (*NVRTC_OPTIONS, *include_options(), "-DFA_SINGLE", f"-DFA_DP={dp}", f"-DFA_MT={mt}", f"-DFA_NS={stages}",
            f"-DFA_F32={int(f32_inputs)}", *(("-DFA_WG=1",) if wg else ()))


@functools.cache
def _module(dp: int, mt: int, f32_inputs: bool, stages: int = 2, wg: bool = False):
    """One variant per module (FA_SINGLE): NVRTC builds only what a geometry uses."""
    import cupy

    if wg and not wg_shape(dp, dp, mt, not f32_inputs):
        raise ValueError(f"the wgmma form is built for BF16 bits at D {_MAX_D}, 4 m-tiles")
    code = source_path("fast/attention").read_text()
    opts = module_options(dp, mt, f32_inputs, stages, wg)
    if wg:  # CuPy's RawModule picks plain sm_90, which has no wgmma
        return nvrtc_arch_module(code, "fast_attention_wg.cu", ["--gpu-architecture=sm_90a", *opts])
    return cupy.RawModule(code=code, options=opts)


@functools.cache
def _kernels(dp: int, mt: int, f32_inputs: bool, stages: int = 2, wg: bool = False):
    mod = _module(dp, mt, f32_inputs, stages, wg)
    name = f"fast_attn_d{dp}_m{mt}_s{stages}_{'f' if f32_inputs else 'b'}"
    smem = smem_bytes(dp, mt, stages, wg)
    combine_names = {cb: f"fast_attn_combine_d{dp}_c{cb}" for cb in COMBINE_BATCHES}
    if wg:
        main = ModuleFunction(mod.get_function(name), name, smem)
        combine = {cb: ModuleFunction(mod.get_function(n), n) for cb, n in combine_names.items()}
        return main, combine, smem
    main = mod.get_function(name)
    allow_dynamic_shared_memory(main, smem)
    combine = {cb: mod.get_function(n) for cb, n in combine_names.items()}
    return main, combine, smem


# fast/attention.cu's combine instances: splits whose loads it issues at once. combine_batch(ns) picks the smallest
# that holds ns, at most the largest (on the H200 a batch of 8 took 5.2 us a call at 4 splits against 4.3 for the
# per-split loop, 3.6 against 5.9 at 16 splits). A batch that holds every split is one pass (combine_body: (m, l) and
# o loaded together, one L2 latency instead of two), so up to 16 splits (35B B1: 16) cost one latency.
COMBINE_BATCHES = (2, 4, 8, 16)


def combine_batch(ns: int) -> int:
    return next((cb for cb in COMBINE_BATCHES if ns <= cb), COMBINE_BATCHES[-1])


@functools.cache
def _sm_count(dev_id: int) -> int:
    return int(cp().cuda.Device(dev_id).attributes["MultiProcessorCount"])


def resident_blocks(dp: int, mt: int, f32_inputs: bool, stages: int = 2, wg: bool = False) -> int:
    """Blocks of one kernel variant a multiprocessor holds at once: its registers (allocated per warp
    in units of 256) and its shared memory (plus the per-block reservation) against the device's."""
    return _resident_blocks(dp, mt, f32_inputs, cp().cuda.Device().id, stages, wg)


@functools.cache
def _resident_blocks(dp: int, mt: int, f32_inputs: bool, dev_id: int, stages: int = 2, wg: bool = False) -> int:
    main, _, smem = _kernels(dp, mt, f32_inputs, stages, wg)
    try:  # the driver's occupancy calculator, where CuPy exposes it
        return max(1, int(cp().cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(main.kernel.ptr, 32 * _WARPS,
                                                                                        smem)))
    except Exception:  # noqa: BLE001 - any missing binding: count registers and shared memory ourselves
        a = cp().cuda.Device(dev_id).attributes
        per_warp = -(-int(main.attributes["num_regs"]) * 32 // 256) * 256
        by_regs = int(a.get("MaxRegistersPerMultiprocessor", 65536)) // (per_warp * _WARPS)
        by_smem = int(a.get("MaxSharedMemoryPerMultiprocessor", 233472)) // (
            smem + int(a.get("ReservedSharedMemoryPerBlock", 1024)))
        by_threads = int(a.get("MaxThreadsPerMultiProcessor", 2048)) // (32 * _WARPS)
        return max(1, min(by_regs, by_smem, by_threads))


def splits_for(b: int, hk: int, chunks: int, capacity: int, window: int, resident: int = 2,
               options: FastOptions = DEFAULT_OPTIONS) -> int:
    """Key splits per (b, KV head, row chunk): the context tiles a row can see at most (F is on the
    device), shared so that the grid is one wave of `resident` (or options.attention_blocks_per_sm) blocks per
    multiprocessor, with at least options.attention_min_tiles_per_split tiles per split; options.attention_splits
    forces the count."""
    if options.attention_splits is not None:
        return max(1, int(options.attention_splits))
    n_ctx = min(capacity, window - 1) if window > 0 else capacity
    tiles = -(-max(n_ctx, 0) // _NT)
    per_sm = options.attention_blocks_per_sm if options.attention_blocks_per_sm is not None else resident
    want = per_sm * _sm_count(cp().cuda.Device().id) // max(1, b * hk * chunks)
    return max(1, min(want, tiles // max(1, options.attention_min_tiles_per_split)))


def unsupported(d: int, w: int, b: int, hk: int, capacity: int) -> str | None:
    if d % 8 or not 8 <= d <= _MAX_D:
        return f"head_dim {d} (the fast kernel takes multiples of 8 up to {_MAX_D})"
    if w > _MAX_W:
        return f"W {w} > {_MAX_W}"
    if capacity >= 2**31:
        return f"ring capacity {capacity} >= 2^31"
    if b * hk > 65535:
        return f"B * Hk = {b * hk} > 65535"
    return None


def _aligned(x, n: int = 16):
    return x if x.data.ptr % n == 0 else x.copy()


def attention_fast(q, k, v, kc_bits, vc_bits, frontier, live, window, *, f32_out=True, bf16_out=False,
                   pdl=False, options: FastOptions = DEFAULT_OPTIONS):
    """ops_attention.attention's contract on the fast kernel: q [B,W,Hq,D], k/v [B,W,Hk,D] FP32 (or BF16
    bits as uint16, all three alike), caches [B,C,Hk,D] BF16 / FP16 bits, frontier [B] int64, live [B]
    int32, window S (0: full) -> (fp32 [B,W,Hq,D] or None, BF16 bits or None); rows >= live are 0.

    ``pdl``: launch both kernels with programmatic dependent launch (kernels_cu/pdl.py). Only for a
    caller whose kernel right ahead writes none of the caches, frontier and live (block_forward: after
    fb_qkv_post), since the kernel prefetches context tiles before it waits for that one. ``options``: the splits,
    stages and form (kernels_cu/fast/options.py)."""
    c = cp()
    b, w, hq, d = q.shape
    hk, cap = k.shape[2], kc_bits.shape[1]
    if hq % hk:
        raise ValueError(f"draft_attention: {hq} query heads are not a multiple of {hk} KV heads")
    if cap < 1:
        raise ValueError("draft_attention: the context cache needs capacity >= 1 (slot p mod C)")
    why = unsupported(d, w, b, hk, cap)
    if why is not None:
        _last["path"] = f"exact-fallback ({why})"
        return attention(f32(q), f32(k), f32(v), kc_bits, vc_bits, frontier, live, int(window),
                         f32_out=f32_out, bf16_out=bf16_out)
    _last["path"] = "fast"
    of = c.empty(q.shape, dtype=np.float32) if f32_out else None
    ob = c.empty(q.shape, dtype=np.uint16) if bf16_out else None
    if q.size == 0 or (of is None and ob is None):
        return of, ob
    bits = all(getattr(x, "dtype", None) == np.uint16 for x in (q, k, v))
    if bits:
        q, k, v = (c.ascontiguousarray(x) for x in (q, k, v))
    else:
        q, k, v = (c.ascontiguousarray(f32(x), dtype=np.float32) for x in (q, k, v))
    q, k, v = (_aligned(x, 16 if bits else 8) for x in (q, k, v))  # bits: k / v rows go by 16-byte cp.async
    kc = _aligned(c.ascontiguousarray(kc_bits))
    vc = c.ascontiguousarray(vc_bits)
    vc = _aligned(vc.view(np.uint16) if vc.dtype == np.float16 else vc)
    if kc.shape != (b, cap, hk, d) or vc.shape != kc.shape or kc.dtype != np.uint16 or vc.dtype != np.uint16:
        raise ValueError(f"draft_attention: caches {kc.shape} {kc.dtype} / {vc.shape} {vc.dtype}, "
                         f"expected [B, C, Hk, D] = {(b, cap, hk, d)} BF16 / FP16 bits")
    frontier = c.ascontiguousarray(c.asarray(frontier), dtype=np.int64)
    live = c.ascontiguousarray(c.asarray(live), dtype=np.int32)
    window = int(window)

    g = hq // hk
    m_rows = w * g
    chunks = -(-m_rows // _ROWS)
    dp, mt = _dp(d), _mt(min(m_rows, _ROWS))
    stages = int(options.attention_stages)
    wg = wg_for(dp, d, mt, bits, options)
    _last["path"] = "fast-wgmma" if wg else "fast"
    main, combine, smem = _kernels(dp, mt, not bits, stages, wg)
    ns = splits_for(b, hk, chunks, cap, window, resident_blocks(dp, mt, not bits, stages, wg), options)
    part_o = part_ml = None
    if ns > 1:
        part_o = c.empty(ns * b * hk * m_rows * dp, dtype=np.float32)
        part_ml = c.empty(ns * b * hk * m_rows * 2, dtype=np.float32)
    sl2 = np.float32(_LOG2E / math.sqrt(d))
    launch(main, (ns, b * hk, chunks), (32 * _WARPS,),
           (q, k, v, kc, vc, frontier, live, np.int32(b), np.int32(w), np.int32(hq), np.int32(hk), np.int32(d),
            np.int64(cap), np.int64(window), sl2, np.int32(ns), _NULL if part_o is None else part_o,
            _NULL if part_ml is None else part_ml, _NULL if of is None else of, _NULL if ob is None else ob),
           smem, pdl=pdl)
    if ns > 1:
        rows = b * hk * m_rows
        launch(combine[combine_batch(ns)], (-(-rows // 4),), (128,),
               (part_o, part_ml, live, np.int32(b), np.int32(w), np.int32(hq), np.int32(hk), np.int32(d),
                np.int32(ns), _NULL if of is None else of, _NULL if ob is None else ob), 0, pdl=pdl)
    return of, ob


class FastAttentionMixin:
    """The draft_attention Op on attention_fast (BF16 q/k/v and the caches read as they are)."""

    def draft_attention(self, *, q, k, v, k_cache, v_cache, frontier, live, window=0):
        _, out = attention_fast(bf16_bits(q), bf16_bits(k), bf16_bits(v), bf16_bits(k_cache), f16_bits(v_cache),
                                device(frontier), device(live), int(window), f32_out=False, bf16_out=True,
                                options=self.options)
        return {"out": out}

    def environment(self) -> dict:
        base = getattr(super(), "environment", None)
        rec = dict(base()) if base is not None else {}
        o = self.options
        rec["fast_attention"] = ("fast/attention.cu: mma.sync m16n8k16 (BF16 QK^T, FP16/BF16 PV, FP32 accumulation); "
                                 f"the wgmma form (attention_wgmma={o.attention_wgmma}, None: on for sm_90; NVRTC "
                                 "sm_90a) for BF16 bits at D 128 and 64 query rows a block: m64n64k16 QK^T and "
                                 "m64n128k16 PV from registers, 128-byte-swizzled K/V tiles, the same bits; "
                                 f"split-K over {_NT}-key tiles, one wave (attention_splits={o.attention_splits}, "
                                 f"attention_blocks_per_sm={o.attention_blocks_per_sm} (None: occupancy), "
                                 f"attention_min_tiles_per_split={o.attention_min_tiles_per_split}); "
                                 f"{o.attention_stages} K/V stages, the first ones loaded before griddepcontrol.wait; "
                                 f"PDL in masked_block (kernels_cu/pdl.py, active={_pdl_active()}); exact fallback "
                                 f"for D % 8 or D > {_MAX_D} or W > {_MAX_W}")
        return rec
