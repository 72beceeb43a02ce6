"""Fast draft attention for the fast mode (issue 12): ``attention_fast`` and ``FastAttentionMixin``.

``attention_fast`` has the contract and outputs of ``kernels_cu.ops_attention.attention`` (q [B,W,Hq,D],
k/v [B,W,Hk,D], rings [B,C,Hk,D] as BF16 / FP16 bits, frontier int64 [B], live int32 [B], window S or 0;
returns (fp32 or None, BF16 bits or None), rows >= live zero) and runs kernels_cu/fast_attention.cu:
a one-pass flash-decoding kernel on the tensor cores (mma.sync m16n8k16, FP32 accumulation), the GQA
group's query heads and the W block rows sharing each K/V tile, keys split over thread blocks with a
combine kernel when the context is long. q/k/v may be FP32 (masked_block's path: split into two BF16
parts on the fly, ~16 significant bits) or BF16 bits (uint16, the Op's inputs: read as they are). The
caches are read directly (BF16 K, FP16 V; no conversion copies). See the .cu header for the numerics.

On sm_90 the BF16-bit kernel at D 128 with 64 query rows a block (masked_block's B8 W16 call: 4 query heads a KV
head x 16 rows) takes the wgmma form (``WGMMA``): one warpgroup computes each tile's QK^T and PV on wgmma from
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

from kernels_cu.loader import KERNEL_DIR, NVRTC_OPTIONS, ModuleFunction, allow_dynamic_shared_memory, nvrtc_arch_module
from kernels_cu.ops_attention import attention, bf16_bits, device, f16_bits, f32
from kernels_cu.pdl import active as _pdl_active
from kernels_cu.pdl import launch

_NT, _ROWS, _WARPS = 64, 64, 4  # fast_attention.cu FA_NT, FA_ROWS, FA_WARPS
_MAX_D, _MAX_W = 128, 64
_NULL = np.uint64(0)
_LOG2E = 1.4426950408889634

# Number of key splits: None picks it per call (as many blocks as fit on the GPU at once, BLOCKS_PER_SM per
# multiprocessor, at least MIN_TILES_PER_SPLIT context tiles each); an int forces it (tests exercise the combine).
# BLOCKS_PER_SM None: the kernel's occupancy (registers and shared memory per block, resident_blocks; 2 for the
# D 128 kernels on an H200). One full wave is the H200 sweep's optimum (benchmarks/bench_fast_attention.py
# --sweep, session v6, BF16 bits, graph us): 27B B8 W16 4 splits 48.9 against 3 (the v5 rule, a partial wave)
# 55.9 and 5 (a second wave) 64.3; 35B B8 W16 4 splits 71.3 against 87.7 and 93.0; at B1 the tile minimum
# binds (8 and 16 splits) and 8-16 splits were within 1 us of each other.
SPLITS: int | None = None
BLOCKS_PER_SM: int | None = None
MIN_TILES_PER_SPLIT = 4

_last = {"path": None}


def cp():
    import cupy

    return cupy


def last_path() -> str | None:
    """'fast', 'fast-wgmma' (the wgmma form, WGMMA) or 'exact-fallback (<why>)' for the latest attention_fast
    call."""
    return _last["path"]


def _dp(d: int) -> int:
    return 16 if d <= 16 else 32 if d <= 32 else 64 if d <= 64 else 128


def _mt(rows: int) -> int:
    return 1 if rows <= 16 else 2 if rows <= 32 else 4


def smem_bytes(dp: int, mt: int, stages: int = 2, alias: bool = False, wg: bool = False) -> int:
    """``stages`` stages of K and V tiles [64][dp + 8] (16-bit; ``wg``, the wgmma form's swizzled layout: [64][dp],
    no padding, after up to 1 KiB of slack that aligns them to 1024 bytes), then one region shared by the q rows
    [16 mt][dp + 8] (16-bit) and the per-warp P scratch [4][16][16 mt] fp32: the larger of the two. ``alias`` (the
    aliased layout, ALIAS): no such region, q's rows and the scratch sit in K tiles."""
    tiles = 2 * stages * _NT * (dp if wg else dp + 8) * 2 + (1024 if wg else 0)
    return tiles if alias else tiles + max(16 * mt * (dp + 8) * 2, _WARPS * 16 * (16 * mt) * 4)


# K/V pipeline stages (2 to 4): the kernel issues its first `stages` context tiles before it waits for the
# kernel ahead (under PDL, kernels_cu/pdl.py: while fb_qkv_post runs). None: 2. Four stages (one block per
# multiprocessor by shared memory at D 128) measured slower in the round at B1, where they were meant to
# load a split's whole context under PDL: 35B B1 W8 0.730 against 0.718 ms (docs/reports/h200-round-ab-v10.json);
# an int forces the count (tests check 2, 3 and 4 give the same bits; round_ab's stages4).
STAGES: int | None = None

# The aliased shared-memory layout (fast_attention.cu -DFA_ALIAS=1, attn_body's ALIAS): the kernel drops the
# region after the stages (q's rows, the non-finite V path's P scratch; 17 KB at D 128) by putting q's rows in the
# last stage's K tile (whose first context tile is then issued after the wait, once q is in registers) and the
# scratch in the K tile being computed. It exists so that 3 stages fit two blocks a multiprocessor at D 128
# (2 x (104,448 + 1 KB) <= 228 KB against 2 x (121,856 + 1 KB)); same bits as the default layout. D 128 only
# (the K tile of a narrower head may not hold the scratch); elsewhere the default layout. Off: measured no
# faster (35B B8 W16 1.039 against 1.040 ms, B1 slower; docs/reports/h200-round-ab-v12-alias.json).
ALIAS = False


def stages_for() -> int:
    """The stage count: STAGES, else 2."""
    return 2 if STAGES is None else int(STAGES)


def alias_for(dp: int, alias: bool | None = None) -> bool:
    """Whether the aliased layout is built for a head width padded to dp: ``alias`` as given, or (None) the
    layout attention_fast launches, ALIAS at dp 128 only."""
    return (bool(ALIAS) and dp == _MAX_D) if alias is None else bool(alias)


# The wgmma form (fast_attention.cu -DFA_WG=1, attn_body's WG; NVRTC for sm_90a): the BF16-bits kernel at D 128 with
# 64 query rows a block (masked_block's call at B8 W16: a GQA group of 4 x 16 rows) computes each tile's QK^T and
# PV as one warpgroup on wgmma, K and V read by the tensor cores from shared memory once a tile instead of once a
# warp through ldmatrix. The tiles sit with the 128-byte swizzle (no padding). Same softmax, masks, slow paths and
# epilogue, and the same bits as the mma.sync kernel (the tensor cores' k16 steps in the same order). H200, session
# v17: 35B B8 W16 47.2 us against 56.0 a call, the round 0.919 ms against 0.970 (docs/PERFORMANCE.md).
# None: on where wg_capable() (a compute-capability 9.0 GPU; cached per process, like fast_head's check); False:
# never; True: wherever the shape takes it (NVRTC's sm_90a build fails elsewhere).
WGMMA: bool | None = None


def wg_shape(dp: int, d: int, mt: int, bits: bool, alias: bool) -> bool:
    """Whether the wgmma form covers this call's variant: D 128 (no padded columns), 4 m-tiles (a warpgroup over
    64 rows), BF16 bits, the default shared-memory layout."""
    return dp == _MAX_D and d == _MAX_D and mt == 4 and bits and not alias


def wg_for(dp: int, d: int, mt: int, bits: bool, alias: bool) -> bool:
    """The form attention_fast launches: wg_shape, and WGMMA (None: wg_capable())."""
    if not wg_shape(dp, d, mt, bits, alias) or WGMMA is False:
        return False
    return True if WGMMA else wg_capable()


@functools.cache
def wg_capable() -> bool:
    try:
        return cp().cuda.Device().compute_capability == "90"
    except Exception:  # noqa: BLE001 - no CuPy or no GPU
        return False


EXTRA_OPTIONS: tuple[str, ...] = ()  # more NVRTC options (benchmarks/attn_phases.py: -DFA_TIMING)

# The combine kernel's single pass where one batch holds every split (fast_attention.cu combine_body: (m, l) and o
# loaded together, one L2 latency instead of two; the same bits). False builds the two passes (round_ab's
# combine_two_pass; session v20).
COMBINE_ONE_PASS = True


def module_options(dp: int, mt: int, f32_inputs: bool, extra: tuple[str, ...] = (), stages: int = 2,
                   alias: bool = False, wg: bool = False) -> tuple[str, ...]:
    """NVRTC's options for one variant (FA_SINGLE); the wgmma form adds -DFA_WG=1 (the caller names sm_90a)."""
    return (*NVRTC_OPTIONS, f"-I{KERNEL_DIR}", "-DFA_SINGLE", f"-DFA_DP={dp}", f"-DFA_MT={mt}", f"-DFA_NS={stages}",
            f"-DFA_F32={int(f32_inputs)}", *(("-DFA_ALIAS=1",) if alias else ()), *(("-DFA_WG=1",) if wg else ()),
            *extra)


def _module(dp: int, mt: int, f32_inputs: bool, extra: tuple[str, ...] = (), stages: int = 2,
            alias: bool | None = None, wg: bool = False):
    """One variant per module (FA_SINGLE): NVRTC builds only what a geometry uses. ``alias`` None: alias_for(dp),
    the layout attention_fast launches."""
    return _module_built(dp, mt, f32_inputs, extra, stages, alias_for(dp, alias), wg)


@functools.cache
def _module_built(dp: int, mt: int, f32_inputs: bool, extra: tuple[str, ...], stages: int, alias: bool,
                  wg: bool = False):
    import cupy

    if alias and dp != _MAX_D:
        raise ValueError(f"the aliased layout is built at D {_MAX_D} only, not {dp}")
    if wg and not wg_shape(dp, dp, mt, not f32_inputs, alias):
        raise ValueError(f"the wgmma form is built for BF16 bits at D {_MAX_D}, 4 m-tiles, the default layout")
    code = (KERNEL_DIR / "fast_attention.cu").read_text()
    opts = module_options(dp, mt, f32_inputs, extra, stages, alias, wg)
    if wg:  # CuPy's RawModule picks plain sm_90, which has no wgmma
        return nvrtc_arch_module(code, "fast_attention_wg.cu", ["--gpu-architecture=sm_90a", *opts])
    return cupy.RawModule(code=code, options=opts)


def _kernels(dp: int, mt: int, f32_inputs: bool, stages: int = 2, alias: bool | None = None, wg: bool = False):
    extra = (*EXTRA_OPTIONS, *(() if COMBINE_ONE_PASS else ("-DFA_COMBINE_ONE_PASS=0",)))
    return _kernels_opts(dp, mt, f32_inputs, extra, stages, alias_for(dp, alias), wg)


@functools.cache
def _kernels_opts(dp: int, mt: int, f32_inputs: bool, extra: tuple[str, ...], stages: int = 2, alias: bool = False,
                  wg: bool = False):
    mod = _module(dp, mt, f32_inputs, extra, stages, alias, wg)
    name = f"fast_attn_d{dp}_m{mt}_s{stages}_{'f' if f32_inputs else 'b'}"
    smem = smem_bytes(dp, mt, stages, alias, wg)
    combine_names = {cb: f"fast_attn_combine_d{dp}_c{cb}" for cb in COMBINE_BATCHES}
    if wg:
        main = ModuleFunction(mod.get_function(name), name, smem)
        combine = {cb: ModuleFunction(mod.get_function(n), n) for cb, n in combine_names.items()}
        return main, combine, smem
    main = mod.get_function(name)
    allow_dynamic_shared_memory(main, smem)
    combine = {cb: mod.get_function(n) for cb, n in combine_names.items()}
    return main, combine, smem


# fast_attention.cu's combine instances: splits whose loads it issues at once. combine_batch(ns) picks the
# smallest that holds ns, at most the largest (H200, benchmarks/combine_ab.py, docs/reports/h200-combine-ab-v8.json:
# a batch of 8 took 5.2 us a call at 4 splits against 4.3 for the per-split loop, 3.6 against 5.9 at 16 splits).
# 16 since session v20, when a batch that holds every split became one pass (combine_body, COMBINE_ONE_PASS): 9 to 16
# splits (35B B1: 16) in one L2 latency instead of four (docs/reports/h200-v20-g-combine-ab.log).
COMBINE_BATCHES = (2, 4, 8, 16)


def combine_batch(ns: int) -> int:
    return next((cb for cb in COMBINE_BATCHES if ns <= cb), COMBINE_BATCHES[-1])


@functools.cache
def _sm_count(dev_id: int) -> int:
    return int(cp().cuda.Device(dev_id).attributes["MultiProcessorCount"])


def resident_blocks(dp: int, mt: int, f32_inputs: bool, stages: int = 2, alias: bool | None = None,
                    wg: bool = False) -> int:
    """Blocks of one kernel variant a multiprocessor holds at once: its registers (allocated per warp
    in units of 256) and its shared memory (plus the per-block reservation) against the device's.
    ``alias`` None: alias_for(dp)."""
    return _resident_blocks(dp, mt, f32_inputs, cp().cuda.Device().id, stages, alias_for(dp, alias), wg)


@functools.cache
def _resident_blocks(dp: int, mt: int, f32_inputs: bool, dev_id: int, stages: int = 2, alias: bool = False,
                     wg: bool = False) -> int:
    main, _, smem = _kernels(dp, mt, f32_inputs, stages, alias, wg)
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


def splits_for(b: int, hk: int, chunks: int, capacity: int, window: int, resident: int = 2) -> int:
    """Key splits per (b, KV head, row chunk): the context tiles a row can see at most (F is on the
    device), shared so that the grid is one wave of `resident` (or BLOCKS_PER_SM) blocks per
    multiprocessor, with at least MIN_TILES_PER_SPLIT tiles per split."""
    if SPLITS is not None:
        return max(1, int(SPLITS))
    n_ctx = min(capacity, window - 1) if window > 0 else capacity
    tiles = -(-max(n_ctx, 0) // _NT)
    per_sm = BLOCKS_PER_SM if BLOCKS_PER_SM is not None else resident
    want = per_sm * _sm_count(cp().cuda.Device().id) // max(1, b * hk * chunks)
    return max(1, min(want, tiles // max(1, MIN_TILES_PER_SPLIT)))


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
                   pdl=False):
    """ops_attention.attention's contract on the fast kernel: q [B,W,Hq,D], k/v [B,W,Hk,D] FP32 (or BF16
    bits as uint16, all three alike), caches [B,C,Hk,D] BF16 / FP16 bits, frontier [B] int64, live [B]
    int32, window S (0: full) -> (fp32 [B,W,Hq,D] or None, BF16 bits or None); rows >= live are 0.

    ``pdl``: launch both kernels with programmatic dependent launch (kernels_cu/pdl.py). Only for a
    caller whose kernel right ahead writes none of the caches, frontier and live (block_forward: after
    fb_qkv_post), since the kernel prefetches context tiles before it waits for that one."""
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
    stages, alias = stages_for(), alias_for(dp)
    wg = wg_for(dp, d, mt, bits, alias)
    _last["path"] = "fast-wgmma" if wg else "fast"
    main, combine, smem = _kernels(dp, mt, not bits, stages, alias, wg)
    ns = splits_for(b, hk, chunks, cap, window, resident_blocks(dp, mt, not bits, stages, alias, wg))
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
                                device(frontier), device(live), int(window), f32_out=False, bf16_out=True)
        return {"out": out}

    def environment(self) -> dict:
        base = getattr(super(), "environment", None)
        rec = dict(base()) if base is not None else {}
        rec["fast_attention"] = ("fast_attention.cu: mma.sync m16n8k16 (BF16 QK^T, FP16/BF16 PV, FP32 accumulation); "
                                 f"the wgmma form (WGMMA={WGMMA}, None: on for sm_90; NVRTC sm_90a) for BF16 bits at "
                                 "D 128 and 64 query rows a block: m64n64k16 QK^T and m64n128k16 PV from "
                                 "registers, 128-byte-swizzled K/V tiles, the same bits; "
                                 f"split-K over {_NT}-key tiles, one wave (SPLITS={SPLITS}, "
                                 f"BLOCKS_PER_SM={BLOCKS_PER_SM} (None: occupancy), "
                                 f"MIN_TILES_PER_SPLIT={MIN_TILES_PER_SPLIT}); K/V stages STAGES={STAGES} "
                                 "(None: 2), the first ones loaded before griddepcontrol.wait; aliased shared "
                                 f"memory ALIAS={ALIAS} (D 128 only: q rows and P scratch in K tiles, "
                                 "for 3 stages at two blocks a multiprocessor); PDL in masked_block "
                                 f"(kernels_cu/pdl.py, active={_pdl_active()}); exact fallback for D % 8 or D > "
                                 f"{_MAX_D} or W > {_MAX_W}")
        return rec
