"""Cases for draft_layer: DFlash local and full layers, DFlash2 layers with both grouped convolutions,
live extents, GQA ratios of the official geometries (Hq/Hk = 4) at reduced width, positions past
2^31 and 2^32 (RoPE from exact integer positions).

Weights are scaled so every activation stays O(1) (projections ~ N(0, 1/fan_in)); conv taps are
near identity with O(0.1) dynamic deltas, so the convolution visibly mixes neighbouring columns.
"""

from __future__ import annotations

import numpy as np

from conformance.cases.draft_attention import ring, row_mask
from conformance.registry import BF16_CONV_CHAIN, REPRESENTED, Case, OpSpec, Output, case_rng, register
from reference import scales
from reference.draft_layer import BF16_INTERMEDIATES, draft_layer
from reference.numerics import storage

EPS, THETA = 1e-6, 1e7
CONV = ("attn_conv_base", "mlp_conv_base", "attn_conv_proj", "mlp_conv_proj")


def layer_weights(rng, *, h, hq, hk, d, inter, variant, lead=()) -> dict[str, np.ndarray]:
    """draft_layer's weights in storage dtype; ``lead`` prepends axes (masked_block stacks layers)."""

    def gauss(*shape, fan_in):
        return storage(rng.standard_normal(lead + shape) / np.sqrt(fan_in), "bf16")

    def gain(n):
        return storage(rng.uniform(0.5, 1.5, lead + (n,)), "bf16")

    w = {
        "input_norm": gain(h), "wq": gauss(hq * d, h, fan_in=h), "wk": gauss(hk * d, h, fan_in=h),
        "wv": gauss(hk * d, h, fan_in=h), "q_norm": gain(d), "k_norm": gain(d), "wo": gauss(h, hq * d, fan_in=hq * d),
        "post_norm": gain(h), "w_gate": gauss(inter, h, fan_in=h), "w_up": gauss(inter, h, fan_in=h),
        "w_down": gauss(h, inter, fan_in=inter),
    }
    if variant == "dflash2":
        g = h // 16
        for side in ("attn", "mlp"):
            base = np.empty(lead + (2, 2, h))
            base[..., 0, :] = 1.0 + 0.2 * rng.standard_normal(lead + (2, h))  # current column
            base[..., 1, :] = 0.5 * rng.standard_normal(lead + (2, h))  # preceding column
            w[f"{side}_conv_base"] = storage(base, "bf16")
            w[f"{side}_conv_proj"] = storage(0.2 * rng.standard_normal(lead + (4 * g, h)) / np.sqrt(h), "bf16")
    return w


def make(cid, flags, *, variant="dflash", window, capacity, frontier, live, width, h=64, hq=4, hk=1, d=16,
         inter=128, row_scale=None) -> Case:
    rng = case_rng(cid)
    frontier = np.asarray(frontier, dtype=np.int64)
    b = len(frontier)
    k_cache, v_cache = ring(rng, frontier, capacity, hk, d)
    x = rng.standard_normal((b, width, h))
    if row_scale is not None:  # columns of tiny RMS: the norm's eps matters, or dominates
        x = x * np.asarray(row_scale, dtype=np.float64)[None, :, None]
    inputs = dict(
        x=storage(x, "bf16"), k_cache=k_cache, v_cache=v_cache,
        frontier=frontier, live=np.asarray(live, dtype=np.int32),
        **layer_weights(rng, h=h, hq=hq, hk=hk, d=d, inter=inter, variant=variant),
    )
    params = {"eps": EPS, "theta": THETA, "head_dim": d, "window": int(window), "variant": variant}
    return Case(id=cid, inputs=inputs, params=params, flags=tuple(flags),
                masks={"x_next": row_mask(live, (b, width, h))})


def generate() -> list[Case]:
    p31, p32 = 2**31 - 3, 2**32 - 2
    return [
        make("draft_layer/dflash_local_S8_F20_W8", ["ring_wrap"], window=8, capacity=8, frontier=[20], live=[8],
             width=8),
        make("draft_layer/dflash_local_S4_F3_W4_short_context", ["mask_boundary"], window=4, capacity=4,
             frontier=[3], live=[4], width=4),
        make("draft_layer/dflash_local_S16_F16_W16", ["mask_boundary"], window=16, capacity=16, frontier=[16],
             live=[16], width=16),
        make("draft_layer/dflash_full_F12_W16_C16", [], window=0, capacity=16, frontier=[12], live=[16], width=16),
        make("draft_layer/dflash_full_F1_W2", [], window=0, capacity=4, frontier=[1], live=[2], width=2),
        make("draft_layer/tail_extent__dflash_local_S8_F30_W8_live3", ["tail_extent", "ring_wrap"], window=8,
             capacity=8, frontier=[30], live=[3], width=8),
        # F = 43: the live interval starts at 35, not a multiple of C, so a read without mod C differs
        make("draft_layer/tail_extent__dflash_batch2_F5_43_W8_live8_4", ["tail_extent", "ring_wrap"], window=8,
             capacity=8, frontier=[5, 43], live=[8, 4], width=8),
        make("draft_layer/tiny_rms_rows__dflash_local_S8_F12_W5", [], window=8, capacity=8, frontier=[12], live=[5],
             width=5, row_scale=[1.0, 1e-2, 1e-3, 3e-4, 1e-5]),
        make("draft_layer/tiny_rms_rows__dflash2_full_F6_W4", [], variant="dflash2", window=0, capacity=8,
             frontier=[6], live=[4], width=4, row_scale=[1e-3, 1.0, 1e-5, 2e-4]),
        make("draft_layer/rope_interleaved__dflash_local_S8_F21_W6", ["rope_interleaved", "ring_wrap"], window=8,
             capacity=8, frontier=[21], live=[6], width=6),
        make("draft_layer/gqa_head_mapping__dflash_Hq8_Hk2_D16_H64_local_S8_F11_W5", ["gqa_head_mapping", "ring_wrap"],
             window=8, capacity=8, frontier=[11], live=[5], width=5, h=64, hq=8, hk=2, inter=64),
        make("draft_layer/gqa_head_mapping__dflash2_Hq6_Hk3_D16_H48_full_F7_W4", ["gqa_head_mapping"],
             variant="dflash2", window=0, capacity=8, frontier=[7], live=[4], width=4, h=48, hq=6, hk=3, inter=64),
        make("draft_layer/dflash_Hq8_Hk2_D16_H128_I192_local_S8_F13_W6", ["ring_wrap"], window=8, capacity=8,
             frontier=[13], live=[6], width=6, h=128, hq=8, hk=2, inter=192),
        make("draft_layer/dflash_Hq4_Hk1_D32_H96_full_F9_W5", [], window=0, capacity=12, frontier=[9], live=[5],
             width=5, h=96, d=32, inter=160),
        # a ring larger than the window holds keys at distance S and beyond: only |dp| < S may be attended
        make("draft_layer/window_le_S__dflash_local_S8_C16_F20_W8", ["window_le_S", "mask_boundary"], window=8,
             capacity=16, frontier=[20], live=[8], width=8),
        make("draft_layer/window_le_S__dflash2_local_S4_C12_F15_W6", ["window_le_S", "mask_boundary"],
             variant="dflash2", window=4, capacity=12, frontier=[15], live=[6], width=6),
        make("draft_layer/causal_draft_attention__dflash_full_F6_W8", ["causal_draft_attention"], window=0,
             capacity=8, frontier=[6], live=[8], width=8),
        make("draft_layer/positions_2p31__dflash_local_S8_F2147483653_W4", ["positions_2p31", "ring_wrap"],
             window=8, capacity=8, frontier=[p31 + 8], live=[4], width=4),
        make("draft_layer/positions_2p32__dflash_local_S8_F4294967294_W6", ["positions_2p32", "ring_wrap"],
             window=8, capacity=8, frontier=[p32], live=[6], width=6),
        make("draft_layer/dflash2_local_S8_F30_W16", ["ring_wrap"], variant="dflash2", window=8, capacity=8,
             frontier=[30], live=[16], width=16),
        make("draft_layer/dflash2_local_S16_F9_W4_short_context", [], variant="dflash2", window=16, capacity=16,
             frontier=[9], live=[4], width=4),
        make("draft_layer/dflash2_local_S4_F4_W2", ["mask_boundary"], variant="dflash2", window=4, capacity=4,
             frontier=[4], live=[2], width=2),
        make("draft_layer/dflash2_batch2_H128_Hq8_Hk2_local_S8_F11_50_W8", ["ring_wrap"], variant="dflash2",
             window=8, capacity=8, frontier=[11, 50], live=[8, 8], width=8, h=128, hq=8, hk=2, inter=224),
        make("draft_layer/dflash2_H32_G2_local_S8_F3_W3", [], variant="dflash2", window=8, capacity=8,
             frontier=[3], live=[3], width=3, h=32, inter=96),
    ]


SPEC = register(
    OpSpec(
        name="draft_layer",
        reference=draft_layer,
        inputs=("x", "k_cache", "v_cache", "frontier", "live", "input_norm", "wq", "wk", "wv", "q_norm", "k_norm",
                "wo", "post_norm", "w_gate", "w_up", "w_down") + CONV,
        params=("eps", "theta", "head_dim", "window", "variant"),
        outputs=(Output("x_next", REPRESENTED, "bf16"),),
        generate=generate,
        envelope={"x_next": BF16_CONV_CHAIN},  # DFlash2 layers hold the conv
        scales=scales.draft_layer,
        bf16_intermediates=BF16_INTERMEDIATES,
        doc="one DFlash / DFlash2 draft layer: norm, Q/K head norm + RoPE, non-causal attention, SiLU MLP (+ conv)",
    )
)
