"""Cases for speculative_step (CONTRACTS C10 one level up): a whole step judged on what
it commits (reference/speculative_step.py documents every input and output).

Each case is a real mid-stream state: a tiny random draft (the proposal_round geometry: H 32,
2 layers, 4 query / 2 KV heads of dimension 8, S = 8; DFlash one local then one full layer,
DFlash2 two local layers with conv and selector rank 8 top-8) against a 5-block random toy target
with 64 head rows (60 public). B requests start from their prompts (reference.round.start: the
prompt but its last token prefilled, everything pending) and run ``warm`` reference rounds
(reference.round.run_round), so the rings, frontiers, pending rows and output histories are the
ones a real loop reaches. The step then gets the request's remaining ``budget`` from the case
(``budget`` 1 gives P = 0).

Clear decisions, so the outputs can be exact: a draw is kept only when
- every compared proposal is clear by the proposal_round rule (its margin at least CLEAR times
  the band made of twice the float32 baseline's margin error plus the FP32 output floor;
  conformance/cases/proposal_round.py ``clearness``), and
- the step under a perturbed execution gives the same outputs and every accept / correction /
  bonus decision it takes has a margin of at least CLEAR times twice its deviation there (plus
  2^-20). The perturbed execution is the float32 baseline (reference.precision.baseline) with a
  BF16 target: the target's weights and its K/V cache rounded to BF16, which is what an engine
  running the target in BF16 perturbs. A legitimate BF16 or FP32 engine therefore commits
  exactly the reference's tokens; any difference is a bug.
Draws are also redrawn until the case shows what its id says (a rejected first proposal, an
acceptance, a P = 0 row, a sampled target) and until the step-level mutant the id names changes
the output.

Step-only pitfalls (conformance/mutants/speculative_step.py), each in the id of the cases that catch it:
- first_draft_unverified (docs/pitfalls.md "first draft token committed without verification"): a row
  with P >= 1 whose first proposal the target rejects.
- rng_zero_proposal (docs/pitfalls.md "RNG advanced for requests with zero proposals"): a sampled row
  with P = 0 whose target sample moves when drawn one position late.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from conformance import checkpoint as ck
from conformance.cases import proposal_round as prc
from conformance.registry import EXACT, Case, OpSpec, Output, case_rng, register
from reference import precision
from reference import proposal_round as pr
from reference import round as rd
from reference import speculative_step as ss
from reference import state_dict as sdm
from reference import toy_target as tt
from reference.numerics import storage, to_bf16

OP = "speculative_step"
H, ROWS, VOCAB, BLOCKS, S = prc.H, prc.ROWS, prc.VOCAB, prc.BLOCKS, 8
CLEAR = 2.0
GARBAGE = prc.GARBAGE
PENALTIES = dict(repetition_penalty=1.3, presence_penalty=0.2, frequency_penalty=0.05)


def as_fp32(a) -> np.ndarray:
    """float64 of the FP32 rounding (how the vectors store the target's weights and cache)."""
    return np.asarray(np.asarray(a, np.float32), np.float64)


def _stored_target(target: tt.ToyTarget) -> tt.ToyTarget:
    """The target as the vectors store it: embed / head BF16, block weights FP32."""
    return dataclasses.replace(
        target, embed=to_bf16(target.embed), head=to_bf16(target.head), final_norm=as_fp32(target.final_norm),
        blocks=tuple({w: as_fp32(v) for w, v in blk.items()} for blk in target.blocks))


def _bf16_forward(target: tt.ToyTarget, cache: tt.TargetCache, tokens) -> tt.TargetStep:
    """The target with its weights and its cache rounded to BF16 (the clearness perturbation)."""
    t = dataclasses.replace(target, final_norm=to_bf16(target.final_norm),
                            blocks=tuple({w: to_bf16(v) for w, v in blk.items()} for blk in target.blocks))
    c = tt.TargetCache(k=tuple(to_bf16(k) for k in cache.k), v=tuple(to_bf16(v) for v in cache.v))
    return tt.forward(t, c, tokens)


def _inputs(states, drafter, target, cfg, sd, budget, eos_ids, stop_ids) -> tuple[dict, dict]:
    B, L = len(states), cfg.num_hidden_layers
    windows = list(cfg.windows)
    cap = S if all(windows) else max(S, max(s.frontier for s in states) + 1)
    T = max(1, max(s.pending.shape[1] for s in states))
    blocks = np.full((B, BLOCKS, T, H), GARBAGE)
    fmax = max(1, max(s.frontier for s in states))
    tk = np.full((BLOCKS, B, fmax, target.heads, target.head_dim), GARBAGE)
    tv = np.full_like(tk, -GARBAGE)
    ring_k = np.zeros((L, B, cap, cfg.num_key_value_heads, cfg.head_dim))
    ring_v = np.zeros_like(ring_k)
    for b, s in enumerate(states):
        blocks[b, :, : s.pending.shape[1]] = s.pending
        for layer in range(BLOCKS):
            tk[layer, b, : s.frontier] = s.target_cache.k[layer]
            tv[layer, b, : s.frontier] = s.target_cache.v[layer]
        for n in range(L):
            ring_k[n, b], ring_v[n, b] = rd._ring_view(s.context[n], s.ctx_frontier, cap, windows[n])
    ckpt, config = ck.round_inputs(cfg, sd)
    samp = [s.request.sampling for s in states]
    inputs = {
        **ckpt, **ss.target_inputs(target),
        "embed": storage(target.embed, "bf16"), "head": storage(target.head, "bf16"),
        "block_outputs": storage(blocks, "bf16"),
        "k_cache": storage(ring_k, "bf16"), "v_cache": storage(ring_v, "fp16"),
        "anchor": np.array([s.anchor for s in states], np.int32),
        "frontier": np.array([s.frontier for s in states], np.int64),
        "ctx_frontier": np.array([s.ctx_frontier for s in states], np.int64),
        "temperature": np.array([x.temperature for x in samp], np.float32),
        "seed": np.array([s.request.seed for s in states], np.uint64),
        "target_k": tk.astype(np.float32), "target_v": tv.astype(np.float32),
        "budget": np.asarray(budget, np.int32), "top_k": np.array([x.top_k for x in samp], np.int32),
        **{n: np.array([getattr(x, n) for x in samp], np.float32) for n in ss.SAMPLING},
        "prompt_mask": np.stack([s.prompt_mask for s in states]).astype(np.uint8),
        "output_counts": np.stack([s.history for s in states]).astype(np.int32),
        "eos_ids": np.asarray(eos_ids, np.int32), "stop_ids": np.asarray(stop_ids, np.int32),
    }
    params = {"config": config, "num_drafts": int(cfg.K), "vocab_size": VOCAB,
              "target_config": ss.target_config(target)}
    return inputs, params


def _accept_margins(kw, **extra) -> tuple[dict, list]:
    """The step's outputs and every accept call's (outputs with margins) of one execution."""
    seen = []

    def record(op, inputs, outputs):
        if op == "speculative_accept":
            seen.append(outputs)

    return ss.run(ss.ReferenceOps, **kw, record=record, **extra), seen


def step_clearness(kw) -> tuple[float, str]:
    """(smallest accept-decision margin / band, where): the band is twice the deviation of the
    perturbed execution (module docstring) plus 2^-20; 0 when that execution decides otherwise."""
    ref, acc = _accept_margins(kw)
    with precision.baseline(pr.BF16_INTERMEDIATES):
        pert, acc_p = _accept_margins(kw, target_forward=_bf16_forward)
    for name in ss.OUTPUTS:
        if not np.array_equal(np.asarray(ref[name]), np.asarray(pert[name])):
            return 0.0, f"{name}: the perturbed execution decides otherwise"
    a, p = acc[0], acc_p[0]
    worst = (np.inf, "")
    for b in range(len(ref["n"])):
        L = int(a["num_out"][b])
        pairs = [(f"tokens[{b},{i}]", a["tokens.margin"][b, i], p["tokens.margin"][b, i]) for i in range(L)]
        pairs.append((f"accepted[{b}]", a["accepted.margin"][b], p["accepted.margin"][b]))
        for where, m, mp in pairs:
            m, mp = float(m), float(mp)
            if not np.isfinite(m):
                continue
            ratio = m / (2 * abs(mp - m) + 2.0**-20)
            if ratio < worst[0]:
                worst = (ratio, f"{where}: margin {m:.3g}, perturbed {mp:.3g}")
    return worst


def _round_case(kw, P) -> Case:
    """The step's proposal round as a proposal_round case (for its clearness rule)."""
    inputs = {k: v for k, v in kw.items() if k in pr.INPUTS or k.startswith(pr.PREFIX)}
    inputs["live"] = (np.asarray(P) + 1).astype(np.int32)
    params = {k: kw[k] for k in pr.PARAMS}
    return Case("proposal_round/of_a_step", inputs, params)


def world(rng, variant: str, K: int, B: int, *, ids=(1, 3), spread: float = 1.5, codebook: bool = True):
    """(config, state dict, drafter, target) of one draw: the proposal_round geometry's draft
    (DFlash2 codebooks scaled by proposal_round's CODEBOOK when ``codebook``) against a random toy
    target stored as the vectors store it."""
    cfg = ck.tiny_config(variant, hidden=H, layers=2, heads=4, kv_heads=2, head_dim=8, intermediate=64, window=S,
                         vocab=ROWS, rank=8, top_k=8, target_layer_ids=ids, num_target_layers=BLOCKS, K=K, B=B)
    target = _stored_target(tt.random_target(rng, vocab_size=VOCAB, rows=ROWS, hidden=H, n_blocks=BLOCKS,
                                             head_spread=spread))
    sd = sdm.random_state_dict(cfg, rng)
    for key in (sdm.PREDECESSOR, sdm.SUCCESSOR):
        if codebook and key in sd:
            sd[key] = storage(prc.CODEBOOK * np.asarray(sd[key], np.float64), "bf16")
    return cfg, sd, rd.make_drafter(sd, cfg, target), target


def build(cid, flags=(), *, variant, K, prompts, budget, warm=1, temperature=0.0, penalties=False, seed=None,
          top_k=0, top_p=1.0, min_p=0.0, eos=False, want=(), bug=None, spread=1.5, ids=(1, 3), tries=80) -> Case:
    """A step over len(prompts) requests (prompt lengths ``prompts``) after ``warm`` rounds, with the
    remaining ``budget`` per request. ``want``: what the reference step must show (see _shows);
    ``bug``: a step-level bug that must change the outputs."""
    rng = case_rng(cid)
    B = len(prompts)
    budget = np.broadcast_to(np.asarray(budget, np.int64), (B,)).copy()
    temps = np.broadcast_to(np.asarray(temperature, np.float64), (B,))
    P = ss.verified_proposals(K, budget)
    compared = np.arange(K)[None, :] < P[:, None]
    clear = CLEAR if temps.max() <= 0 else 1.0
    last = None
    for _ in range(tries):
        cfg, sd, drafter, target = world(rng, variant, K, B, ids=ids, spread=spread)
        requests = []
        for b in range(B):
            sampling = rd.Sampling(temperature=float(temps[b]), top_k=top_k, top_p=top_p, min_p=min_p,
                                   **(PENALTIES if penalties else {}))
            prompt = tuple(int(t) for t in rng.integers(0, VOCAB, int(prompts[b])))
            s = int(rng.integers(0, 2**63)) if seed is None else int(np.broadcast_to(seed, (B,))[b])
            requests.append(rd.Request(prompt, budget=int(budget[b]) + 4 * K * warm + 8, seed=s, sampling=sampling))
        states = [rd.start(r, drafter, target) for r in requests]
        for _ in range(warm):
            states, _ = rd.run_round(states, drafter, target)
            if any(s.done for s in states):
                break
        if any(s.done for s in states):
            continue
        eos_ids = [int(rng.integers(0, VOCAB))] if eos else []
        inputs, params = _inputs(states, drafter, target, cfg, sd, budget, eos_ids, [])
        kw = {**inputs, **params}
        if compared.any():  # the head planted on the step's draft hidden (clear proposals; the target reads it too)
            seen, record = prc._record_hidden()
            ss.run(ss.ReferenceOps, **kw, record=record)
            inputs["head"] = storage(prc._plant_head(rng, seen["hidden"], compared, variant, cfg.selector_top_k or 1),
                                     "bf16")
            kw = {**inputs, **params}
        if eos:  # an EOS among the step's own outputs, so that the cut shows
            ref = ss.speculative_step(**kw)
            outs = [int(t) for t in np.asarray(ref["published"]).ravel() if t >= 0]
            if not outs:
                continue
            inputs["eos_ids"] = np.array([outs[int(rng.integers(0, len(outs)))]], np.int32)
            kw = {**inputs, **params}
        last = prc.clearness(_round_case(kw, P), compared) if compared.any() else (np.inf, "")
        if last[0] < clear:
            continue
        last = step_clearness(kw)
        if last[0] < clear:
            continue
        ref = ss.speculative_step(**kw)
        if not all(_shows(w, ref, P, temps) for w in want):
            last = (last[0], f"does not show {want}")
            continue
        if bug:
            bad = ss.run(ss.ReferenceOps, **kw, bug={bug: True})
            if all(np.array_equal(np.asarray(bad[n]), np.asarray(ref[n])) for n in ss.OUTPUTS):
                last = (last[0], f"bug {bug} does not show")
                continue
        return Case(cid, inputs, params, tuple(flags), masks={"proposals": compared})
    raise RuntimeError(f"{cid}: no clear draw in {tries} tries (last: {last})")


def _shows(want: str, ref, P, temps) -> bool:
    acc, n = np.asarray(ref["accepted"]), np.asarray(ref["n"])
    if want == "reject_first":  # a row with P >= 1 whose first proposal is rejected
        return bool(np.any((P >= 1) & (acc == 0)))
    if want == "accept":  # some row accepts a proposal
        return bool(np.any(acc >= 1))
    if want == "eos_cut":  # some row publishes fewer than it was licensed
        return bool(np.any(n < acc + 1))
    raise ValueError(want)


def generate() -> list[Case]:
    d1, d2 = "dflash", "dflash2"
    return [
        build(f"{OP}/dflash_greedy_B2_K3", ["greedy"], variant=d1, K=3, prompts=[5, 9], budget=[8, 8],
              want=("accept",)),
        build(f"{OP}/dflash_greedy_B4_K7_budget_tails", ["tail_extent", "ring_wrap"], variant=d1, K=7,
              prompts=[3, 12, 7, 10], budget=[3, 20, 8, 2], warm=2, want=("accept",)),
        build(f"{OP}/dflash_greedy_penalties_eos_B3_K5", ["penalties", "eos"], variant=d1, K=5, prompts=[6, 4, 11],
              budget=[12, 12, 12], penalties=True, eos=True, want=("eos_cut",)),
        build(f"{OP}/dflash2_greedy_B2_K7_ring_wrap", ["ring_wrap"], variant=d2, K=7, prompts=[10, 6],
              budget=[16, 5], warm=2, want=("accept",)),
        build(f"{OP}/dflash2_sampled_B3_K4", ["sampled", "rng_key"], variant=d2, K=4, prompts=[4, 8, 6],
              budget=[10, 10, 3], temperature=[0.8, 1.5, 1.0], top_k=20, top_p=0.95),
        build(f"{OP}/dflash_sampled_min_p_B2_K3", ["sampled"], variant=d1, K=3, prompts=[7, 5], budget=[6, 9],
              temperature=[1.0, 0.7], min_p=0.05, penalties=True),
        build(f"{OP}/dflash2_greedy_B1_K15", ["tail_extent"], variant=d2, K=15, prompts=[9], budget=[30]),
        # step-only pitfalls (conformance/mutants/speculative_step.py)
        build(f"{OP}/first_draft_unverified__dflash_greedy_B2_K4", ["first_draft_unverified"], variant=d1, K=4,
              prompts=[6, 8], budget=[10, 10], want=("reject_first",), bug="commit_first_unverified"),
        build(f"{OP}/first_draft_unverified__dflash2_sampled_B2_K3", ["first_draft_unverified", "sampled"],
              variant=d2, K=3, prompts=[5, 9], budget=[7, 7], temperature=1.0, want=("reject_first",),
              bug="commit_first_unverified"),
        build(f"{OP}/rng_zero_proposal__dflash_sampled_B3_K3", ["rng_zero_proposal", "sampled"], variant=d1, K=3,
              prompts=[6, 4, 9], budget=[1, 6, 1], temperature=[1.2, 1.0, 0.9], bug="rng_zero_proposal_offset"),
        build(f"{OP}/rng_zero_proposal__dflash2_sampled_B2_K5", ["rng_zero_proposal", "sampled"], variant=d2, K=5,
              prompts=[8, 5], budget=[1, 1], temperature=[1.5, 2.0], bug="rng_zero_proposal_offset"),
    ]


SPEC = register(
    OpSpec(
        name=OP,
        reference=ss.speculative_step,
        inputs=ss.INPUTS + ck.checkpoint_names() + ss.target_names(),
        params=ss.PARAMS,
        outputs=tuple(Output(name, EXACT) for name in ss.OUTPUTS),
        generate=generate,
        bf16_intermediates=pr.BF16_INTERMEDIATES,
        doc="one speculative step (C10 one level up): round, toy-target verify, accept, commit -> committed tokens",
    )
)
