"""One whole speculative step as a single Op: proposal round, target verification, acceptance and
commit (issue 11; CONTRACTS C10 one level up; spec flowchart "One masked draft block -> Proposal
head; DFlash2 conditional selector -> Causal target verify -> Target acceptance and correction ->
Frontend preview chooses N outputs -> Commit N input rows, continuation and pending features").

    speculative_step(<every proposal_round input but live>, target.<weight>..., target_k, target_v,
                     budget, top_k, top_p, min_p, repetition_penalty, frequency_penalty,
                     presence_penalty, prompt_mask, output_counts, eos_ids, stop_ids;
                     params config, num_drafts, vocab_size, target_config)

An engine is judged here on what it commits, whatever it fuses. Per request b (frontier F, anchor
a, remaining budget R >= 1):

 1. P = min(K, R - 1) proposals can be verified (the P + 1 outputs of an all-accept step then fit
    the budget; P = 0 verifies the anchor alone). The proposal round (reference.proposal_round)
    runs with live = P + 1; its ``temperature`` is the request's sampling temperature and its
    ``seed`` the request's seed (the DFlash2 selector's draws, C3 purpose 1).
 2. The target (a tiny causal LM, reference.toy_target; its weights arrive as ``target.*``, its
    cache of the committed positions [0, F) as ``target_k`` / ``target_v``) runs [a, d_1 .. d_P]
    at positions F .. F + P causally on top of its cache.
 3. speculative_accept over the P + 1 logit rows (C5 sampling of the request, C3 draws at the
    absolute positions F + 1 + i, DFlash one-hot q, DFlash2 the round's retained q and ids).
 4. preview_commit with the remaining budget and the EOS / stop ids: N outputs are published, the
    frontier becomes F + N and the next anchor is the N-th output.

Inputs beyond proposal_round's (B requests, Lt target blocks, Ht heads of dimension Dt):

- ``target.layers.<l>.<w>`` FP32 for w in toy_target.BLOCK_WEIGHTS (attn_norm [H], wq / wk / wv
  [Ht*Dt, H], qk_norm [Dt], wo [H, Ht*Dt], mlp_norm [H], w_gate / w_up [I, H], w_down [H, I]) and
  ``target.final_norm`` [H]; the target's embedding and head are ``embed`` and ``head`` (BF16), the
  same tensors the draft reads. ``target_config`` (param): heads, head_dim, eps, theta.
  As Hugging Face Qwen3 names: input_layernorm, q_proj, k_proj, v_proj, q_norm = k_norm = qk_norm,
  o_proj, post_attention_layernorm, gate_proj, up_proj, down_proj, model.norm; RMSNorm is
  w * x / rms(x), RoPE rotates halves; an engine can load them into its own model.
- ``target_k`` / ``target_v`` [Lt, B, Fmax, Ht, Dt] FP32: the target's cache, position p of
  request b at row p (RoPE applied to K); rows at or past F[b] are padding, never read.
- ``budget`` [B] int32 >= 1 (outputs the request may still publish); ``top_k`` [B] int32,
  ``top_p``, ``min_p``, ``repetition_penalty``, ``frequency_penalty``, ``presence_penalty`` [B]
  FP32 (C5, with ``temperature``); ``prompt_mask`` [B, Vr] uint8, ``output_counts`` [B, Vr] int32
  (the output history before the step); ``eos_ids``, ``stop_ids`` [n] int32 (shared).

Outputs (all exact: the vectors are drawn so that every decision is clear, see
conformance/cases/speculative_step.py): ``proposals`` [B, K] int32 (column i compared when
i < P), ``accepted`` [B] int32 (A), ``published`` [B, K + 1] int32 (the N outputs, then -1),
``n`` [B] int32 (N), ``next_anchor`` [B] int32 (the N-th output; -1 when N = 0), ``frontier``
[B] int64 (F + N).

``run(ops, ...)`` composes the step over any object with the Op methods (the proposal round's six
plus speculative_accept and preview_commit); ``bug`` plants a step-level bug for the mutants
(conformance/mutants/speculative_step.py): "commit_first_unverified" (d_1 is committed without its accept
test; verification starts at d_2), "rng_zero_proposal_offset" (a request with P = 0 draws its
target sample one position late, as if a proposal draw had advanced its generator); the
proposal round's own bug switches pass through.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from reference import proposal_round as pr
from reference import toy_target as tt
from reference.preview_commit import preview_commit
from reference.speculative_accept import speculative_accept
from reference.target_distribution import add_to_history

TARGET = "target."
SAMPLING = ("top_p", "min_p", "repetition_penalty", "frequency_penalty", "presence_penalty")
INPUTS = tuple(n for n in pr.INPUTS if n != "live") + (
    "target_k", "target_v", "budget", "top_k", *SAMPLING, "prompt_mask", "output_counts", "eos_ids", "stop_ids")
PARAMS = pr.PARAMS + ("target_config",)
OUTPUTS = ("proposals", "accepted", "published", "n", "next_anchor", "frontier")
STEP_BUGS = ("commit_first_unverified", "rng_zero_proposal_offset")
MAX_TARGET_BLOCKS = 8


def verified_proposals(num_drafts: int, budget) -> np.ndarray:
    """P per request: min(K, R - 1), the proposals whose all-accept outputs fit the budget R."""
    return np.minimum(int(num_drafts), np.asarray(budget, np.int64) - 1).astype(np.int32)


def target_names(blocks: int = MAX_TARGET_BLOCKS) -> tuple[str, ...]:
    """Every ``target.*`` input name a step may carry (up to ``blocks`` target blocks)."""
    return tuple(f"{TARGET}layers.{layer}.{w}" for layer in range(blocks) for w in tt.BLOCK_WEIGHTS) + (
        f"{TARGET}final_norm",)


def target_inputs(target: tt.ToyTarget) -> dict[str, np.ndarray]:
    """A toy target's block weights as step inputs (FP32 storage; embed and head travel apart)."""
    out = {f"{TARGET}layers.{layer}.{w}": np.asarray(blk[w], np.float32)
           for layer, blk in enumerate(target.blocks) for w in tt.BLOCK_WEIGHTS}
    out[f"{TARGET}final_norm"] = np.asarray(target.final_norm, np.float32)
    return out


def target_config(target: tt.ToyTarget) -> dict:
    return {"heads": int(target.heads), "head_dim": int(target.head_dim), "eps": float(target.eps),
            "theta": float(target.theta)}


def make_target(weights: Mapping, embed, head, vocab_size: int, config: Mapping) -> tt.ToyTarget:
    """The toy target of a step's inputs, in float64 of the stored values."""
    blocks = []
    while f"{TARGET}layers.{len(blocks)}.wq" in weights:
        layer = len(blocks)
        missing = [w for w in tt.BLOCK_WEIGHTS if f"{TARGET}layers.{layer}.{w}" not in weights]
        if missing:
            raise ValueError(f"speculative_step: target.layers.{layer}.{missing[0]} is missing")
        blocks.append({w: np.asarray(weights[f"{TARGET}layers.{layer}.{w}"], np.float64) for w in tt.BLOCK_WEIGHTS})
    if not blocks or f"{TARGET}final_norm" not in weights:
        raise ValueError("speculative_step: the target's weights (target.layers.0.*, target.final_norm) are missing")
    extra = sorted(set(weights) - set(target_names(len(blocks))))
    if extra:
        raise ValueError(f"speculative_step: unexpected target tensor {extra[0]!r}")
    return tt.ToyTarget(embed=np.asarray(embed, np.float64), blocks=tuple(blocks),
                        final_norm=np.asarray(weights[f"{TARGET}final_norm"], np.float64),
                        head=np.asarray(head, np.float64), vocab_size=int(vocab_size), heads=int(config["heads"]),
                        head_dim=int(config["head_dim"]), eps=float(config["eps"]), theta=float(config["theta"]))


def target_cache(target_k, target_v, b: int, frontier: int) -> tt.TargetCache:
    """Request b's committed target cache (rows [0, F) of every block)."""
    k, v = np.asarray(target_k, np.float64), np.asarray(target_v, np.float64)
    if k.shape[2] < frontier:
        raise ValueError(f"speculative_step: target_k holds {k.shape[2]} positions, request {b} is at {frontier}")
    return tt.TargetCache(k=tuple(k[layer, b, :frontier] for layer in range(k.shape[0])),
                          v=tuple(v[layer, b, :frontier] for layer in range(v.shape[0])))


def run(ops, *, config, num_drafts, vocab_size, target_config, anchor, frontier, ctx_frontier, temperature, seed,
        target_k, target_v, budget, top_k, top_p, min_p, repetition_penalty, frequency_penalty, presence_penalty,
        prompt_mask, output_counts, eos_ids, stop_ids, embed, head, record: Callable | None = None,
        target_forward: Callable = tt.forward, bug: Mapping | None = None, **rest) -> dict:
    """The step (module docstring) over ``ops``; ``target_forward`` replaces toy_target.forward (a
    perturbed target in the case generator's clearness check)."""
    bug = dict(bug or {})
    round_bug = {k: v for k, v in bug.items() if k not in STEP_BUGS}
    weights = {k: rest.pop(k) for k in list(rest) if k.startswith(TARGET)}
    K, B = int(num_drafts), np.shape(frontier)[0]
    frontier = np.asarray(frontier, np.int64)
    budget = np.asarray(budget, np.int64)
    if np.any(budget < 1):
        raise ValueError(f"speculative_step: budget {budget.tolist()} must be >= 1 for every request")
    target = make_target(weights, embed, head, vocab_size, target_config)
    P = verified_proposals(K, budget)
    rnd = pr.run(ops, config=config, num_drafts=K, vocab_size=vocab_size, anchor=anchor, frontier=frontier,
                 ctx_frontier=ctx_frontier, live=P + 1, temperature=temperature, seed=seed, embed=embed, head=head,
                 record=record, bug=round_bug, **rest)
    proposals = np.asarray(rnd["tokens"]).astype(np.int32)

    logits = np.full((B, K + 1, target.rows), np.nan)
    for b in range(B):
        cache = target_cache(target_k, target_v, b, int(frontier[b]))
        step = target_forward(target, cache, [int(anchor[b]), *proposals[b, : P[b]].tolist()])
        logits[b, : P[b] + 1] = step.logits
    variant = pr.parse_config(config, "speculative_step config", K=K, B=B).variant
    retained = {} if variant == "dflash" else {"q": np.asarray(rnd["q"], np.float32),
                                               "q_ids": np.asarray(rnd["q_ids"]).astype(np.int32)}
    rows = {"prompt_mask": np.asarray(prompt_mask), "output_counts": np.asarray(output_counts),
            "temperature": np.asarray(temperature, np.float32), "top_k": np.asarray(top_k, np.int32),
            **{n: np.asarray(v, np.float32) for n, v in zip(SAMPLING, (top_p, min_p, repetition_penalty,
                                                                        frequency_penalty, presence_penalty))}}
    accept_frontier = frontier + (P == 0) if bug.get("rng_zero_proposal_offset") else frontier
    acc = _call(ops, record, "speculative_accept", logits=logits.astype(np.float32), proposals=proposals,
                live_proposals=P, frontier=accept_frontier, seed=np.asarray(seed, np.uint64),
                vocab_size=int(vocab_size), **rows, **retained)
    tokens = np.asarray(acc["tokens"]).astype(np.int32)
    num_out = np.asarray(acc["num_out"]).astype(np.int32)
    accepted = np.asarray(acc["accepted"]).astype(np.int32)
    if bug.get("commit_first_unverified"):
        tokens, num_out, accepted = _first_unverified(ops, record, logits, proposals, P, frontier, seed, rows,
                                                      retained, vocab_size, tokens, num_out, accepted)
    pc = _call(ops, record, "preview_commit", tokens=tokens, num_out=num_out, anchor=np.asarray(anchor, np.int32),
               frontier=frontier, ctx_frontier=frontier, budget=budget.astype(np.int32),
               cancel=np.zeros(B, np.int32), eos_ids=np.asarray(eos_ids, np.int32),
               stop_ids=np.asarray(stop_ids, np.int32))
    return {"proposals": proposals, "accepted": accepted, "published": np.asarray(pc["published"]).astype(np.int32),
            "n": np.asarray(pc["n"]).astype(np.int32), "next_anchor": np.asarray(pc["next_anchor"]).astype(np.int32),
            "frontier": np.asarray(pc["frontier"]).astype(np.int64)}


def _call(ops, record, op, **kw):
    out = getattr(ops, op)(**kw)
    if record is not None:
        record(op, kw, out)
    return out


def _first_unverified(ops, record, logits, proposals, P, frontier, seed, rows, retained, vocab_size, tokens,
                      num_out, accepted):
    """The mutant "d_1 committed without verification": for a request with P >= 1, d_1 is taken as
    accepted and the accept scan starts at d_2 (logit row 1, one position later, d_1 in the
    history)."""
    tokens, num_out, accepted = tokens.copy(), num_out.copy(), accepted.copy()
    W = tokens.shape[1]
    for b in np.flatnonzero(P >= 1):
        row = {k: v[b: b + 1] for k, v in rows.items()}
        row["output_counts"] = add_to_history(rows["output_counts"][b], [int(proposals[b, 0])])[None]
        shifted = np.full((1, W, logits.shape[2]), np.nan, np.float32)
        shifted[0, : W - 1] = logits[b, 1:]
        props = np.full((1, W - 1), -1, np.int32)
        props[0, : W - 2] = proposals[b, 1:]
        ret = {k: np.concatenate([v[b: b + 1, 1:], v[b: b + 1, :1]], axis=1) for k, v in retained.items()}
        sub = _call(ops, record, "speculative_accept", logits=shifted, proposals=props,
                    live_proposals=np.array([P[b] - 1], np.int32), frontier=frontier[b: b + 1] + 1,
                    seed=np.asarray(seed, np.uint64)[b: b + 1], vocab_size=int(vocab_size), **row, **ret)
        L = int(sub["num_out"][0])
        tokens[b] = -1
        tokens[b, 0] = proposals[b, 0]
        tokens[b, 1: 1 + L] = np.asarray(sub["tokens"])[0, :L]
        num_out[b], accepted[b] = L + 1, int(sub["accepted"][0]) + 1
    return tokens, num_out, accepted


class ReferenceOps(pr.ReferenceOps):
    """The reference Ops of a step as methods (the object ``run`` composes)."""

    speculative_accept = staticmethod(speculative_accept)
    preview_commit = staticmethod(preview_commit)


def speculative_step(**kwargs) -> dict:
    """The reference Op (float64; the float32 baseline under reference.precision.baseline)."""
    return run(ReferenceOps, **kwargs)
