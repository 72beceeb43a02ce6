"""Cases for feature_capture: recorded (unsorted) id order, id 0 and the last block, the official
id lists at reduced width, and an eps-dominated row.

Every block output has its own scale, growing with depth as a residual stream does (the last block's
RMS is far from 1): reading boundary l+1 instead of block l, or taking the last block after a final
RMSNorm, changes every context row by far more than the baseline's error.
"""

from __future__ import annotations

import numpy as np

from conformance.registry import BF16_CHAIN, REPRESENTED, Case, OpSpec, Output, case_rng, register
from reference import scales
from reference.feature_capture import feature_capture
from reference.numerics import storage

EPS = 1e-6
DFLASH_IDS = [1, 6, 11, 16, 22, 27, 32, 37]
DFLASH2_IDS = [5, 19, 33, 47, 61]


def make(cid, flags, *, ids, blocks, rows, ht=16, h=64, eps=EPS, row_scale=None, norm_range=(0.5, 1.5)) -> Case:
    rng = case_rng(cid)
    scale = 2.0 ** (np.arange(blocks) / 4.0)[:, None, None]  # RMS 1 at block 0 up to ~2^(L/4)
    r = rng.standard_normal((blocks, rows, ht)) * scale + rng.standard_normal((blocks, 1, ht)) * scale
    if row_scale is not None:
        r = r * np.asarray(row_scale)[None, :, None]
    n = len(ids)
    fc = rng.standard_normal((h, n * ht)) / np.sqrt(n * ht)
    inputs = {
        "block_outputs": storage(r, "bf16"),
        "fc_weight": storage(fc, "bf16"),
        "hidden_norm": storage(rng.uniform(*norm_range, h), "bf16"),
    }
    return Case(id=cid, inputs=inputs, params={"target_layer_ids": list(ids), "eps": eps}, flags=tuple(flags))


def generate() -> list[Case]:
    return [
        make("feature_capture/ids_1_3_5_of_8_T4", [], ids=[1, 3, 5], blocks=8, rows=4),
        make("feature_capture/unsorted_ids_5_1_3_of_8_T4", [], ids=[5, 1, 3], blocks=8, rows=4, ht=32),
        make("feature_capture/unsorted_ids_6_0_2_of_7_T3_H32", [], ids=[6, 0, 2], blocks=7, rows=3, h=32),
        make("feature_capture/single_id_2_of_4_T1_H16", [], ids=[2], blocks=4, rows=1, h=16),
        make("feature_capture/ids_2_0_of_3_T17_Ht64_H128", [], ids=[2, 0], blocks=3, rows=17, ht=64, h=128),
        make("feature_capture/last_block_final_norm__id0_and_last_ids_0_7_of_8_T5", ["last_block_final_norm"],
             ids=[0, 7], blocks=8, rows=5),
        make("feature_capture/last_block_final_norm__ids_1_3_5_of_6_T4", ["last_block_final_norm"],
             ids=[1, 3, 5], blocks=6, rows=4),
        make("feature_capture/last_block_final_norm__unsorted_ids_9_2_of_10_T3", ["last_block_final_norm"],
             ids=[9, 2], blocks=10, rows=3, ht=32, h=96),
        make("feature_capture/boundary_index__dflash_ids_of_40_T3", ["boundary_index"], ids=DFLASH_IDS,
             blocks=40, rows=3),
        make("feature_capture/boundary_index__dflash2_ids_of_64_T2_H32", ["boundary_index"], ids=DFLASH2_IDS,
             blocks=64, rows=2, h=32),
        make("feature_capture/boundary_index__unsorted_ids_4_0_2_of_6_T6", ["boundary_index"], ids=[4, 0, 2],
             blocks=6, rows=6, ht=32),
        # convention: id l is block l's output; a capture at each block's input reads block l - 1 and never the last
        make("feature_capture/capture_before_layer__ids_2_5_7_of_8_T4", ["capture_before_layer"], ids=[2, 5, 7],
             blocks=8, rows=4),
        make("feature_capture/eps_dominates_tiny_rows_T4", [], ids=[1, 2], blocks=3, rows=4,
             row_scale=[1.0, 1e-3, 1e-4, 1e-5]),
        make("feature_capture/eps_1e-5_ids_3_1_of_4_T8", [], ids=[3, 1], blocks=4, rows=8, eps=1e-5),
        # 32 rows: the bias check needs 16 independent rows (registry.BIAS_MIN_ROWS)
        make("feature_capture/bf16_truncation__ids_1_3_of_4_T32_H64", ["bf16_truncation"], ids=[1, 3], blocks=4,
             rows=32),
        # the norm family: rows from RMS ~1 down to eps-dominated, so a misplaced eps (outside the sqrt,
        # on the sum) and a sum for the mean move whole rows; weights spread over 0.1 .. 3 put the
        # statistics of w x far from those of x (the weight applied before the normalization)
        make("feature_capture/rmsnorm_formula__eps_1e-5_rows_1_to_1e-4_T8", ["rmsnorm_formula"], ids=[2, 1],
             blocks=3, rows=8, eps=1e-5, row_scale=[1.0, 0.5, 1e-2, 3e-3, 1e-3, 3e-4, 1e-4, 2.0],
             norm_range=(0.1, 3.0)),
        # the capture family: an unsorted list holding id 0, read in another order or one-based
        make("feature_capture/capture_layer_order__unsorted_ids_5_0_3_of_6_T4",
             ["capture_layer_order", "capture_index_base"], ids=[5, 0, 3], blocks=6, rows=4),
    ]


SPEC = register(
    OpSpec(
        name="feature_capture",
        reference=feature_capture,
        inputs=("block_outputs", "fc_weight", "hidden_norm"),
        params=("target_layer_ids", "eps"),
        outputs=(Output("context", REPRESENTED, "bf16"),),
        generate=generate,
        envelope={"context": BF16_CHAIN},
        scales=scales.feature_capture,
        bf16_intermediates=frozenset({"projected"}),
        doc="context features c_t = plain_rmsnorm(fc concat(block outputs at target block ids))",
    )
)
