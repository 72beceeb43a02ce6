"""Cases for draft_attention: window edges (distance S-1 kept, S dropped), short and long context,
ring wrap, live extents, W from 2 to 16, GQA ratios, positions past 2^31 and 2^32.

Unpopulated ring slots hold large finite garbage: an implementation that reads one is far off,
while a correct one (P = 0 there) is untouched. Values are drawn in float64 and rounded once.
"""

from __future__ import annotations

import numpy as np

from conformance.registry import BF16_CHAIN, REPRESENTED, Case, OpSpec, Output, case_rng, register
from reference import scales
from reference.draft_attention import draft_attention, key_positions
from reference.numerics import storage

GARBAGE = 64.0


def bf16(rng, shape, scale=1.0) -> np.ndarray:
    return storage(rng.standard_normal(shape) * scale, "bf16")


def positive(rng, shape) -> np.ndarray:
    """Values in about [0.2, 5]: a convex mix of them stays away from 0, so an output's ULP error is
    a relative error and the baseline's max-ULP bound stays a few ULPs (mean-zero V would put some
    outputs near 0 where any absolute error is thousands of ULPs)."""
    return np.exp(0.5 * rng.standard_normal(shape))


def ring(rng, frontier, capacity: int, hk: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    """K (bf16) and V (fp16 holding BF16 values, as context_kv stores them) rings [B, C, Hk, D]."""
    b = len(frontier)
    _, present = key_positions(frontier, np.zeros(b), capacity, 0)
    k = rng.standard_normal((b, capacity, hk, d))
    v = positive(rng, (b, capacity, hk, d))
    gone = ~present[:, :, None, None]
    k = np.where(gone, GARBAGE * np.sign(k), k)
    v = np.where(gone, GARBAGE * 4 * v, v)
    return storage(k, "bf16"), storage(storage(v, "bf16").astype(np.float64), "fp16")


def row_mask(live, shape) -> np.ndarray:
    """Rows i < live[b] of a [B, W, ...] output."""
    rows = np.arange(shape[1])[None, :] < np.asarray(live)[:, None]
    return np.broadcast_to(rows.reshape(rows.shape + (1,) * (len(shape) - 2)), shape).copy()


def make(cid, flags, *, window, capacity, frontier, live, width, hq=4, hk=2, d=16, q_scale=1.5) -> Case:
    rng = case_rng(cid)
    b = len(frontier)
    frontier = np.asarray(frontier, dtype=np.int64)
    # q . k / sqrt(D) ~ N(0, q_scale^2): softmax neither uniform nor one-hot, so each key matters
    q = bf16(rng, (b, width, hq, d), q_scale)
    k, v = bf16(rng, (b, width, hk, d)), storage(positive(rng, (b, width, hk, d)), "bf16")
    k_cache, v_cache = ring(rng, frontier, capacity, hk, d)
    inputs = {"q": q, "k": k, "v": v, "k_cache": k_cache, "v_cache": v_cache, "frontier": frontier,
              "live": np.asarray(live, dtype=np.int32)}
    return Case(
        id=cid, inputs=inputs, params={"window": int(window)}, flags=tuple(flags),
        masks={"out": row_mask(live, q.shape)},
    )


def _local_sweep() -> list[Case]:
    out = []
    widths = iter([2, 16, 5, 8, 3, 11, 4, 16, 7, 9, 6, 13, 2, 10, 16])
    for s in (4, 8, 16):
        for f, what in ((s // 2, "F_lt_S"), (s - 1, "F_S-1"), (s, "F_S"), (s + 1, "F_S+1"), (5 * s + 3, "F_gg_S")):
            w = next(widths)
            flags = ["mask_boundary"] if abs(f - s) <= 1 else []
            if f > s:
                flags.append("ring_wrap")
            cid = f"draft_attention/local_S{s}_{what}_F{f}_W{w}"
            out.append(make(cid, flags, window=s, capacity=s, frontier=[f], live=[w], width=w))
    return out


def generate() -> list[Case]:
    c = _local_sweep()
    c += [
        make("draft_attention/window_le_S__local_S3_F2_W4", ["window_le_S", "mask_boundary"],
             window=3, capacity=3, frontier=[2], live=[4], width=4),
        make("draft_attention/window_le_S__local_S8_F7_W16_dist_S-1", ["window_le_S", "mask_boundary"],
             window=8, capacity=8, frontier=[7], live=[16], width=16),
        make("draft_attention/window_le_S__local_S4_F42_W8", ["window_le_S", "mask_boundary", "ring_wrap"],
             window=4, capacity=4, frontier=[42], live=[8], width=8),
        make("draft_attention/causal_draft_attention__local_S16_F20_W8", ["causal_draft_attention"],
             window=16, capacity=16, frontier=[20], live=[8], width=8),
        make("draft_attention/causal_draft_attention__full_F5_W16", ["causal_draft_attention"],
             window=0, capacity=8, frontier=[5], live=[16], width=16),
        make("draft_attention/tail_extent__local_S8_F30_W16_live5", ["tail_extent", "ring_wrap"],
             window=8, capacity=8, frontier=[30], live=[5], width=16),
        make("draft_attention/tail_extent__local_S8_F30_W16_live1", ["tail_extent", "ring_wrap"],
             window=8, capacity=8, frontier=[30], live=[1], width=16),
        make("draft_attention/tail_extent__full_F9_W8_live3", ["tail_extent"],
             window=0, capacity=16, frontier=[9], live=[3], width=8),
        make("draft_attention/batch3__local_S8_F3_17_40_W8_live2_8_5", ["tail_extent", "ring_wrap"],
             window=8, capacity=8, frontier=[3, 17, 40], live=[2, 8, 5], width=8),
        make("draft_attention/full_F1_W2", [], window=0, capacity=4, frontier=[1], live=[2], width=2),
        make("draft_attention/full_F12_W8_C16", [], window=0, capacity=16, frontier=[12], live=[8], width=8),
        make("draft_attention/full_F64_W16_C64", [], window=0, capacity=64, frontier=[64], live=[16], width=16),
        make("draft_attention/full_batch2_F20_33_W4_C40", ["tail_extent"],
             window=0, capacity=40, frontier=[20, 33], live=[4, 2], width=4),
        make("draft_attention/local_S4_C12_F30_W4_ring_wider_than_window", ["ring_wrap", "mask_boundary"],
             window=4, capacity=12, frontier=[30], live=[4], width=4),
        make("draft_attention/gqa_Hq8_Hk2_D32_local_S8_F19_W6", ["ring_wrap"],
             window=8, capacity=8, frontier=[19], live=[6], width=6, hq=8, hk=2, d=32),
        make("draft_attention/gqa_Hq4_Hk1_D16_local_S8_F11_W12", ["ring_wrap"],
             window=8, capacity=8, frontier=[11], live=[12], width=12, hq=4, hk=1),
        # enough compared elements (2 x 8 x 8 x 32) for the bias check (C2 v2) to see a truncating store
        make("draft_attention/bf16_truncation__gqa_Hq8_Hk2_D32_full_F24_W8_B2", ["bf16_truncation"],
             window=0, capacity=24, frontier=[24, 24], live=[8, 8], width=8, hq=8, hk=2, d=32),
        make("draft_attention/mha_Hq2_Hk2_D32_full_F6_W5", [],
             window=0, capacity=8, frontier=[6], live=[5], width=5, hq=2, hk=2, d=32),
        make("draft_attention/positions_2p31__local_S8_F2147483645_W4", ["positions_2p31", "ring_wrap"],
             window=8, capacity=8, frontier=[2**31 - 3], live=[4], width=4),
        make("draft_attention/positions_2p32__local_S8_F4294967294_W6", ["positions_2p32", "ring_wrap"],
             window=8, capacity=8, frontier=[2**32 - 2], live=[6], width=6),
        make("draft_attention/positions_2p31__local_S8_F2147483653_W4_context_crosses", ["positions_2p31", "ring_wrap"],
             window=8, capacity=8, frontier=[2**31 + 5], live=[4], width=4),
        make("draft_attention/full_F0_W4_no_context", [], window=0, capacity=4, frontier=[0], live=[4],
             width=4),
        make("draft_attention/local_S4_F0_W8_no_context", ["mask_boundary"], window=4, capacity=4, frontier=[0],
             live=[8], width=8),
        _v_overflow_outside_window(),
        # the pitfall table "More bugs that shipped" and the GQA head mapping
        make("draft_attention/left_only_window__local_S4_F10_W12", ["left_only_window", "ring_wrap"],
             window=4, capacity=4, frontier=[10], live=[12], width=12),
        # block < window < prefix: rows windowed from the block's last position lose up to W - 1 keys
        make("draft_attention/decode_rows_shared_length__local_S12_F40_W6_C12", ["decode_rows_shared_length",
             "ring_wrap"], window=12, capacity=12, frontier=[40], live=[6], width=6),
        make("draft_attention/window_dropped__local_S4_C16_F30_W4", ["window_dropped", "ring_wrap"],
             window=4, capacity=16, frontier=[30], live=[4], width=4),
        make("draft_attention/gqa_head_mapping__Hq8_Hk2_D16_full_F9_W5", ["gqa_head_mapping"],
             window=0, capacity=12, frontier=[9], live=[5], width=5, hq=8, hk=2),
        make("draft_attention/gqa_head_mapping__Hq6_Hk3_D16_local_S8_F13_W4", ["gqa_head_mapping", "ring_wrap"],
             window=8, capacity=8, frontier=[13], live=[4], width=4, hq=6, hk=3),
        # the window family's reader: every slot populated, so a slot read one off either way is another key
        make("draft_attention/ring_read_slot__local_S8_C8_F21_W6", ["ring_read_slot", "ring_wrap"],
             window=8, capacity=8, frontier=[21], live=[6], width=6),
        _store_ties(),
    ]
    return c


def _store_ties() -> Case:
    """The rounding family at the output store. q = 0, so both keys the live query sees (window 2: the
    context key at F - 1 and its own row; block row 1 is past the live extent) weigh exactly 1/2 and out = (v_ctx + v_blk) / 2 is exact in FP32: an
    exact BF16 tie whose lower neighbour is even, in every element. Rows 0-3: v_ctx = s (1 + 2j/128),
    v_blk = s 2^-8; row 4: v_ctx = s 2^12, v_blk = s 2^20, an output near 2^19, past FP16's range.
    Round-to-nearest-even keeps the lower neighbour; rounding half away from zero moves every element
    one quantum outwards (the bias check); an FP16 staging store overflows row 4."""
    cid = "draft_attention/store_rounding__exact_ties_and_2p19_S2_C4_F10_W2_live1"
    rng = case_rng(cid)
    b, hq, d, cap, f = 5, 4, 16, 4, 10
    case = make(cid, ["store_rounding"], window=2, capacity=cap, frontier=[f] * b, live=[1] * b, width=2, hq=hq,
                hk=hq, d=d)
    sign = rng.choice([-1.0, 1.0], (b, hq, d))
    v_ctx = sign * (1.0 + 2.0 * rng.integers(0, 32, (b, hq, d)) / 128.0)
    v_blk = sign * 2.0**-8
    v_ctx[-1], v_blk = sign[-1] * 2.0**12, np.broadcast_to(v_blk, (b, hq, d)).copy()
    v_blk[-1] = sign[-1] * 2.0**20
    v_cache = np.array(case.inputs["v_cache"])
    v_cache[:, (f - 1) % cap] = v_ctx.astype(np.float16)
    v = np.array(case.inputs["v"])
    v[:, 0] = storage(v_blk, "bf16")
    inputs = {**case.inputs, "q": np.zeros_like(case.inputs["q"]), "v": v, "v_cache": v_cache}
    return Case(cid, inputs, case.params, case.flags, case.masks)


def _v_overflow_outside_window() -> Case:
    """Context V that overflowed to +-inf in FP16 (kept, C1) at populated positions that no query
    may attend (distance >= S): a kernel that multiplies a zero weight by them returns NaN."""
    f, s, cap = 30, 4, 12
    case = make("draft_attention/fp16_overflow__v_inf_outside_window_S4_C12_F30_W4", ["fp16_overflow", "mask_boundary"],
                window=s, capacity=cap, frontier=[f], live=[4], width=4)
    v = np.array(case.inputs["v_cache"])
    for p in range(f - cap, f - s + 1):  # query rows sit at f..f+3, so every one of these is >= S away
        v[0, p % cap] = np.where(np.arange(v.shape[-1]) % 2, np.inf, -np.inf).astype(np.float16)
    return Case(case.id, {**case.inputs, "v_cache": v}, case.params, case.flags, case.masks)


SPEC = register(
    OpSpec(
        name="draft_attention",
        reference=draft_attention,
        inputs=("q", "k", "v", "k_cache", "v_cache", "frontier", "live"),
        params=("window",),
        outputs=(Output("out", REPRESENTED, "bf16"),),
        generate=generate,
        envelope={"out": BF16_CHAIN},
        scales=scales.draft_attention,
        bf16_intermediates=frozenset({"probs"}),
        doc="non-causal draft attention over the context ring and the live block rows (local |dp| < S, or full)",
    )
)
