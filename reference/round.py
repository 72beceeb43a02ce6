"""One end-to-end speculative round and a loop of rounds, composed from the reference Ops
(spec: the flowchart "Committed target state + unprocessed anchor -> Materialize pending target
features -> One masked draft block -> Proposal head; DFlash2 conditional selector -> Causal target
verify -> Target acceptance and correction -> Frontend preview chooses N outputs -> Commit N input
rows, continuation and pending features -> Publish N outputs -> (repeat)"; docs/ops.md "one
end-to-end round"; CONTRACTS C3, C5, C6, C7).

A request starts from its prompt x_0 .. x_(n-1): the target prefills x_0 .. x_(n-2), so F = n-1,
the anchor a = x_(n-1) is the unprocessed token, and the n-1 captured feature rows are pending
(context frontier 0). Every output token therefore comes from a verified round. One round for a
batch of requests (each with its own F, context and target cache):

 1. catch-up (C7): c = feature_capture(pending block outputs); per draft layer
    context_kv(c, start = F_ctx) into its ring (local, capacity S) or paged pool (full);
    F_ctx becomes F (preview_commit.catch_up checks the coverage).
 2. extent: P = min(K, remaining budget - 1) proposals can be verified (the P+1 outputs of an
    all-accept round then fit the budget; P = 0 verifies the anchor alone).
 3. masked block [a, MASK x K] at F .. F+K with live = P+1 columns (DFlash attends only those;
    DFlash2 computes all W, the Op's extent rule), reading each layer's context as a ring view.
 4. DFlash: proposal_head argmax, q one-hot (nothing passed). DFlash2: candidate_topk then
    candidate_selector (temperature and seed of the request; q and candidate ids retained).
 5. target verify: the toy target runs [a, d_1 .. d_P] at F .. F+P causally (not committed).
 6. accept (speculative_accept, or the injected ``accept``): tokens y_1 .. y_L with the request's
    sampling params, prompt mask and output history (C5, C6); one-hot or retained q.
 7. preview_commit per request (its own EOS / stop ids and remaining budget): N.
 8. commit: the target keeps the first N verified rows [a, d_1 .. d_(N-1)], F becomes F+N, y_N is
    the next anchor, the first N captured block outputs become pending (F_ctx stays), the N
    outputs are published and join the history. A request is done at its budget or at EOS/stop.

``RequestState`` holds the per-request state (frontier, context frontier, pending rows, context
storage, target cache, prompt mask, history, anchor, outputs) and refuses one whose coverage
disagrees (preview_commit.check_coverage: F_ctx + pending = F; target cache length = F; context
storage written up to F_ctx). Everything is pure: a round returns new states.

``plain_decode`` is the comparison path: the target alone, one token per step, C5 distribution
(greedy at temperature <= 0). ``next_token_probs`` gives the target's exact distribution of the
next output token after a given output prefix.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from reference import state_dict as sdm
from reference import toy_target as tt
from reference.candidate_selector import candidate_selector
from reference.candidate_topk import candidate_topk
from reference.config import FULL
from reference.context_kv import context_kv, paged_rows
from reference.feature_capture import feature_capture
from reference.masked_block import masked_block
from reference.preview_commit import catch_up, check_coverage, preview_commit, require_caught_up
from reference.proposal_head import proposal_head
from reference.speculative_accept import speculative_accept
from reference.target_distribution import add_to_history, row_probs

SAMPLING_FIELDS = ("temperature", "top_p", "min_p", "repetition_penalty", "frequency_penalty", "presence_penalty")


class RoundError(ValueError):
    """A round cannot proceed (a finished request, an inconsistent accept result, a bad geometry)."""


@dataclass(frozen=True)
class Sampling:
    """Target sampling params (C5). Stored per request as FP32 (top_k int32), as the Ops take them."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0

    def row_params(self) -> dict:
        """The scalar keyword params of target_distribution.row_probs, in the Ops' storage types."""
        out = {name: np.float32(getattr(self, name)) for name in SAMPLING_FIELDS}
        out["top_k"] = np.int32(self.top_k)
        return out


@dataclass(frozen=True)
class Request:
    prompt: tuple[int, ...]
    budget: int  # maximum number of output tokens
    seed: int = 0
    sampling: Sampling = Sampling()
    eos_ids: tuple[int, ...] = ()
    stop_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class Drafter:
    """The draft's Op inputs, adapted once from a state dict (reference.state_dict)."""

    cfg: object  # DraftConfig
    feature: dict  # feature_capture weights and params
    context: tuple[dict, ...]  # context_kv weights and params, per draft layer
    block: dict  # masked_block weights (stacked) and params
    head: dict  # proposal_head (DFlash) or candidate_topk (DFlash2) inputs
    selector: dict | None  # candidate_selector weights (DFlash2)
    page_size: int = 4  # full layers' paged pool (C7: a parameter of the Op, not the contract)


def make_drafter(sd, cfg, target: tt.ToyTarget, *, context_wk=None, context_wv=None, page_size: int = 4) -> Drafter:
    """Adapt a published state dict for ``cfg`` running against ``target`` (embedding and head are the
    target's). ``context_wk`` / ``context_wv`` give the context role distinct tensors (state_dict)."""
    if cfg.hidden_size != target.hidden:
        raise RoundError(f"draft hidden {cfg.hidden_size} != target hidden {target.hidden} (H comes from the target)")
    if cfg.vocab_size != target.rows:
        raise RoundError(f"draft vocab_size {cfg.vocab_size} != target head rows {target.rows}")
    if max(cfg.target_layer_ids) >= target.n_blocks:
        raise RoundError(f"target_layer_ids {list(cfg.target_layer_ids)} outside the target's {target.n_blocks} blocks")
    if cfg.mask_token_id is None:
        raise RoundError("the config has no mask_token_id; pass one through reduced(..., mask_token_id=)")
    dflash2 = cfg.variant == "dflash2"
    return Drafter(
        cfg=cfg,
        feature=sdm.feature_capture_inputs(sd, cfg),
        context=tuple(
            sdm.context_kv_inputs(sd, cfg, n, context_wk, context_wv) for n in range(cfg.num_hidden_layers)
        ),
        block=sdm.masked_block_inputs(sd, cfg, target.embed),
        head=(sdm.candidate_topk_inputs if dflash2 else sdm.proposal_head_inputs)(cfg, target.head, target.vocab_size),
        selector=sdm.candidate_selector_inputs(sd, cfg) if dflash2 else None,
        page_size=page_size,
    )


@dataclass(frozen=True)
class ContextStore:
    """One draft layer's context K/V (C7): a ring [S, Hk, D] (local layer) or a paged pool
    [pages, page_size, Hk, D] with its page table (full layer). K holds BF16 values, V FP16."""

    k: np.ndarray
    v: np.ndarray
    page_table: np.ndarray | None = None

    @property
    def paged(self) -> bool:
        return self.page_table is not None

    def capacity(self) -> int:
        return self.page_table.size * self.k.shape[1] if self.paged else self.k.shape[0]


@dataclass(frozen=True)
class RequestState:
    request: Request
    frontier: int  # F: the target has processed [0, F); the anchor sits at F
    ctx_frontier: int  # the draft context covers [0, F_ctx)
    anchor: int
    pending: np.ndarray  # [target blocks, F - F_ctx, Ht]: captured block outputs not yet materialized
    context: tuple[ContextStore, ...]
    ctx_written: int  # the position the context storage was last written up to (== F_ctx)
    target_cache: tt.TargetCache
    prompt_mask: np.ndarray  # [rows] uint8
    history: np.ndarray  # [rows] int32 output counts
    outputs: tuple[int, ...] = ()
    done: bool = False

    def __post_init__(self):
        check_coverage(self.frontier, self.ctx_frontier, self.pending.shape[1])
        if self.target_cache.length != self.frontier:
            raise RoundError(f"target cache holds {self.target_cache.length} positions, frontier is {self.frontier}")
        if self.ctx_written != self.ctx_frontier:
            raise RoundError(f"context storage written to {self.ctx_written}, context frontier is {self.ctx_frontier}")
        if any(c.paged and c.capacity() < self.frontier + 1 for c in self.context):
            raise RoundError(f"a full layer's page pool cannot hold position {self.frontier}")

    @property
    def budget_left(self) -> int:
        return self.request.budget - len(self.outputs)


@dataclass(frozen=True)
class RoundRecord:
    """What one round did for one request: P proposals verified, A accepted, N committed."""

    frontier: int
    proposals: tuple[int, ...]
    P: int
    accepted: int
    n: int
    published: tuple[int, ...]


def _empty_context(drafter: Drafter, request: Request) -> tuple[ContextStore, ...]:
    cfg = drafter.cfg
    shape = (cfg.num_key_value_heads, cfg.head_dim)
    stores = []
    for kind in cfg.layer_types:
        if kind == FULL:
            # room for every position the request can reach; a reversed page table, so that a
            # logical-equals-physical assumption would read the wrong rows
            pages = -(-(len(request.prompt) + request.budget) // drafter.page_size)
            pool = np.zeros((pages, drafter.page_size, *shape))
            stores.append(ContextStore(pool, pool.copy(), np.arange(pages, dtype=np.int32)[::-1].copy()))
        else:
            ring = np.zeros((cfg.sliding_window, *shape))
            stores.append(ContextStore(ring, ring.copy()))
    return tuple(stores)


def start(request: Request, drafter: Drafter, target: tt.ToyTarget) -> RequestState:
    """Prefill all prompt tokens but the last; the last is the first anchor (module docstring)."""
    prompt = np.asarray(request.prompt, dtype=np.int64)
    if prompt.ndim != 1 or prompt.size < 1 or np.any(prompt < 0) or np.any(prompt >= target.vocab_size):
        raise RoundError(f"prompt {list(request.prompt)} must hold 1 or more ids below {target.vocab_size}")
    cache, step = tt.prefill(target, prompt[:-1])
    mask = np.zeros(target.rows, np.uint8)
    mask[prompt] = 1  # the repetition penalty reads the whole prompt, anchor included (C5)
    return RequestState(
        request=request,
        frontier=int(prompt.size - 1),
        ctx_frontier=0,
        anchor=int(prompt[-1]),
        pending=step.block_outputs,
        context=_empty_context(drafter, request),
        ctx_written=0,
        target_cache=cache,
        prompt_mask=mask,
        history=np.zeros(target.rows, np.int32),
        done=request.budget <= 0,
    )


def materialize(state: RequestState, drafter: Drafter) -> RequestState:
    """Context catch-up (C7): the pending rows through feature_capture and each layer's context_kv."""
    rows = state.pending.shape[1]
    if rows == 0:
        return state
    c = feature_capture(block_outputs=state.pending, **drafter.feature)["context"]
    stores = []
    for store, weights in zip(state.context, drafter.context):
        storage = {"storage": "paged", "page_size": drafter.page_size, "page_table": store.page_table} \
            if store.paged else {"storage": "ring"}
        out = context_kv(context=c, k_cache=store.k, v_cache=store.v, start=state.ctx_frontier, **storage, **weights)
        if int(out["frontier"]) != state.frontier:
            raise RoundError(f"context_kv advanced to {int(out['frontier'])}, the target is at {state.frontier}")
        stores.append(dataclasses.replace(store, k=out["k_cache"], v=out["v_cache"]))
    ctx_frontier, pending = catch_up(state.frontier, state.ctx_frontier, rows)
    return dataclasses.replace(
        state,
        ctx_frontier=int(ctx_frontier),
        ctx_written=int(ctx_frontier),
        pending=state.pending[:, : int(pending)],  # catch_up leaves none
        context=tuple(stores),
    )


def _ring_view(store: ContextStore, frontier: int, capacity: int, window: int) -> tuple[np.ndarray, np.ndarray]:
    """The layer's live context as masked_block reads it: position p at slot p mod capacity.

    A local layer's live interval is [max(0, F - S), F) (C7); slots of older positions stay zero
    and the window mask (abs(p_k - p_q) < S) never reaches them. A full layer needs capacity >= F.
    """
    k = np.zeros((capacity, *store.k.shape[-2:]))
    v = np.zeros_like(k)
    lo = max(0, frontier - window) if window else 0
    p = np.arange(lo, frontier, dtype=np.int64)
    if store.paged:
        page, row = paged_rows(p, store.page_table, store.k.shape[1])
        src_k, src_v = store.k[page, row], store.v[page, row]
    else:
        slot = p % store.k.shape[0]
        src_k, src_v = store.k[slot], store.v[slot]
    k[p % capacity], v[p % capacity] = src_k, src_v
    return k, v


def propose(states: Sequence[RequestState], drafter: Drafter, live) -> dict:
    """Steps 3-4 for a batch: proposals [B, K], the draft hidden [B, K, H] and, for DFlash2, the
    retained q and candidate ids."""
    cfg = drafter.cfg
    for s in states:
        require_caught_up(s.frontier, s.ctx_frontier, s.pending.shape[1], "proposal")
    frontier = np.array([s.frontier for s in states], dtype=np.int64)
    anchor = np.array([s.anchor for s in states], dtype=np.int32)
    windows = list(cfg.windows)
    # one capacity for the stacked [L, B, C, Hk, D] input: S for local layers, >= every F for full ones
    capacity = max([w for w in windows if w] + [int(frontier.max()) if 0 in windows else 0] + [1])
    views = [
        [_ring_view(s.context[n], s.frontier, capacity, windows[n]) for s in states] for n in range(len(windows))
    ]
    context_k = np.stack([np.stack([kv[0] for kv in layer]) for layer in views])
    context_v = np.stack([np.stack([kv[1] for kv in layer]) for layer in views])
    hidden = masked_block(
        anchor=anchor, frontier=frontier, live=np.asarray(live, np.int32), context_k=context_k, context_v=context_v,
        **drafter.block,
    )["hidden"]
    if cfg.variant == "dflash":
        return {"tokens": proposal_head(hidden=hidden, **drafter.head)["tokens"], "hidden": hidden, "q": None,
                "q_ids": None}
    top = candidate_topk(hidden=hidden, **drafter.head)
    sel = candidate_selector(
        hidden=hidden, scores=top["scores"], ids=top["ids"], anchor=anchor,
        temperature=np.array([s.request.sampling.temperature for s in states], np.float32),
        seed=np.array([s.request.seed for s in states], np.uint64), frontier=frontier, **drafter.selector,
    )
    return {"tokens": sel["tokens"], "hidden": hidden, "q": sel["q"], "q_ids": top["ids"]}


def run_round(
    states: Sequence[RequestState],
    drafter: Drafter,
    target: tt.ToyTarget,
    accept: Callable = speculative_accept,
) -> tuple[list[RequestState], list[RoundRecord]]:
    """One round for a batch of unfinished requests (module docstring, steps 1-8).

    ``accept`` replaces speculative_accept (same keywords and outputs), e.g. a planted bug.
    """
    if any(s.done for s in states):
        raise RoundError("a finished request cannot take part in a round")
    K = drafter.cfg.K
    states = [materialize(s, drafter) for s in states]
    B = len(states)
    P = np.array([min(K, s.budget_left - 1) for s in states], dtype=np.int32)
    prop = propose(states, drafter, P + 1)

    # rows past P stay NaN: nothing may read outside the target's live extent
    logits = np.full((B, K + 1, target.rows), np.nan)
    steps = []
    for b, s in enumerate(states):
        verify_tokens = [s.anchor, *prop["tokens"][b, : P[b]].tolist()]
        step = tt.forward(target, s.target_cache, verify_tokens)
        logits[b, : P[b] + 1] = step.logits
        steps.append((verify_tokens, step))
    samplings = [s.request.sampling.row_params() for s in states]
    retained = {} if prop["q"] is None else {"q": prop["q"], "q_ids": prop["q_ids"]}
    out = accept(
        logits=logits.astype(np.float32),
        proposals=prop["tokens"],
        live_proposals=P,
        frontier=np.array([s.frontier for s in states], np.int64),
        seed=np.array([s.request.seed for s in states], np.uint64),
        prompt_mask=np.stack([s.prompt_mask for s in states]),
        output_counts=np.stack([s.history for s in states]),
        **{name: np.array([p[name] for p in samplings]) for name in (*SAMPLING_FIELDS, "top_k")},
        vocab_size=target.vocab_size,
        **retained,
    )

    new_states, records = [], []
    for b, s in enumerate(states):
        req = s.request
        pc = preview_commit(
            tokens=out["tokens"][b : b + 1], num_out=out["num_out"][b : b + 1], anchor=[s.anchor],
            frontier=[s.frontier], ctx_frontier=[s.ctx_frontier], budget=[s.budget_left], cancel=[0],
            eos_ids=np.array(req.eos_ids, np.int32), stop_ids=np.array(req.stop_ids, np.int32),
        )
        n = int(pc["n"][0])
        verify_tokens, step = steps[b]
        committed = pc["committed"][0, :n].tolist()
        if committed != verify_tokens[:n]:
            # the target keeps the K/V and features of the rows it verified; other rows were never run
            raise RoundError(f"request {b}: committed rows {committed} are not the verified rows {verify_tokens[:n]}")
        published = pc["published"][0, :n].tolist()
        ends = set(req.eos_ids) | set(req.stop_ids)
        new = dataclasses.replace(
            s,
            frontier=int(pc["frontier"][0]),
            anchor=int(pc["next_anchor"][0]) if n else s.anchor,
            pending=step.block_outputs[:, :n],
            target_cache=tt.commit(s.target_cache, step, n),
            history=add_to_history(s.history, published),
            outputs=s.outputs + tuple(published),
        )
        new = dataclasses.replace(new, done=n == 0 or new.budget_left <= 0 or bool(ends & set(published)))
        new_states.append(new)
        records.append(RoundRecord(s.frontier, tuple(verify_tokens[1:]), int(P[b]), int(out["accepted"][b]), n,
                                   tuple(published)))
    return new_states, records


@dataclass
class LoopResult:
    states: list[RequestState]
    rounds: list[list[RoundRecord | None]] = field(default_factory=list)  # [round][request], None: not run

    @property
    def outputs(self) -> list[tuple[int, ...]]:
        return [s.outputs for s in self.states]


def generate(
    requests: Sequence[Request],
    drafter: Drafter,
    target: tt.ToyTarget,
    accept: Callable = speculative_accept,
    max_rounds: int | None = None,
) -> LoopResult:
    """Start every request, then ``resume``."""
    return resume([start(r, drafter, target) for r in requests], drafter, target, accept, max_rounds)


def resume(
    states: Sequence[RequestState],
    drafter: Drafter,
    target: tt.ToyTarget,
    accept: Callable = speculative_accept,
    max_rounds: int | None = None,
) -> LoopResult:
    """Rounds over the batch of unfinished requests until every request is done (or max_rounds)."""
    result = LoopResult(list(states))
    while not all(s.done for s in result.states) and (max_rounds is None or len(result.rounds) < max_rounds):
        active = [i for i, s in enumerate(result.states) if not s.done]
        new, recs = run_round([result.states[i] for i in active], drafter, target, accept)
        row: list[RoundRecord | None] = [None] * len(result.states)
        for i, s, r in zip(active, new, recs):
            result.states[i], row[i] = s, r
        result.rounds.append(row)
    return result


# --- the comparison path: the target alone ---------------------------------------------------


def next_token_probs(request: Request, target: tt.ToyTarget, outputs: Sequence[int] = ()) -> np.ndarray:
    """The target's C5 distribution of the output token after ``outputs`` (over the head rows)."""
    tokens = [*request.prompt, *outputs]
    _, step = tt.prefill(target, tokens)
    mask = np.zeros(target.rows, np.uint8)
    mask[list(request.prompt)] = 1
    counts = add_to_history(np.zeros(target.rows, np.int32), list(outputs))
    return row_probs(step.logits[-1], mask, counts, target.vocab_size, **request.sampling.row_params())


def plain_decode(request: Request, target: tt.ToyTarget) -> tuple[int, ...]:
    """Greedy decoding of the target alone, one token per step: argmax of the C5-processed logits,
    stopping at the budget or after the first EOS / stop token."""
    if request.sampling.temperature > 0:
        raise ValueError("plain_decode is the greedy comparison path (temperature <= 0)")
    cache, _ = tt.prefill(target, request.prompt[:-1])
    mask = np.zeros(target.rows, np.uint8)
    mask[list(request.prompt)] = 1
    counts = np.zeros(target.rows, np.int32)
    token, outputs = request.prompt[-1], []
    ends = set(request.eos_ids) | set(request.stop_ids)
    while len(outputs) < request.budget:
        step = tt.forward(target, cache, [token])
        cache = tt.commit(cache, step, 1)
        p = row_probs(step.logits[0], mask, counts, target.vocab_size, **request.sampling.row_params())
        token = int(np.argmax(p))
        outputs.append(token)
        counts = add_to_history(counts, [token])
        if token in ends:
            break
    return tuple(outputs)
