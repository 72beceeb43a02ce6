"""Cases for masked_block: both official geometries at reduced width (Hq/Hk = 4, 2 layers; DFlash one
local + one full layer, DFlash2 two local layers with convolutions), K from 1 to 15, P < K tails,
and the two pitfalls: the anchor column filled with MASK (anchor_as_mask) and DFlash2 computing only
the verifiable prefix (dflash2_all_columns).

Intermediate widths keep the official ratios (3 H for DFlash, 3.4 H for DFlash2) in the two
official_reduced cases and are 128 elsewhere, to stay inside the vector budget.

The anchor's embedding row is unrelated to MASK's (independent draws, anchor at 3x the scale), so
every mask column sees a different block when the anchor is replaced. All layers share one ring
capacity C; a full layer needs C >= F, so mixed stacks use C >= F with the local window S < C.
"""

from __future__ import annotations

import numpy as np

from conformance.cases.draft_attention import ring
from conformance.cases.draft_layer import EPS, THETA, layer_weights
from conformance.registry import BF16_CONV_CHAIN, REPRESENTED, Case, OpSpec, Output, case_rng, register
from reference import scales
from reference.masked_block import BF16_INTERMEDIATES, CONV_WEIGHTS, LAYER_WEIGHTS, masked_block
from reference.numerics import storage

VOCAB_ROWS = 64


def make(cid, flags, *, variant, windows, capacity, frontier, live, num_drafts, h=64, hq=4, hk=1, d=16,
         inter=128) -> Case:
    rng = case_rng(cid)
    frontier = np.asarray(frontier, dtype=np.int64)
    b, layers = len(frontier), len(windows)
    mask_id = int(rng.integers(VOCAB_ROWS))
    anchor = rng.choice(np.setdiff1d(np.arange(VOCAB_ROWS), [mask_id]), b)
    embed = rng.standard_normal((VOCAB_ROWS, h))
    embed[anchor] *= 3.0
    rings = [ring(rng, frontier, capacity, hk, d) for _ in range(layers)]
    inputs = dict(
        anchor=anchor.astype(np.int32), embed=storage(embed, "bf16"), frontier=frontier,
        live=np.asarray(live, dtype=np.int32),
        context_k=np.stack([k for k, _ in rings]), context_v=np.stack([v for _, v in rings]),
        **layer_weights(rng, h=h, hq=hq, hk=hk, d=d, inter=inter, variant=variant, lead=(layers,)),
        final_norm=storage(rng.uniform(0.5, 1.5, h), "bf16"),
    )
    params = {"mask_token_id": mask_id, "windows": [int(w) for w in windows], "eps": EPS, "theta": THETA,
              "head_dim": d, "variant": variant, "num_drafts": int(num_drafts)}
    cols = np.arange(1, num_drafts + 1)[None, :] < np.asarray(live)[:, None]  # mask column i is block column i+1
    mask = np.broadcast_to(cols[:, :, None], (b, num_drafts, h)).copy()
    return Case(id=cid, inputs=inputs, params=params, flags=tuple(flags), masks={"hidden": mask})


def generate() -> list[Case]:
    return [
        make("masked_block/dflash_official_reduced_H64_L2_local_full_S8_F20_11_K15_live16_6", ["tail_extent"],
             variant="dflash", windows=[8, 0], capacity=24, frontier=[20, 11], live=[16, 6], num_drafts=15,
             inter=192),
        make("masked_block/dflash2_official_reduced_H80_L2_local_S8_F30_K15", ["ring_wrap"], variant="dflash2",
             windows=[8, 8], capacity=8, frontier=[30], live=[16], num_drafts=15, h=80, inter=272),
        make("masked_block/anchor_as_mask__dflash_H64_L2_local_full_S8_F20_K7", ["anchor_as_mask"],
             variant="dflash", windows=[8, 0], capacity=24, frontier=[20], live=[8], num_drafts=7),
        make("masked_block/anchor_as_mask__dflash2_H64_L2_local_S8_F13_K5", ["anchor_as_mask", "ring_wrap"],
             variant="dflash2", windows=[8, 8], capacity=8, frontier=[13], live=[6], num_drafts=5),
        # DFlash2 attends all W columns by the spec: its tail bug is dflash2_all_columns, not tail_extent
        make("masked_block/dflash2_all_columns__H64_L2_local_S8_F25_K15_live4", ["dflash2_all_columns",
             "ring_wrap"], variant="dflash2", windows=[8, 8], capacity=8, frontier=[25], live=[4],
             num_drafts=15),
        make("masked_block/dflash2_all_columns__batch2_H64_L2_local_S16_F9_40_K11_live2_9",
             ["dflash2_all_columns", "ring_wrap"], variant="dflash2", windows=[16, 16], capacity=16,
             frontier=[9, 40], live=[2, 9], num_drafts=11),
        make("masked_block/window_le_S__dflash2_H64_L2_local_S8_C16_F30_K7", ["window_le_S", "mask_boundary"],
             variant="dflash2", windows=[8, 8], capacity=16, frontier=[30], live=[8], num_drafts=7),
        make("masked_block/tail_extent__dflash_H64_L2_local_S8_F17_K15_live2", ["tail_extent", "ring_wrap"],
             variant="dflash", windows=[8, 8], capacity=8, frontier=[17], live=[2], num_drafts=15),
        make("masked_block/dflash_H64_L2_full_full_F5_K1", [], variant="dflash", windows=[0, 0], capacity=8,
             frontier=[5], live=[2], num_drafts=1),
        make("masked_block/dflash_H64_L2_local_S4_F3_K3", ["mask_boundary"], variant="dflash", windows=[4, 4],
             capacity=4, frontier=[3], live=[4], num_drafts=3),
        make("masked_block/dflash2_H64_L2_local_S4_F6_K1", ["ring_wrap"], variant="dflash2", windows=[4, 4],
             capacity=4, frontier=[6], live=[2], num_drafts=1),
        make("masked_block/dflash_H128_Hq4_Hk1_D32_L2_local_full_S8_F12_K7", [], variant="dflash", windows=[8, 0],
             capacity=16, frontier=[12], live=[8], num_drafts=7, h=128, d=32),
        # several KV heads (GQA 4:2 and 6:3), the head mapping and the RoPE layout named
        make("masked_block/gqa_head_mapping__dflash_Hq4_Hk2_H64_L2_local_full_S8_F19_K7", ["gqa_head_mapping",
             "tail_extent"], variant="dflash", windows=[8, 0], capacity=24, frontier=[19], live=[5], num_drafts=7,
             hk=2, inter=64),
        make("masked_block/gqa_head_mapping__dflash2_Hq6_Hk3_H48_L2_local_S8_F21_K5", ["gqa_head_mapping",
             "ring_wrap"], variant="dflash2", windows=[8, 8], capacity=8, frontier=[21], live=[6], num_drafts=5,
             h=48, hq=6, hk=3, inter=64),
        make("masked_block/rope_interleaved__dflash2_Hq4_Hk2_H64_L2_local_S8_F27_K7", ["rope_interleaved",
             "ring_wrap"], variant="dflash2", windows=[8, 8], capacity=8, frontier=[27], live=[8], num_drafts=7, hk=2,
             inter=64),
        make("masked_block/positions_2p32__dflash2_H64_L2_local_S8_F4294967294_K7", ["positions_2p32", "ring_wrap"],
             variant="dflash2", windows=[8, 8], capacity=8, frontier=[2**32 - 2], live=[8], num_drafts=7),
    ]


SPEC = register(
    OpSpec(
        name="masked_block",
        reference=masked_block,
        inputs=("anchor", "embed", "frontier", "live", "context_k", "context_v") + LAYER_WEIGHTS + ("final_norm",)
        + CONV_WEIGHTS,
        params=("mask_token_id", "windows", "eps", "theta", "head_dim", "variant", "num_drafts"),
        outputs=(Output("hidden", REPRESENTED, "bf16"),),
        generate=generate,
        envelope={"hidden": BF16_CONV_CHAIN},  # DFlash2 layers hold the conv
        scales=scales.masked_block,
        bf16_intermediates=BF16_INTERMEDIATES,
        doc="one masked draft block: embed [anchor, MASK x K] at F..F+K, every layer, final RMSNorm, mask columns",
    )
)
