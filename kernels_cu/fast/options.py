"""The fast mode's tunables: one frozen ``FastOptions`` (``DEFAULT_OPTIONS`` is what the fast mode runs).

A backend, a round and their engines take ``options=`` (default ``DEFAULT_OPTIONS``) and read every choice from it,
never from module state, so that two objects with different options can live in one process and a test states the
choice it exercises. Each field selects between live paths of the default build (both sides run somewhere by
default, or both give the same bits and a test compares them) or sizes a launch; the values are the H200's best
measured (docs/performance.md has the measurements).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

# (weight rows N, K) -> K slices of the block's GEMMs at up to ``split_max_m`` rows (a strided-batched GEMM over the
# slices, the fp32 partials summed in slice order by the consumer kernel): the conv delta and down / o projections
# where splitting measured faster on the H200; any other shape runs one GEMM.
_GEMM_SPLITS = (((1280, 5120), 4), ((5120, 17408), 2), ((2048, 4096), 2), ((2048, 6144), 2))


@dataclass(frozen=True)
class FastOptions:
    # --- split top-k (kernels_cu/fast/topk.cu) ---
    topk_vec: bool = True  # fast_topk_partial_vec where it applies (k <= 32, no shortlist, 16-byte rows): faster loads
    topk_bound: bool = True  # ... with fast_topk_bound's per-row bound: fewer keys reach the lists
    topk_merge_warp: bool = True  # fast_topk_merge_warp for k <= 32 (a list a warp) instead of per-thread lists
    topk_merge_in_block_max_rows: int = 32  # the warp kernels merge their 8 lists in the block up to this many rows
    topk_merge_min_k: int = 2  # ... and from this k (at k 1 the merge costs more than it saves)

    # --- the fused head (kernels_cu/fast/head.cu: the head GEMM with the top-k in its epilogue) ---
    fused_head: bool = True  # candidate_topk / proposal_head take it where it applies; False: cuBLAS GEMM + top-k
    fused_head_max_rows_topk: int = 128  # candidate_topk's hidden rows up to which it is faster than the GEMM path
    fused_head_max_rows_proposal: int = 128  # proposal_head's likewise
    head_pingpong: bool = True  # the ping-pong kernel (selection under the other warpgroup's stream); False: one tile
    head_warp_form_max_rows: int = 8  # a warp a hidden row up to this many rows (its seed is cheaper), a lane above

    # --- head GEMM on a timed cuBLASLt algorithm (kernels_cu/fast/lt.py) ---
    proposal_head_lt: bool = True  # proposal_head's GEMM (heads >= lt.MIN_BYTES): the fastest of gemmEx and cuBLASLt
    round_head_lt: bool = True  # FastRound's head GEMM likewise (False: gemmEx, bits reproducible across processes)

    # --- target_distribution (kernels_cu/fast/target_distribution.cu) ---
    target_split_max_rows: int = 63  # rows up to which each row is split over many blocks (more rows fill the GPU)

    # --- draft_attention (kernels_cu/fast/attention.cu) ---
    attention_splits: int | None = None  # key splits; None: one wave of blocks (at least min_tiles_per_split each)
    attention_blocks_per_sm: int | None = None  # blocks a multiprocessor the wave counts; None: the occupancy query
    attention_min_tiles_per_split: int = 4  # context tiles a split takes at least (fewer: the combine costs more)
    attention_stages: int = 2  # K/V pipeline stages (2..4, the same bits; 2 keeps two blocks a multiprocessor)
    attention_wgmma: bool | None = None  # the wgmma form at D 128 / 64 rows; None: where the GPU is sm_90

    # --- the block (kernels_cu/fast/block.py, block.cu) ---
    resid_norm_path: str = "auto"  # fb_resid_norm: "auto" (cluster kernel for few rows), "cluster", "block", "strided"
    resid_norm_cluster_max_rows: int = 32  # "auto" takes the 8-CTA cluster kernel up to this many rows
    conv_prepare_vec: bool | str = True  # fb_conv_prepare 4 columns a thread where the grid keeps >= 256 blocks;
    #                                      "always": wherever aligned; False: a column a thread (the same bits)
    gemm_splits: tuple = _GEMM_SPLITS  # ((N, K), slices) of the layer GEMMs split along K (see _GEMM_SPLITS)
    split_max_m: int = 256  # rows up to which gemm_splits applies
    early_table_max_rows: int = 16  # fb_qkv_post builds its RoPE table before its PDL wait up to this many rows

    # --- the layer GEMMs at few rows (kernels_cu/fast/gemv.cu) ---
    gemv: bool = True  # layer GEMMs of <= 16 rows on gemv.cu where its grid fits; False: cuBLAS
    gemv_act: bool = True  # the [gate; up] GEMM with SiLU-mul in its epilogue (the same bits as the two steps)
    gemv_pdl: bool = True  # launched under PDL, staging weight rows before the wait (the same bits either way)
    gemv_stage_bytes: int = 192 * 1024  # weight bytes a block stages before the wait
    gemv_max_waves: float = 2.0  # grids of more waves stay on cuBLAS (only the first wave can stage)
    gemv_min_fill: float = 0.9  # grids with blocks for fewer multiprocessors than this fraction stay on cuBLAS

    # --- FastRound (kernels_cu/fast/round.py) ---
    launch_order_min_rows: int = 64  # the graph's PDL edges relaxed to launch order from B * W rows
    exact_selector: bool = False  # the DFlash2 selector on the exact mode's select.cu kernels instead of selector.cu

    # --- per-call plans of the Ops (kernels_cu/fast/block.py OpGraph, head.py map cache) ---
    op_graphs: bool = True  # masked_block / draft_layer replay a CUDA graph of their own call per (shape, weights, rings)
    op_graph_keep: int = 8  # such graphs kept per backend object (LRU; each holds its stream and static inputs)

    def replace(self, **changes) -> FastOptions:
        """A copy with ``changes`` (the object itself is frozen)."""
        return replace(self, **changes)

    def splits_for(self, n: int, k: int) -> int:
        """gemm_splits' entry for a weight of n rows and k columns (1: not split)."""
        return dict(self.gemm_splits).get((n, k), 1)

    def describe(self) -> dict:
        """The options as a report records them."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


DEFAULT_OPTIONS = FastOptions()
