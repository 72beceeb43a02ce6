"""Greedy speculative decoding with an implementation's proposals equals plain greedy decoding
(CONTRACTS C10; spec: the round flowchart).

reference/round.py's loop proposes with the reference Ops directly (``propose`` takes no Op
object), so this module runs its own loop. Each round, for the batch of unfinished requests:

 1. the implementation's proposal round (C10: catch-up of the pending target rows through
    feature_capture and context_kv into each layer's ring, the masked block, proposal_head or
    candidate_topk + candidate_selector) on the round's inputs in their storage formats: the
    pending block outputs as BF16, the rings the previous round returned, anchor, frontiers,
    live = P + 1, temperature 0. ``--impl baseline`` composes it from the float32 baseline's Op
    methods (reference.proposal_round.run over conformance.baseline.Float32Baseline, the same
    composition kernels_cu/round.py runs over the CUDA kernels), ``--impl cuda`` calls
    kernels_cu.round:CudaRound().proposal_round, ``--impl reference`` the float64 Op,
    ``--impl module:attr`` any object (its ``proposal_round`` if it has one, else composed);
 2. the rest is the reference's, as in reference.round.run_round: the toy target verifies
    [a, d_1 .. d_P] (reference.toy_target), speculative_accept (C5, C6; DFlash one-hot q, DFlash2
    the retained q / q_ids of the round), preview_commit with the request's EOS / budget, commit:
    the first N verified rows enter the target cache, their captured block outputs become the
    next round's pending rows (the rings returned by step 1 hold every earlier position).

A prompt counts as differing when its published tokens are not exactly plain greedy decoding of
the target alone (reference.round.plain_decode). Greedy acceptance makes the output independent
of the proposals, so the equality checks the loop, the round's interface (shapes, dtypes, ids in
range, rings carried from round to round) and that nothing breaks at any K; the proposals'
quality shows in the acceptance counts, and ``--check`` compares every verified proposal with the
float64 reference round on the same inputs (a disagreement may be a legitimate near-tie, so it
is reported, not failed).

Geometry (the proposal_round vectors'): draft H 32, 2 layers, 4 query / 2 KV heads of dim 8,
intermediate 64, S = 8; DFlash one local layer then one full layer (ring capacity covers every
position a request reaches), DFlash2 two local layers (ring capacity S: wrap-around), rank 8,
top-8; target_layer_ids (1, 3) of a 5-block random toy target with 64 head rows, 60 public.
Prompts: length 1 .. 12 (1: F = 0), budget 1 .. 32, half with repetition / presence / frequency
penalties, a quarter with an EOS id that cuts the plain output.

    python -m conformance.round_e2e --impl cuda --prompts 200 --json out.json [--deadline 180]

The work runs chunk by chunk (``--chunk`` prompts), every (kind, K) per chunk, so a deadline
leaves every (kind, K) with the same prompts run; the table says exactly how many ran.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import platform
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from conformance import checkpoint as ck
from reference import proposal_round as pr
from reference import round as rd
from reference import state_dict as sdm
from reference import toy_target as tt
from reference.numerics import storage
from reference.preview_commit import preview_commit
from reference.speculative_accept import speculative_accept
from reference.target_distribution import add_to_history

H, ROWS, VOCAB, BLOCKS, S = 32, 64, 60, 5, 8
LAYERS, KV_HEADS, HEAD_DIM = 2, 2, 8
KINDS = ("dflash", "dflash2")
PENALTIES = rd.Sampling(repetition_penalty=1.3, presence_penalty=0.2, frequency_penalty=0.05)
MAX_PROMPT, MAX_BUDGET = 12, 32
MAX_BATCH = 8  # the config's batch range (parse_config: B in 1..8)
CODEBOOK = 0.15  # DFlash2 codebook scale (conformance/cases/proposal_round.py)


# --- setup -------------------------------------------------------------------------------------


def draft_config(kind: str, K: int):
    return ck.tiny_config(kind, hidden=H, layers=LAYERS, heads=4, kv_heads=KV_HEADS, head_dim=HEAD_DIM,
                          intermediate=64, window=S, vocab=ROWS, rank=8, top_k=8, target_layer_ids=(1, 3),
                          num_target_layers=BLOCKS, K=K, B=1)


def make_target(seed: int) -> tt.ToyTarget:
    return tt.random_target(np.random.default_rng(seed), vocab_size=VOCAB, rows=ROWS, hidden=H, n_blocks=BLOCKS,
                            head_spread=1.5)


@dataclass(frozen=True)
class Draft:
    """One drafter kind's round inputs that do not change between rounds (K is per call)."""

    kind: str
    ckpt: dict  # ckpt.<name> tensors (BF16)
    config: dict  # the config.json dict
    embed: np.ndarray  # BF16 storage of the target's embedding
    head: np.ndarray  # BF16 storage of the target's head


def make_draft(kind: str, target: tt.ToyTarget, seed: int) -> Draft:
    cfg = draft_config(kind, 3)
    sd = sdm.random_state_dict(cfg, np.random.default_rng(seed))
    for key in (sdm.PREDECESSOR, sdm.SUCCESSOR):  # as the proposal_round vectors: pair terms near the
        if key in sd:  # unary gaps, so that the selector mostly follows the head (acceptances happen)
            sd[key] = storage(CODEBOOK * np.asarray(sd[key], np.float64), "bf16")
    ckpt, config = ck.round_inputs(cfg, sd)
    return Draft(kind, ckpt, config, storage(target.embed, "bf16"), storage(target.head, "bf16"))


def make_requests(n: int, target: tt.ToyTarget, seed: int, start: int = 0) -> list[tuple[rd.Request, tuple]]:
    """(request, plain greedy output) for prompts start .. start+n-1 of the seed's sequence (each
    prompt from its own generator, so a sample is a prefix of a larger run's prompts)."""
    out = []
    for i in range(start, start + n):
        rng = np.random.default_rng([seed, i])
        prompt = tuple(int(t) for t in rng.integers(0, VOCAB, int(rng.integers(1, MAX_PROMPT + 1))))
        budget = int(rng.integers(1, MAX_BUDGET + 1))
        sampling = PENALTIES if rng.random() < 0.5 else rd.Sampling()
        req = rd.Request(prompt, budget, seed=i, sampling=sampling)
        plain = rd.plain_decode(req, target)
        if rng.random() < 0.25 and len(plain) > 1:
            req = dataclasses.replace(req, eos_ids=(int(plain[int(rng.integers(0, len(plain)))]),))
            plain = rd.plain_decode(req, target)
        out.append((req, plain))
    return out


# --- implementations ---------------------------------------------------------------------------


def load_impl(spec: str):
    """A callable kw -> proposal_round outputs, and a description."""
    if spec == "reference":
        return pr.proposal_round, "reference proposal_round (float64)"
    if spec == "baseline":
        from conformance.baseline import Float32Baseline

        ops = Float32Baseline()
        return (lambda **kw: pr.run(ops, **kw)), "float32 baseline Op methods composed (reference.proposal_round.run)"
    if spec == "cuda":
        spec = "kernels_cu.round:CudaRound"
    mod, _, attr = spec.partition(":")
    obj = getattr(importlib.import_module(mod), attr)
    if isinstance(obj, type):
        obj = obj()
    name = getattr(obj, "name", spec)
    if "proposal_round" in type(obj).__dict__ or any("proposal_round" in c.__dict__ for c in type(obj).__mro__):
        return obj.proposal_round, f"{spec}.proposal_round ({name})"
    return (lambda **kw: pr.run(obj, **kw)), f"{spec} Op methods composed ({name})"


def to_host(x) -> np.ndarray:
    if hasattr(x, "get") and not isinstance(x, np.ndarray):
        x = x.get()
    return np.asarray(x)


# --- the loop ----------------------------------------------------------------------------------


@dataclass
class State:
    request: rd.Request
    frontier: int
    ctx_frontier: int
    anchor: int
    pending: np.ndarray  # [BLOCKS, frontier - ctx_frontier, H] float64 block outputs
    k_ring: np.ndarray  # [L, C, Hk, D] BF16 storage
    v_ring: np.ndarray  # [L, C, Hk, D] FP16 storage
    cache: tt.TargetCache
    prompt_mask: np.ndarray
    history: np.ndarray
    outputs: list = field(default_factory=list)
    done: bool = False

    @property
    def budget_left(self) -> int:
        return self.request.budget - len(self.outputs)


@dataclass
class Tally:
    rounds: int = 0  # request-rounds (one request in one round)
    verified: int = 0  # proposals verified (sum of P)
    accepted: int = 0
    ring_wraps: int = 0  # request-rounds whose frontier passed the ring capacity (positions wrapped)
    compared: int = 0  # --check: proposals compared with the float64 round
    disagree: int = 0


def start(req: rd.Request, target: tt.ToyTarget, capacity: int) -> State:
    prompt = np.asarray(req.prompt, np.int64)
    cache, step = tt.prefill(target, prompt[:-1])
    mask = np.zeros(target.rows, np.uint8)
    mask[prompt] = 1
    shape = (LAYERS, capacity, KV_HEADS, HEAD_DIM)
    return State(req, int(prompt.size - 1), 0, int(prompt[-1]), step.block_outputs,
                 storage(np.zeros(shape), "bf16"), storage(np.zeros(shape), "fp16"), cache, mask,
                 np.zeros(target.rows, np.int32), done=req.budget <= 0)


def round_inputs(states: list[State], draft: Draft, K: int, P: np.ndarray) -> dict:
    B = len(states)
    T = max(1, max(s.pending.shape[1] for s in states))
    blocks = np.zeros((B, BLOCKS, T, H))
    for b, s in enumerate(states):
        blocks[b, :, : s.pending.shape[1]] = s.pending
    return {
        **draft.ckpt, "config": draft.config, "num_drafts": int(K), "vocab_size": VOCAB,
        "embed": draft.embed, "head": draft.head, "block_outputs": storage(blocks, "bf16"),
        "k_cache": np.stack([s.k_ring for s in states], axis=1), "v_cache": np.stack([s.v_ring for s in states], axis=1),
        "anchor": np.array([s.anchor for s in states], np.int32),
        "frontier": np.array([s.frontier for s in states], np.int64),
        "ctx_frontier": np.array([s.ctx_frontier for s in states], np.int64),
        "live": (P + 1).astype(np.int32), "temperature": np.zeros(B, np.float32),
        "seed": np.array([s.request.seed for s in states], np.uint64),
    }


def run_round(states: list[State], draft: Draft, K: int, impl, target: tt.ToyTarget, tally: Tally, check=False):
    """One round for the unfinished ``states`` (updated in place)."""
    B = len(states)
    P = np.array([min(K, s.budget_left - 1) for s in states], np.int32)
    kw = round_inputs(states, draft, K, P)
    out = {k: to_host(v) for k, v in impl(**kw).items()}
    tokens = out["tokens"].astype(np.int64)
    if tokens.shape != (B, K):
        raise ValueError(f"proposal_round tokens have shape {tokens.shape}, expected {(B, K)}")
    for b in range(B):
        bad = [int(t) for t in tokens[b, : P[b]] if not 0 <= t < VOCAB]
        if bad:
            raise ValueError(f"request {b}: proposals {bad} outside the public vocabulary 0..{VOCAB - 1}")
    if check:
        ref = pr.proposal_round(**kw)
        live = np.arange(K)[None, :] < P[:, None]
        tally.compared += int(live.sum())
        tally.disagree += int(((np.asarray(ref["tokens"]) != tokens) & live).sum())
    tally.rounds += B
    tally.verified += int(P.sum())
    tally.ring_wraps += sum(s.frontier >= kw["k_cache"].shape[2] for s in states)

    logits = np.full((B, K + 1, target.rows), np.nan)
    steps = []
    for b, s in enumerate(states):
        verify = [s.anchor, *tokens[b, : P[b]].tolist()]
        step = tt.forward(target, s.cache, verify)
        logits[b, : P[b] + 1] = step.logits
        steps.append((verify, step))
    samplings = [s.request.sampling.row_params() for s in states]
    retained = {} if draft.kind == "dflash" else {"q": out["q"].astype(np.float32),
                                                  "q_ids": out["q_ids"].astype(np.int32)}
    acc = speculative_accept(
        logits=logits.astype(np.float32), proposals=tokens.astype(np.int32), live_proposals=P,
        frontier=kw["frontier"], seed=kw["seed"], prompt_mask=np.stack([s.prompt_mask for s in states]),
        output_counts=np.stack([s.history for s in states]),
        **{name: np.array([p[name] for p in samplings]) for name in (*rd.SAMPLING_FIELDS, "top_k")},
        vocab_size=target.vocab_size, **retained,
    )
    tally.accepted += int(np.sum(acc["accepted"]))
    k_out, v_out = out["k_cache"], out["v_cache"]
    for b, s in enumerate(states):
        req = s.request
        pc = preview_commit(
            tokens=acc["tokens"][b: b + 1], num_out=acc["num_out"][b: b + 1], anchor=[s.anchor],
            frontier=[s.frontier], ctx_frontier=[s.frontier], budget=[s.budget_left], cancel=[0],
            eos_ids=np.array(req.eos_ids, np.int32), stop_ids=np.array(req.stop_ids, np.int32),
        )
        n = int(pc["n"][0])
        verify, step = steps[b]
        if pc["committed"][0, :n].tolist() != verify[:n]:
            raise rd.RoundError(f"request {b}: committed rows are not the verified rows {verify[:n]}")
        published = [int(t) for t in pc["published"][0, :n]]
        s.ctx_frontier = s.frontier  # the round caught the context up to F
        s.k_ring, s.v_ring = k_out[:, b].copy(), v_out[:, b].copy()
        s.frontier = int(pc["frontier"][0])
        s.anchor = int(pc["next_anchor"][0]) if n else s.anchor
        s.pending = step.block_outputs[:, :n]
        s.cache = tt.commit(s.cache, step, n)
        s.history = add_to_history(s.history, published)
        s.outputs += published
        ends = set(req.eos_ids) | set(req.stop_ids)
        s.done = n == 0 or s.budget_left <= 0 or bool(ends & set(published))


def capacity(kind: str, requests) -> int:
    """DFlash's full layer reads every position: a ring that never wraps; DFlash2 (all local): S."""
    if kind == "dflash2":
        return S
    return max(len(r.prompt) + r.budget for r in requests)


def generate(requests, draft: Draft, K: int, impl, target: tt.ToyTarget, tally: Tally, check=False,
             batch: int = MAX_BATCH):
    """Outputs of ``requests``, run as batches of at most ``batch`` requests (the unfinished ones of
    a batch go round together, with their own frontiers, pending rows and budgets)."""
    outs = []
    for lo in range(0, len(requests), batch):
        group = requests[lo: lo + batch]
        states = [start(r, target, capacity(draft.kind, group)) for r in group]
        while not all(s.done for s in states):
            run_round([s for s in states if not s.done], draft, K, impl, target, tally, check)
        outs += [tuple(s.outputs) for s in states]
    return outs


# --- the sweep ---------------------------------------------------------------------------------


@dataclass
class Cell:
    kind: str
    K: int
    prompts: int = 0
    differ: int = 0
    errors: int = 0
    seconds: float = 0.0  # summed over its units (in parallel runs, each worker's wall time)
    tally: Tally = field(default_factory=Tally)
    first_error: str = ""
    first_diff: str = ""

    def add(self, unit: dict) -> None:
        self.prompts += unit["prompts"]
        self.differ += unit["differ"]
        self.errors += unit["errors"]
        self.seconds += unit["seconds"]
        for k, v in unit["tally"].items():
            setattr(self.tally, k, getattr(self.tally, k) + v)
        self.first_error = self.first_error or unit["first_error"]
        self.first_diff = self.first_diff or unit["first_diff"]


def run_unit(impl, draft: Draft, K: int, lo: int, cases, target, batch: int, check: bool) -> dict:
    """One (prompts, kind, K) unit: the loop over ``cases`` [(request, plain output)], counted."""
    t1 = time.perf_counter()
    tally, unit = Tally(), {"prompts": len(cases), "differ": 0, "errors": 0, "first_error": "", "first_diff": ""}
    try:
        outs = generate([r for r, _ in cases], draft, K, impl, target, tally, check, batch)
    except Exception as exc:  # noqa: BLE001 - an implementation's failure is a result, counted
        unit["errors"] = len(cases)
        unit["first_error"] = f"prompts {lo}..{lo + len(cases) - 1}: {type(exc).__name__}: {exc}"
        outs = None
    if outs is not None:
        for i, ((req, plain), got) in enumerate(zip(cases, outs)):
            if got != plain:
                unit["differ"] += 1
                unit["first_diff"] = unit["first_diff"] or f"prompt {lo + i} {req.prompt}: {got} != plain {plain}"
    unit["tally"] = dataclasses.asdict(tally)
    unit["seconds"] = time.perf_counter() - t1
    return unit


_WORKER: dict = {}


def _worker_init(spec: str, seed: int) -> None:
    target = make_target(seed)
    _WORKER.update(impl=load_impl(spec)[0], target=target, drafts=make_drafts(target, seed))


def _worker_unit(args):
    lo, kind, K, cases, batch, check, deadline_at = args
    if deadline_at is not None and time.time() > deadline_at:
        return None
    return run_unit(_WORKER["impl"], _WORKER["drafts"][kind], K, lo, cases, _WORKER["target"], batch, check)


def make_drafts(target, seed: int) -> dict:
    return {kind: make_draft(kind, target, seed + 100 + i) for i, kind in enumerate(KINDS)}


def sweep(impl, *, prompts: int, ks, kinds=KINDS, seed: int = 0, chunk: int = MAX_BATCH, batch: int = MAX_BATCH,
          deadline_at: float | None = None, check: bool = False, workers: int = 1) -> tuple[list[Cell], dict]:
    """Every (kind, K) over ``prompts`` prompts, chunk by chunk (units of ``chunk`` prompts, every
    (kind, K) of a chunk before the next chunk). ``impl``: a callable, or a ``load_impl`` spec
    (needed for ``workers`` > 1: spawned processes, each loading it). ``deadline_at`` (time.time()):
    no unit starts after it; the cells say how many prompts ran."""
    t0 = time.perf_counter()
    target = make_target(seed)
    cases = make_requests(prompts, target, seed)
    cells = {(kind, K): Cell(kind, K) for kind in kinds for K in ks}
    units = [(lo, kind, K, cases[lo: lo + chunk], batch, check, deadline_at)
             for lo in range(0, prompts, chunk) for (kind, K) in cells]
    skipped = pool_errors = 0
    if workers <= 1:
        fn = load_impl(impl)[0] if isinstance(impl, str) else impl
        drafts = make_drafts(target, seed)
        for lo, kind, K, part, *_ in units:
            if deadline_at is not None and time.time() > deadline_at:
                skipped += 1
                continue
            cells[kind, K].add(run_unit(fn, drafts[kind], K, lo, part, target, batch, check))
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        if not isinstance(impl, str):
            raise TypeError("workers > 1 needs the implementation as a load_impl spec string")
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), initializer=_worker_init,
                                 initargs=(impl, seed)) as pool:
            futures = [pool.submit(_worker_unit, u) for u in units]
            for (lo, kind, K, *_), fut in zip(units, futures):
                try:
                    unit = fut.result()
                except Exception as exc:  # noqa: BLE001 - a worker that died: the unit is an error, counted
                    unit = {"prompts": 0, "differ": 0, "errors": 0, "seconds": 0.0, "tally": {}, "first_diff": "",
                            "first_error": f"worker failed: {type(exc).__name__}: {exc}"}
                    pool_errors += 1
                if unit is None:
                    skipped += 1
                else:
                    cells[kind, K].add(unit)
    meta = {"seconds": round(time.perf_counter() - t0, 2), "units": len(units), "units_skipped": skipped, "units_lost": pool_errors,
            "seed": seed, "chunk": chunk, "batch": batch, "prompts_asked": prompts, "check": check,
            "workers": workers}
    return list(cells.values()), meta


def table(cells: list[Cell], check: bool) -> list[str]:
    head = ("| kind | K | prompts | differ | errors | request-rounds | verified | accepted | accepted/round | "
            "wrapped | seconds |")
    if check:
        head += " compared | disagree |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for c in cells:
        t = c.tally
        line = (f"| {c.kind} | {c.K} | {c.prompts} | {c.differ} | {c.errors} | {t.rounds} | {t.verified} | "
                f"{t.accepted} | {t.accepted / t.rounds if t.rounds else 0:.3f} | {t.ring_wraps} | {c.seconds:.1f} |")
        if check:
            line += f" {t.compared} | {t.disagree} |"
        lines.append(line)
    return lines


def main(argv=None) -> int:
    t_start = time.time()
    ap = argparse.ArgumentParser(prog="python -m conformance.round_e2e", description=__doc__.split("\n\n")[0])
    ap.add_argument("--impl", default="baseline", help="baseline | reference | cuda | module:attr")
    ap.add_argument("--prompts", type=int, default=200)
    ap.add_argument("--ks", default="1-15", help="K values: '1-15' or '1,3,7'")
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--chunk", type=int, default=MAX_BATCH, help="prompts per unit (every (kind, K) per chunk)")
    ap.add_argument("--batch", type=int, default=MAX_BATCH, help=f"requests per round (1..{MAX_BATCH})")
    ap.add_argument("--workers", type=int, default=1, help="processes (spawned; each loads --impl)")
    ap.add_argument("--deadline", type=float, default=None,
                    help="seconds from the start: no unit starts after this (the table says what ran)")
    ap.add_argument("--check", action="store_true", help="compare every verified proposal with the float64 round")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    if "-" in a.ks:
        lo, hi = (int(x) for x in a.ks.split("-"))
        ks = list(range(lo, hi + 1))
    else:
        ks = [int(x) for x in a.ks.split(",")]
    kinds = tuple(k for k in a.kinds.split(",") if k)
    if a.workers > 1:
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(var, "1")  # the spawned workers' BLAS: one thread each
    impl, desc = load_impl(a.impl)
    env = {"impl": desc, "python": sys.version.split()[0], "platform": platform.platform(),
           "numpy": np.__version__, "ml_dtypes": importlib.import_module("ml_dtypes").__version__}
    try:
        import cupy

        env["cupy"] = cupy.__version__
        name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
        env["device"] = name.decode() if isinstance(name, bytes) else str(name)
        env["cuda_runtime"] = cupy.cuda.runtime.runtimeGetVersion()
        env["cuda_driver"] = cupy.cuda.runtime.driverGetVersion()
    except Exception as exc:  # noqa: BLE001 - no CuPy / no GPU: recorded
        env["cupy"] = f"unavailable ({type(exc).__name__})"
    print(json.dumps(env), flush=True)
    warm = None
    if a.workers > 1:
        # one small unit here first, so that kernels compile once (CuPy's disk cache), not per worker
        t1 = time.perf_counter()
        warm_cells, _ = sweep(impl, prompts=1, ks=[2], kinds=kinds, seed=a.seed + 1, check=False)
        warm = {"seconds": round(time.perf_counter() - t1, 2),
                "errors": [c.first_error for c in warm_cells if c.first_error]}
        print(f"warm-up (compiles): {json.dumps(warm)}", flush=True)
    deadline_at = t_start + a.deadline if a.deadline else None
    cells, meta = sweep(a.impl if a.workers > 1 else impl, prompts=a.prompts, ks=ks, kinds=kinds, seed=a.seed,
                        chunk=a.chunk, batch=a.batch, deadline_at=deadline_at, check=a.check, workers=a.workers)
    meta["warm_up"] = warm
    meta["wall_s"] = round(time.time() - t_start, 2)
    for line in table(cells, a.check):
        print(line)
    for c in cells:
        if c.first_error:
            print(f"ERROR {c.kind} K={c.K}: {c.first_error}")
        if c.first_diff:
            print(f"DIFF {c.kind} K={c.K}: {c.first_diff}")
    differ, errors = sum(c.differ for c in cells), sum(c.errors for c in cells)
    runs = sum(c.prompts for c in cells)
    least = min(c.prompts for c in cells)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"argv": sys.argv, "environment": env, "meta": meta, "cells": [
                {**{k: v for k, v in dataclasses.asdict(c).items() if k != "tally"}, **dataclasses.asdict(c.tally)}
                for c in cells]}, f, indent=1)
    verdict = "FAIL" if differ or errors or meta["units_lost"] or not runs else ("PASS" if least == a.prompts else "PASS (partial)")
    print(f"round_e2e {verdict}: impl={a.impl} {len(cells)} (kind, K) cells, prompts per cell "
          f"{least}..{max(c.prompts for c in cells)} of {a.prompts} ({runs} prompt runs), differ={differ} "
          f"errors={errors}, units skipped at the deadline {meta['units_skipped']}/{meta['units']}, "
          f"units lost to a dead worker {meta['units_lost']}, "
          f"wall {meta['wall_s']} s")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
