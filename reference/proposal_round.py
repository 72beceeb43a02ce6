"""One proposal round as a single Op (CONTRACTS C10; spec flowchart "Materialize pending target
features -> One masked draft block -> Proposal head; DFlash2 conditional selector").

    proposal_round(config, num_drafts, ckpt.<tensor>..., embed, head, block_outputs, k_cache, v_cache,
                   anchor, frontier, ctx_frontier, live, temperature, seed[, context_wk, context_wv])

Inputs (B requests, L draft layers, Lt target blocks, T captured rows, C ring capacity):

- ``config`` (param): the draft's config.json dict; ``num_drafts`` (param): the startup K;
  ``vocab_size`` (param): the public vocabulary (head rows at or past it are padding, C5).
- ``ckpt.<name>``: the draft checkpoint's tensors under their published names (BF16).
- ``context_wk`` / ``context_wv`` [L, Hk*D, H] (optional): the context role's K/V projections when
  they differ from k_proj / v_proj (published recipes back both roles with the same tensors;
  vectors give them distinct values so that an engine reading the wrong role fails).
- ``embed``, ``head`` [Vr, H]: the target's embedding and Text head (the draft has none).
- ``block_outputs`` [B, Lt, T, H] BF16: the target's captured block outputs r^l (every block, by
  block id) of the pending rows, positions ctx_frontier[b] .. frontier[b]-1 in rows
  0 .. frontier[b]-ctx_frontier[b]-1; later rows are padding, never read.
- ``k_cache`` [L, B, C, Hk, D] BF16, ``v_cache`` FP16: each layer's context ring before catch-up
  (position p in slot p mod C, live [max(0, F_ctx - C), F_ctx)). A full layer reads every
  populated position, so C >= frontier there; a local layer reads |p_k - p_q| < S.
- ``anchor`` [B] int32, ``frontier`` [B] int64 (F), ``ctx_frontier`` [B] int64 (F_ctx <= F),
  ``live`` [B] int32 (P + 1: the verifiable proposals plus the anchor), ``temperature`` [B] FP32
  and ``seed`` [B] uint64 (the DFlash2 selector's; DFlash ignores them).

The round: (1) catch-up: c = feature_capture(block_outputs[b, :, :F-F_ctx]) and per layer
context_kv(c, start=F_ctx) into the ring (C7); (2) masked_block [a, MASK x K] at F .. F+K reading the
caught-up rings; (3) DFlash: proposal_head; DFlash2: candidate_topk then candidate_selector.

Outputs: ``tokens`` [B, K] (decision; proposal i compared when i < P), ``q`` [B, K, k] FP32 and
``q_ids`` [B, K, k] (the proposal distribution over its support: DFlash's point mass is k = 1,
q = 1 at q_ids = tokens; DFlash2 the retained q over the top-k candidate ids, a decision),
``k_cache`` / ``v_cache`` (the rings after catch-up, live slots compared).

``run(ops, ...)`` is the same round over any object with the Op methods (``ReferenceOps`` here; an
implementation's Op methods for a composed round, kernels_cu/round.py), with an optional
``record(op, inputs, outputs)`` hook that sees every Op call (capture files, bisection).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from reference import magnitude as mg
from reference import scales
from reference import state_dict as sdm
from reference.candidate_selector import candidate_selector
from reference.candidate_topk import candidate_topk
from reference.config import parse_config
from reference.context_kv import context_kv, ring_slots
from reference.feature_capture import feature_capture
from reference.masked_block import BF16_INTERMEDIATES as BLOCK_BF16
from reference.masked_block import CONV_WEIGHTS, LAYER_WEIGHTS, block_tokens, masked_block
from reference.proposal_head import proposal_head
from reference.rng import Purpose

PREFIX = "ckpt."
INPUTS = ("anchor", "frontier", "ctx_frontier", "live", "block_outputs", "k_cache", "v_cache", "embed", "head",
          "temperature", "seed", "context_wk", "context_wv")
PARAMS = ("config", "num_drafts", "vocab_size")
BF16_INTERMEDIATES = BLOCK_BF16 | {"projected"}  # masked_block's and feature_capture's
FP32_PER_BF16 = 2.0**16  # one BF16 rounding unit in FP32 units


class ReferenceOps:
    """The reference Ops as methods (the object ``run`` composes)."""

    feature_capture = staticmethod(feature_capture)
    context_kv = staticmethod(context_kv)
    masked_block = staticmethod(masked_block)
    proposal_head = staticmethod(proposal_head)
    candidate_topk = staticmethod(candidate_topk)
    candidate_selector = staticmethod(candidate_selector)


def unpack(kwargs: Mapping, num_drafts: int, batch: int):
    """(DraftConfig, state dict) of a round's keyword arguments."""
    cfg = parse_config(kwargs["config"], "proposal_round config", K=int(num_drafts), B=int(batch))
    sd = {k[len(PREFIX):]: v for k, v in kwargs.items() if k.startswith(PREFIX)}
    sdm.check_state_dict(sd, cfg)
    return cfg, sd


def head_inputs(cfg, head, vocab_size) -> dict:
    if cfg.variant == "dflash":
        return sdm.proposal_head_inputs(cfg, head, vocab_size)
    return sdm.candidate_topk_inputs(cfg, head, vocab_size)


def run(ops, *, config, num_drafts, vocab_size, anchor, frontier, ctx_frontier, live, block_outputs, k_cache, v_cache, embed,
        head, temperature, seed, context_wk=None, context_wv=None, record: Callable | None = None,
        bug: Mapping | None = None, **ckpt) -> dict:
    """The round (module docstring) over ``ops``. ``bug`` switches a planted round-level bug on
    (conformance/mutants/proposal_round.py): "context_role" (context K/V from k_proj / v_proj),
    "layer_shift" (target block ids read shifted by this much), "ignore_temperature"."""
    bug = dict(bug or {})
    extra = sorted(k for k in ckpt if not k.startswith(PREFIX))
    if extra:
        raise TypeError(f"proposal_round: unexpected argument {extra[0]!r}")
    frontier = np.asarray(frontier, np.int64)
    ctx_frontier = np.asarray(ctx_frontier, np.int64)
    B = frontier.shape[0]
    cfg, sd = unpack({"config": config, **ckpt}, num_drafts, B)
    if bug.get("context_role"):
        context_wk = context_wv = None
    feature = sdm.feature_capture_inputs(sd, cfg)
    if bug.get("layer_shift"):
        last = np.shape(block_outputs)[1] - 1
        feature["target_layer_ids"] = [min(max(int(i) + int(bug["layer_shift"]), 0), last)
                                       for i in feature["target_layer_ids"]]
    ctx = [sdm.context_kv_inputs(sd, cfg, n, context_wk, context_wv) for n in range(cfg.num_hidden_layers)]
    rec = record or (lambda op, inputs, outputs: None)

    def call(op, **kw):
        out = getattr(ops, op)(**kw)
        rec(op, kw, out)
        return out

    new_k = [[None] * B for _ in range(cfg.num_hidden_layers)]
    new_v = [[None] * B for _ in range(cfg.num_hidden_layers)]
    for b in range(B):
        rows = int(frontier[b] - ctx_frontier[b])
        if rows < 0 or rows > np.shape(block_outputs)[2]:
            raise ValueError(f"proposal_round: row {b} has {rows} pending rows, block_outputs holds "
                             f"{np.shape(block_outputs)[2]}")
        c = call("feature_capture", block_outputs=block_outputs[b][:, :rows], **feature)["context"] if rows else None
        for n in range(cfg.num_hidden_layers):
            if rows:
                out = call("context_kv", context=c, k_cache=k_cache[n][b], v_cache=v_cache[n][b],
                           start=int(ctx_frontier[b]), storage="ring", **ctx[n])
                new_k[n][b], new_v[n][b] = out["k_cache"], out["v_cache"]
            else:
                new_k[n][b], new_v[n][b] = k_cache[n][b], v_cache[n][b]
    context_k = np.stack([np.stack([np.asarray(x) for x in layer]) for layer in new_k])
    context_v = np.stack([np.stack([np.asarray(x) for x in layer]) for layer in new_v])
    block = sdm.masked_block_inputs(sd, cfg, embed)
    hidden = call("masked_block", anchor=anchor, frontier=frontier, live=live, context_k=context_k,
                  context_v=context_v, **block)["hidden"]
    out = {"k_cache": context_k, "v_cache": context_v}
    if cfg.variant == "dflash":
        ph = call("proposal_head", hidden=hidden, **head_inputs(cfg, head, vocab_size))
        tokens = np.asarray(ph["tokens"]).astype(np.int32)
        out.update(tokens=tokens, q=np.ones((*tokens.shape, 1), np.float32), q_ids=tokens[..., None].copy())
        if "tokens.margin" in ph:
            out["tokens.margin"] = ph["tokens.margin"]
            out["q_ids.margin"] = np.asarray(ph["tokens.margin"])[..., None]
        return out
    top = call("candidate_topk", hidden=hidden, **head_inputs(cfg, head, vocab_size))
    temp = np.zeros_like(np.asarray(temperature)) if bug.get("ignore_temperature") else temperature
    sel = call("candidate_selector", hidden=hidden, scores=top["scores"], ids=top["ids"], anchor=anchor,
               temperature=temp, seed=seed, frontier=frontier, **sdm.candidate_selector_inputs(sd, cfg))
    out.update(tokens=np.asarray(sel["tokens"]).astype(np.int32), q=sel["q"],
               q_ids=np.asarray(top["ids"]).astype(np.int32))
    if "tokens.margin" in sel:
        out["tokens.margin"] = sel["tokens.margin"]
        out["q_ids.margin"] = top["ids.margin"]
    return out


def proposal_round(**kwargs) -> dict:
    """The reference Op (float64; the float32 baseline under reference.precision.baseline)."""
    return run(ReferenceOps, **kwargs)


# --- magnitudes (CONTRACTS C2 v2) ------------------------------------------------------------


def _layer(x: mg.Tracked, kc: mg.Tracked, vc: mg.Tracked, frontier, live, w: dict, eps, theta, head_dim, window,
           variant) -> mg.Tracked:
    """scales.layer with caches that carry their own magnitudes (context K/V computed in this round)."""
    names = LAYER_WEIGHTS + (CONV_WEIGHTS if variant == "dflash2" else ())
    return scales.layer(x, kc, vc, frontier, live, eps=eps, theta=theta, head_dim=head_dim, window=int(window),
                        variant=variant, **{n: w[n] for n in names})


def _diff_magnitude(h: mg.Tracked, wa, wb) -> np.ndarray:
    """s (FP32 units) of the difference of two logits h.wa - h.wb: the hidden's BF16-chain magnitude
    through the difference of the rows (what moves a margin), plus both logits' FP32 accumulation."""
    wa, wb = np.asarray(wa, np.float64), np.asarray(wb, np.float64)
    chain = FP32_PER_BF16 * np.sqrt(np.sum(np.square((wa - wb) * h.s), axis=-1))
    return chain + np.sum(np.abs(h.v * wa), axis=-1) + np.sum(np.abs(h.v * wb), axis=-1)


def _eligible_order(z, vocab_size):
    key = np.where(np.arange(z.shape[-1]) < vocab_size, -z, np.inf)
    return np.argsort(key, axis=-1, kind="stable")


def magnitudes(kw: Mapping, out: Mapping) -> dict:
    """s of every represented output of the round and the scale of its decisions (module doc):
    the context chain (feature_capture's tracked c through context_kv), the masked block reading
    those tracked caches, then the head / selector with the hidden's magnitude carried into FP32
    units. Slots the round does not write are copies (s = 0)."""
    kw = dict(kw)
    frontier = np.asarray(kw["frontier"], np.int64)
    ctx_frontier = np.asarray(kw["ctx_frontier"], np.int64)
    B = frontier.shape[0]
    cfg, sd = unpack(kw, kw["num_drafts"], B)
    feature = sdm.feature_capture_inputs(sd, cfg)
    ctx = [sdm.context_kv_inputs(sd, cfg, n, kw.get("context_wk"), kw.get("context_wv"))
           for n in range(cfg.num_hidden_layers)]
    L, C, d = cfg.num_hidden_layers, np.shape(kw["k_cache"])[2], cfg.head_dim
    kc = mg.Tracked(np.asarray(out["k_cache"], np.float64), np.zeros(np.shape(out["k_cache"])))
    vc = mg.Tracked(np.asarray(out["v_cache"], np.float64), np.zeros(np.shape(out["v_cache"])))
    for b in range(B):
        rows = int(frontier[b] - ctx_frontier[b])
        if not rows:
            continue
        r = np.asarray(kw["block_outputs"][b], np.float64)[:, :rows]
        s = np.concatenate([r[int(i)] for i in feature["target_layer_ids"]], axis=-1)
        c = mg.rmsnorm(mg.linear(mg.exact(s), feature["fc_weight"]), feature["hidden_norm"], feature["eps"])
        positions = int(ctx_frontier[b]) + np.arange(rows, dtype=np.int64)
        keep = np.arange(max(0, rows - C), rows)
        slots = ring_slots(positions[keep], C)
        for n in range(L):
            w = ctx[n]
            k = mg.rope(mg.rmsnorm(mg.linear(c, w["wk"]).reshape(rows, -1, d), w["k_norm"], w["eps"]), positions,
                        w["theta"])
            v = mg.linear(c, w["wv"]).reshape(k.s.shape)
            kc.s[n, b][slots], vc.s[n, b][slots] = k.s[keep], v.s[keep]
    block = sdm.masked_block_inputs(sd, cfg, kw["embed"])
    x = mg.exact(np.asarray(kw["embed"], np.float64)[block_tokens(kw["anchor"], cfg.mask_token_id, cfg.K)])
    width = x.v.shape[1]
    live = np.asarray(kw["live"]) if cfg.variant == "dflash" else np.full(B, width)
    names = LAYER_WEIGHTS + (CONV_WEIGHTS if cfg.variant == "dflash2" else ())
    for n, window in enumerate(cfg.windows):
        weights = {k: np.asarray(block[k][n]) for k in names}
        x = _layer(x, kc[n], vc[n], frontier, live, weights, cfg.rms_norm_eps, cfg.rope_theta, d, window,
                   cfg.variant)
    h = mg.rmsnorm(x, block["final_norm"], cfg.rms_norm_eps)[:, 1:]
    res = {"k_cache": kc.s, "v_cache": vc.s}
    hi = head_inputs(cfg, kw["head"], kw["vocab_size"])
    head = np.asarray(hi["head"], np.float64)
    z = h.v @ head.T
    order = _eligible_order(z, int(kw["vocab_size"]))
    tokens = np.asarray(out["tokens"])
    B, K = tokens.shape
    if cfg.variant == "dflash":
        win, run_up = order[..., 0], order[..., 1]
        res["tokens.scale"] = 2 * _diff_magnitude(h, head[win], head[run_up])
        res["q_ids.scale"] = res["tokens.scale"][..., None].copy()
        res["q"] = np.zeros(np.shape(out["q"]))  # a point mass: exact
        return res
    top_k = cfg.selector_top_k
    ranks = order[..., : top_k + 1]  # rows of ranks 0 .. k (k: the first one left out)
    nxt = [_diff_magnitude(h, head[ranks[..., r]], head[ranks[..., r + 1]]) for r in range(top_k)]
    zr = np.take_along_axis(z, ranks, axis=-1)
    gaps = zr[..., :-1] - zr[..., 1:]  # the margin of rank r is the smaller of its gaps above and below
    res["q_ids.scale"] = 2 * np.stack([nxt[r] if r == 0 else np.where(gaps[..., r] <= gaps[..., r - 1], nxt[r],
                                                                         nxt[r - 1]) for r in range(top_k)], -1)
    m, cap = float(hi["output_multiplier"]), float(hi["softcap"])
    deriv = np.ones_like(z)  # d(transformed score) / d(raw logit)
    u = z.copy()
    if m > 0:
        u, deriv = u * m, deriv * m
    if cap > 0:
        t = np.tanh(u / cap)
        deriv, u = deriv * (1 - t * t), cap * t
    ids = np.asarray(out["q_ids"], np.int64)
    sel = sdm.candidate_selector_inputs(sd, cfg)
    g = mg.linear(h, sel["w_hidden"])  # BF16 units, its own rounding included
    wp, ws = np.asarray(sel["w_pred"], np.float64), np.asarray(sel["w_succ"], np.float64)
    temperature = np.asarray(kw["temperature"], np.float64)
    q = np.asarray(out["q"], np.float64)
    s_q = np.zeros_like(q)
    step = np.zeros(tokens.shape)
    anchor = np.asarray(kw["anchor"], np.int64)
    for b in range(B):
        pred = int(anchor[b])
        for i in range(K):
            c = ids[b, i]
            pg = wp[pred] * g.v[b, i]
            uc, dc = u[b, i, c], deriv[b, i, c]
            e = uc + ws[c] @ pg
            # FP32 evaluation of each energy: its logit's accumulation, the sum, the pair term's
            fp32 = np.abs(dc) * (np.abs(h.v[b, i]) @ np.abs(head[c]).T) + np.abs(uc) + np.abs(ws[c]) @ np.abs(pg)
            # each energy's whole magnitude (q's envelope): plus the hidden's and g's chains
            se = (fp32 + FP32_PER_BF16 * (np.abs(dc) * np.sqrt(np.square(h.s[b, i]) @ np.square(head[c]).T)
                                          + np.sqrt(np.square(ws[c] * wp[pred]) @ np.square(g.s[b, i]))))

            def diff(x, y):  # s of E_x - E_y (ranks x, y): the chains through the rows' differences
                dh = dc[x] * head[c[x]] - dc[y] * head[c[y]]
                dpair = (ws[c[x]] - ws[c[y]]) * wp[pred]
                return (FP32_PER_BF16 * (np.sqrt(np.sum(np.square(dh * h.s[b, i])))
                                         + np.sqrt(np.sum(np.square(dpair * g.s[b, i]))))
                        + fp32[x] + fp32[y])

            t = float(temperature[b])
            rank = int(np.flatnonzero(c == tokens[b, i])[0])
            if t <= 0:
                others = np.delete(np.arange(c.size), rank)
                runner = int(others[np.argmax(e[others])])
                step[b, i] = 2 * diff(rank, runner)
            else:
                y = e / t
                s_q[b, i] = scales.softmax_scale(q[b, i], y, (se + np.abs(y) * t) / t + np.abs(y),
                                                 np.ones(q.shape[-1], bool))
                score = _race_scores(q[b, i], kw["seed"][b], int(frontier[b]) + i)
                others = np.delete(np.arange(c.size), rank)
                runner = int(others[np.argmax(score[others])])
                step[b, i] = (2 * diff(rank, runner) / t + np.abs(score[rank]) + np.abs(score[runner])
                              + 2 * (np.log2(c.size) + scales.SOFTMAX_TERMS))
            pred = int(tokens[b, i])
    res["q"] = s_q
    res["tokens.scale"] = step
    return res


def _race_scores(q, seed, position) -> np.ndarray:
    from reference.rng import uniform

    q = np.asarray(q, np.float64)
    u = uniform(np.uint64(seed), position, Purpose.DFLASH2_PROPOSAL, np.arange(q.size))
    with np.errstate(divide="ignore"):
        return np.where(q > 0, np.log(q) - np.log(-np.log(u)), -np.inf)
