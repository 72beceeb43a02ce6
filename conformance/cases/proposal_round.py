"""Cases for proposal_round (CONTRACTS C10): one whole proposal round from a tiny random checkpoint
in the published layout (conformance.checkpoint), the target's captured block outputs of the
pending rows, old context rings, anchor, frontiers, live extents, temperature and seed.

Geometry: H 32, 2 draft layers (DFlash: one local layer S = 8 then one full layer; DFlash2: two
local layers S = 8 with their convolutions, selector rank 8, top-8), 4 query / 2 KV heads of
dimension 8, 5 target blocks, 64 head rows of which 60 are public (the 4 padded rows are never
proposed). Sweeps: both drafter kinds; B from 1 to 8 with different frontiers and pending rows;
K from 1 to 15; P < K tails (live < K + 1); ring wrap (frontiers past S and C); catch-up chunks
longer than the ring; positions near 2^32; DFlash2 greedy and sampled (seeds 0, 2^32 - 1, 2^32,
2^64 - 1; temperatures 0.5 to 4) with and without output_multiplier / final_logit_softcapping.

Clear decisions: the head is the target's, so it is drawn after the draft's hidden is known:
each compared proposal column gets a head row planted on its own hidden direction (DFlash: a
winner; DFlash2: a ladder of top-k rows), and the case is redrawn until every compared decision
lies outside its ambiguity band by a factor of 2 (the band from the float32 baseline's margin error
and the decision's scale), and until a sampled DFlash2 case differs from its greedy walk.

Round-only pitfalls (conformance/mutants/proposal_round.py), each in the id of the cases that catch it:
- context_role_weights: the case gives distinct context-role projections (context_wk,
  context_wv); an engine that projects context K/V with the block's k_proj / v_proj fails.
- layer_id_origin: target_layer_ids read one block late (ids counted from the embedding
  boundary) while the config and the captured list are by block id.
- capture_before_layer: the capture taken at the layer's input (block l - 1's output).
- draft_temperature: a sampled DFlash2 round whose selector walks greedily (temperature ignored).
"""

from __future__ import annotations

import numpy as np

from conformance import checkpoint as ck
from conformance.registry import BF16_CHAIN, DECISION, FP32_OUTPUT, REPRESENTED, Case, OpSpec, Output, case_rng, \
    register
from reference import precision
from reference import proposal_round as pr
from reference import state_dict as sdm
from reference.context_kv import live_mask
from reference.numerics import storage, to_bf16

OP = "proposal_round"
H, ROWS, VOCAB, BLOCKS = 32, 64, 60, 5
GARBAGE = 1000.0
CLEAR = 2.0
SIMILAR = 0.85  # columns at least this aligned share their planted rows
LOGIT = 10.0  # the planted winner's logit
LADDER_STEP = 0.05  # DFlash2: the ladder's logit gaps are LOGIT x LADDER_STEP
CODEBOOK = 0.15  # DFlash2 codebooks scaled so that pair terms stay near the unary gaps  # every compared decision's margin exceeds CLEAR x its band


def _old_ring(rng, cap, hk, d, fctx):
    """A ring before catch-up: unit-scale values at live slots, garbage elsewhere (never read)."""
    live = live_mask(int(fctx), (cap, hk, d), "ring")
    k = np.where(live, rng.standard_normal((cap, hk, d)), GARBAGE)
    v = np.where(live, rng.standard_normal((cap, hk, d)), -GARBAGE)
    return storage(k, "bf16"), storage(to_bf16(v), "fp16")


def _record_hidden():
    seen = {}

    def record(op, inputs, outputs):
        if op == "masked_block":
            seen["hidden"] = np.asarray(outputs["hidden"], np.float64)
    return seen, record


def _plant_head(rng, hidden, compared, variant, top_k):
    """Head rows [ROWS, H]. The compared columns are clustered by direction (cosine >= SIMILAR to a
    representative: such columns propose alike); each representative gets its own planted rows
    along its hidden (DFlash: one winner; DFlash2: a ladder of top_k rows, coefficients falling by
    LADDER_STEP). The padded rows (>= VOCAB) copy planted rows at twice the scale: they would win if
    the public-vocabulary mask were missing. The rest are small random rows."""
    head = 0.3 * rng.standard_normal((ROWS, H)) / np.sqrt(H)
    cols = hidden[compared]
    units = cols / np.linalg.norm(cols, axis=-1, keepdims=True)
    reps = []
    for j in rng.permutation(len(units)):
        if all(units[j] @ units[r] < SIMILAR for r in reps):
            reps.append(j)
    free = list(rng.permutation(VOCAB))
    planted = []
    per = 1 if variant == "dflash" else top_k
    reps = reps[: VOCAB // per]
    # the dual basis of the representatives: dual[j] . cols[reps[i]] = (i == j), so a column near
    # one representative scores that one's rows and hardly any other's
    dual = np.linalg.pinv(cols[reps]).T
    for j in range(len(reps)):
        for rank in range(per):
            row = free.pop()
            coef = 1.0 - LADDER_STEP * rank
            head[row] = coef * LOGIT * dual[j] + 0.02 * rng.standard_normal(H) / np.sqrt(H)
            planted.append(row)
    for n, r in enumerate(range(VOCAB, ROWS)):
        head[r] = 2.0 * head[planted[n % len(planted)]] if planted else head[r]
    return head


def build(cid, flags=(), *, variant, frontier, pending, live, K, S=8, cap=None, ids=(1, 3), temperature=0.0,
          seed=0, multiplier=None, softcap=None, context_role=False, top_k=8, tries=60, clear=CLEAR) -> Case:
    rng = case_rng(cid)
    frontier = np.asarray(frontier, np.int64)
    B = frontier.size
    pending = np.broadcast_to(np.asarray(pending, np.int64), (B,))
    ctx_frontier = frontier - pending
    live = np.broadcast_to(np.asarray(live, np.int32), (B,)).copy()
    cap = int(cap or (S if variant == "dflash2" else max(S, int(frontier.max()) + 1)))
    cfg = ck.tiny_config(variant, hidden=H, layers=2, heads=4, kv_heads=2, head_dim=8, intermediate=64, window=S,
                         vocab=ROWS, rank=8, top_k=top_k, target_layer_ids=ids, num_target_layers=BLOCKS, K=K, B=B,
                         output_multiplier=multiplier, softcap=softcap)
    temperature = np.broadcast_to(np.asarray(temperature, np.float32), (B,)).copy()
    seed = np.broadcast_to(np.asarray(seed, np.uint64), (B,)).copy()
    T = int(pending.max()) if pending.max() > 0 else 1
    compared = np.arange(K)[None, :] < (live[:, None] - 1)
    last = None
    for _ in range(tries):
        sd = sdm.random_state_dict(cfg, rng)
        for key in (sdm.PREDECESSOR, sdm.SUCCESSOR):
            if key in sd:
                sd[key] = storage(CODEBOOK * np.asarray(sd[key], np.float64), "bf16")
        ckpt, config = ck.round_inputs(cfg, sd)
        scale = 2.0 ** (np.arange(BLOCKS) / 3.0)[None, :, None, None]
        blocks = rng.standard_normal((B, BLOCKS, T, H)) * scale
        for b in range(B):
            blocks[b, :, int(pending[b]):] = GARBAGE  # padding rows: never read
        embed = rng.standard_normal((ROWS, H))
        rings = [[_old_ring(rng, cap, 2, 8, ctx_frontier[b]) for b in range(B)] for _ in range(2)]
        anchor = rng.integers(0, VOCAB, B).astype(np.int32)
        embed[anchor] *= 3.0
        inputs = {
            **ckpt,
            "embed": storage(embed, "bf16"), "head": storage(np.zeros((ROWS, H)), "bf16"),
            "block_outputs": storage(blocks, "bf16"),
            "k_cache": np.stack([np.stack([r[0] for r in layer]) for layer in rings]),
            "v_cache": np.stack([np.stack([r[1] for r in layer]) for layer in rings]),
            "anchor": anchor, "frontier": frontier, "ctx_frontier": ctx_frontier, "live": live,
            "temperature": temperature, "seed": seed,
        }
        if context_role:
            kd = 2 * 8
            inputs["context_wk"] = storage(rng.standard_normal((2, kd, H)) / np.sqrt(H), "bf16")
            inputs["context_wv"] = storage(rng.standard_normal((2, kd, H)) / np.sqrt(H), "bf16")
        params = {"config": config, "num_drafts": int(K), "vocab_size": VOCAB}
        seen, record = _record_hidden()
        pr.run(pr.ReferenceOps, **inputs, **params, record=record)
        inputs["head"] = storage(_plant_head(rng, seen["hidden"], compared, variant, cfg.selector_top_k or 1),
                                 "bf16")
        case = Case(cid, inputs, params, tuple(flags), masks=_masks(inputs, compared, cap))
        last = clearness(case, compared)
        if last[0] >= clear and (temperature.max() <= 0 or _differs_from_greedy(case, compared)):
            return case
    raise RuntimeError(f"{cid}: no clear draw in {tries} tries (last clearness {last})")


def _masks(inputs, compared, cap):
    L, B = inputs["k_cache"].shape[:2]
    ring = np.stack([np.stack([live_mask(int(inputs["frontier"][b]), inputs["k_cache"].shape[2:], "ring")
                               for b in range(B)]) for _ in range(L)])
    k = inputs["num_drafts"] if "num_drafts" in inputs else None  # noqa: F841 - shapes come from the outputs
    return {"tokens": compared, "q": compared[..., None], "q_ids": compared[..., None], "k_cache": ring,
            "v_cache": ring}


def clearness(case: Case, compared) -> tuple[float, str]:
    """(the smallest margin / band over compared decisions, where)."""
    kw = case.kwargs()
    ref = pr.proposal_round(**kw)
    sc = pr.magnitudes(kw, ref)
    with precision.baseline(pr.BF16_INTERMEDIATES):
        base = pr.proposal_round(**case.kwargs())
    worst = (np.inf, "")
    for name in ("tokens", "q_ids"):
        m = np.asarray(ref[f"{name}.margin"], np.float64)
        mb = np.asarray(base[f"{name}.margin"], np.float64)
        mask = np.broadcast_to(compared if name == "tokens" else compared[..., None], m.shape)
        if name == "q_ids" and m.shape[-1] > 1:
            mask = mask.copy()
        same = np.asarray(base[name]) == np.asarray(ref[name])
        fin = mask & np.isfinite(m)
        if not fin.any():
            continue
        if not same[mask].all():
            return 0.0, f"{name}: the baseline decides otherwise"
        err = np.where(fin, np.abs(mb - m), 0).max()
        band = 2 * err + FP32_OUTPUT.k * 2.0**-24 * np.abs(np.asarray(sc[f"{name}.scale"], np.float64))
        ratio = np.where(fin, m / np.maximum(band, 1e-300), np.inf)
        at = np.unravel_index(int(np.argmin(ratio)), ratio.shape)
        if ratio[at] < worst[0]:
            worst = (float(ratio[at]), f"{name} {tuple(int(x) for x in at)}: margin {m[at]:.3g}, band {band[at]:.3g}")
    return worst


def _differs_from_greedy(case: Case, compared) -> bool:
    kw = case.kwargs()
    greedy = dict(kw, temperature=np.zeros_like(kw["temperature"]))
    a, b = pr.proposal_round(**kw), pr.proposal_round(**greedy)
    return bool((np.asarray(a["tokens"]) != np.asarray(b["tokens"]))[compared].any())


def generate() -> list[Case]:
    u32, u64 = 2**32, 2**64 - 1
    d1, d2 = "dflash", "dflash2"
    return [
        # DFlash: one local layer (S = 8) then one full layer (capacity >= every frontier)
        build(f"{OP}/dflash_B1_K1_F5_prefill5", variant=d1, frontier=[5], pending=5, live=2, K=1),
        build(f"{OP}/dflash_B3_K7_tails_ring_wrap", ["tail_extent", "ring_wrap"], variant=d1,
              frontier=[13, 21, 9], pending=[3, 1, 9], live=[8, 3, 1], K=7),
        build(f"{OP}/dflash_B2_K15_chunk_longer_than_S", ["ring_wrap", "chunk_longer_than_S"], variant=d1,
              frontier=[30, 17], pending=[12, 2], live=[16, 9], K=15),
        build(f"{OP}/dflash_B8_K3_mixed_frontiers", ["ring_wrap", "tail_extent"], variant=d1,
              frontier=[1, 4, 9, 16, 23, 8, 12, 20], pending=[1, 2, 0, 3, 4, 1, 5, 2],
              live=[4, 4, 2, 1, 4, 3, 4, 4], K=3),
        # DFlash2: two local layers (S = 8, ring capacity 8), conv, selector rank 8 top-8
        build(f"{OP}/dflash2_greedy_B2_K7_ring_wrap", ["ring_wrap"], variant=d2, frontier=[19, 11],
              pending=[4, 11], live=[8, 5], K=7),
        build(f"{OP}/dflash2_greedy_B1_K15_tail", ["tail_extent", "ring_wrap"], variant=d2, frontier=[40],
              pending=[6], live=[11], K=15),
        build(f"{OP}/dflash2_greedy_B8_K1_mixed_frontiers", ["ring_wrap", "tail_extent"], variant=d2,
              frontier=[3, 8, 9, 15, 26, 31, 7, 12], pending=[3, 1, 2, 5, 1, 4, 0, 2],
              live=[2, 2, 2, 2, 1, 2, 2, 2], K=1, top_k=4),
        build(f"{OP}/dflash2_sampled_B4_K3_seeds", ["rng_key"], variant=d2, frontier=[10, 14, 20, 9],
              pending=[2, 3, 1, 4], live=[3, 2, 2, 3], K=3, temperature=[1.0, 2.0, 0.5, 4.0],
              seed=[0, u32 - 1, u32, u64], clear=1.0),
        build(f"{OP}/dflash2_sampled_multiplier_softcap_B2_K5", ["softcap"], variant=d2, frontier=[12, 25],
              pending=[5, 2], live=[4, 3], K=5, temperature=1.0, seed=[7, 8], multiplier=0.5, softcap=6.0, clear=1.0),
        build(f"{OP}/dflash2_greedy_multiplier_softcap_B2_K4", ["softcap"], variant=d2, frontier=[9, 17],
              pending=[3, 3], live=[5, 5], K=4, multiplier=2.0, softcap=12.0),
        build(f"{OP}/dflash2_sampled_positions_2p32_B2_K4", ["positions_2p32", "ring_wrap"], variant=d2,
              frontier=[u32 + 2, u32 - 2], pending=[5, 3], live=[3, 3], K=4, temperature=1.5, seed=[3, 3], clear=1.0),
        # round-only pitfalls (conformance/mutants/proposal_round.py)
        build(f"{OP}/context_role_weights__dflash_B2_K3", ["context_role_weights"], variant=d1, frontier=[11, 6],
              pending=[4, 6], live=[4, 3], K=3, context_role=True),
        build(f"{OP}/context_role_weights__dflash2_B2_K3", ["context_role_weights", "ring_wrap"], variant=d2,
              frontier=[13, 20], pending=[3, 9], live=[4, 4], K=3, context_role=True),
        build(f"{OP}/layer_id_origin__dflash_ids_1_3_B2_K3", ["layer_id_origin"], variant=d1, frontier=[9, 5],
              pending=[3, 5], live=[4, 4], K=3, ids=(1, 3)),
        build(f"{OP}/layer_id_origin__dflash2_ids_3_0_B1_K5", ["layer_id_origin"], variant=d2, frontier=[14],
              pending=[6], live=[6], K=5, ids=(3, 0)),
        build(f"{OP}/capture_before_layer__dflash_ids_2_4_B2_K3", ["capture_before_layer"], variant=d1,
              frontier=[8, 15], pending=[4, 2], live=[4, 2], K=3, ids=(2, 4)),
        build(f"{OP}/capture_before_layer__dflash2_ids_1_4_B1_K3", ["capture_before_layer"], variant=d2,
              frontier=[12], pending=[5], live=[4], K=3, ids=(4, 1)),
        build(f"{OP}/draft_temperature__dflash2_sampled_B2_K5", ["draft_temperature"], variant=d2,
              frontier=[16, 9], pending=[2, 3], live=[4, 3], K=5, temperature=[1.0, 3.0], seed=[11, 12], clear=1.0),
        build(f"{OP}/draft_temperature__dflash2_sampled_B1_K7_T0p7", ["draft_temperature"], variant=d2,
              frontier=[21], pending=[4], live=[5], K=7, temperature=0.7, seed=[2**40], clear=1.0),
    ]


SPEC = register(
    OpSpec(
        name=OP,
        reference=pr.proposal_round,
        inputs=pr.INPUTS + ck.checkpoint_names(),
        params=pr.PARAMS,
        outputs=(
            Output("tokens", DECISION),
            Output("q", REPRESENTED, "fp32"),
            Output("q_ids", DECISION),
            Output("k_cache", REPRESENTED, "bf16"),
            Output("v_cache", REPRESENTED, "fp16", values="bf16"),
        ),
        generate=generate,
        envelope={"q": FP32_OUTPUT, "k_cache": BF16_CHAIN, "v_cache": BF16_CHAIN},
        scales=pr.magnitudes,
        bf16_intermediates=pr.BF16_INTERMEDIATES,
        decision_k=FP32_OUTPUT.k,
        doc="one proposal round (C10): checkpoint, captured target block outputs, rings -> proposals, q, rings",
    )
)
