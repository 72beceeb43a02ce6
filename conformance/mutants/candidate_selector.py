"""Mutants of candidate_selector: random draws, predecessor rows, seeds, temperature, ties."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from conformance.mutants.base import M32, Mutant, _ArgsMutant, _swap_words
from reference.candidate_selector import candidate_selector


class SelectorRngBatchRow(Mutant):
    """The proposal draw keyed by the batch row as well as the request's seed."""

    op, pitfall = "candidate_selector", "rng_batch_row"
    family = "rng"

    def candidate_selector(self, seed, **kw):
        rows = np.arange(seed.shape[0], dtype=np.uint64)
        return self._baseline(candidate_selector, seed=seed ^ rows, **kw)


class SelectorPredecessorRow(Mutant):
    """The walk continues from the argmax of the previous step, not from the rank it sampled."""

    op, pitfall = "candidate_selector", "selector_predecessor_row"
    family = "selector_first"

    def candidate_selector(self, temperature, ids, **kw):
        # Build the argmax chain step by step: a greedy run whose predecessors are forced
        # to the chain so far reports, at step i, the argmax from the chain's row.
        greedy = np.zeros_like(temperature)
        chain = np.zeros(ids.shape[:2], dtype=np.int32)
        for i in range(ids.shape[1]):
            chain[:, i] = self._baseline(candidate_selector, temperature=greedy, ids=ids, forced_path=chain,
                                         **kw)["path"][:, i]
        return self._baseline(candidate_selector, temperature=temperature, ids=ids, forced_path=chain, **kw)


class SelectorRngKey(_ArgsMutant):
    """Philox key words swapped: key = (seed >> 32, seed & 0xffffffff)."""

    op, pitfall, fn = "candidate_selector", "rng_key", candidate_selector
    family = "rng"

    def change(self, kw):
        return {**kw, "seed": _swap_words(kw["seed"])}


class SelectorEngineSeed(_ArgsMutant):
    """One engine-wide seed (the first request's) instead of per-request seeds."""

    op, pitfall, fn = "candidate_selector", "engine_wide_seed", candidate_selector
    family = "rng"

    def change(self, kw):
        return {**kw, "seed": np.full_like(kw["seed"], np.asarray(kw["seed"])[0])}


class SelectorTemperatureIgnored(_ArgsMutant):
    """The draft temperature ignored: sampled rows draw at temperature 1."""

    op, pitfall, fn = "candidate_selector", "draft_temperature_ignored", candidate_selector
    family = "filters"

    def change(self, kw):
        t = np.asarray(kw["temperature"])
        return {**kw, "temperature": np.where(t > 0, np.ones_like(t), t)}


class SelectorBranchesSwapped(_ArgsMutant):
    """Predecessor and successor codebooks swapped in the energy (ninfer-windows PR #4)."""

    op, pitfall, fn = "candidate_selector", "selector_branches_swapped", candidate_selector
    family = "selector_first"

    def change(self, kw):
        return {**kw, "w_pred": kw["w_succ"], "w_succ": kw["w_pred"]}


class SelectorPositions32(Mutant):
    """The draw's position counter keeps its low 32 bits only (the high word dropped)."""

    op, pitfall = "candidate_selector", "positions_2p32"
    family = "rng"

    def candidate_selector(self, frontier, ids, hidden, scores, anchor, **kw):
        f = np.asarray(frontier, dtype=np.int64)
        k = ids.shape[1]
        pred = np.asarray(anchor).copy()
        out = {"path": np.zeros(ids.shape[:2], np.int32), "tokens": np.zeros(ids.shape[:2], np.int32),
               "q": np.zeros(ids.shape, np.float32), "g": None}
        for i in range(k):
            # step i alone, from the token the walk took at step i - 1, drawn at (F + i) mod 2^32
            o = self._baseline(candidate_selector, frontier=(f + i) & M32, ids=ids[:, i:i + 1].copy(),
                               hidden=hidden[:, i:i + 1].copy(), scores=scores[:, i:i + 1].copy(),
                               anchor=pred.astype(np.asarray(anchor).dtype), **kw)
            for key in ("path", "tokens", "q"):
                out[key][:, i] = o[key][:, 0]
            pred = o["tokens"][:, 0]
        out["g"] = self._baseline(candidate_selector, frontier=f, ids=ids, hidden=hidden, scores=scores,
                                  anchor=anchor, **kw)["g"]
        return out


class SelectorTiesToHighest(Mutant):
    """Greedy step: the highest rank among the maxima instead of the lowest (C4)."""

    op, pitfall = "candidate_selector", "exact_tie"
    family = "ties"

    def candidate_selector(self, scores, ids, **kw):
        k = ids.shape[-1]
        out = self._baseline(candidate_selector, scores=scores[..., ::-1].copy(), ids=ids[..., ::-1].copy(), **kw)
        return {**out, "path": (k - 1 - out["path"]).astype(np.int32), "q": out["q"][..., ::-1].copy()}


# --- variants of the selector_first family: what the walk's first step reads ---------------------


class SelectorFirstPredTop1(_ArgsMutant):
    """The first step's predecessor taken from the candidates (step 0's top-1 token) instead of the anchor."""

    op, pitfall, variant, fn = "candidate_selector", "selector_first_step", "pred_top1", candidate_selector
    family = "selector_first"

    def change(self, kw):
        return {**kw, "anchor": np.asarray(kw["ids"])[:, 0, 0].astype(np.asarray(kw["anchor"]).dtype)}


class _FirstStepMutant(Mutant):
    """The walk split at its first step: step 0 run on the codebooks ``first(w_pred, w_succ)``, the rest
    from the token step 0 took (at frontier + 1, as the walk's own positions are)."""

    op, pitfall, family = "candidate_selector", "selector_first_step", "selector_first"
    BUG: ClassVar[dict] = {"first": True}

    def first(self, w_pred, w_succ):
        return w_pred, w_succ

    def candidate_selector(self, frontier, ids, hidden, scores, anchor, w_pred, w_succ, **kw):
        wp0, ws0 = self.first(w_pred, w_succ) if self.bug.get("first") else (w_pred, w_succ)
        o0 = self._baseline(candidate_selector, frontier=frontier, ids=ids[:, :1].copy(), hidden=hidden[:, :1].copy(),
                            scores=scores[:, :1].copy(), anchor=anchor, w_pred=wp0, w_succ=ws0, **kw)
        if ids.shape[1] == 1:
            return o0
        rest = self._baseline(candidate_selector, frontier=np.asarray(frontier) + 1, ids=ids[:, 1:].copy(),
                              hidden=hidden[:, 1:].copy(), scores=scores[:, 1:].copy(),
                              anchor=o0["tokens"][:, 0].astype(np.asarray(anchor).dtype), w_pred=w_pred,
                              w_succ=w_succ, **kw)
        return {key: np.concatenate([o0[key], rest[key]], axis=1) for key in ("g", "path", "tokens", "q")}


class SelectorFirstNoPair(_FirstStepMutant):
    """The first step scored on the unary scores alone (the anchor treated as no predecessor)."""

    variant = "no_pair"

    def first(self, w_pred, w_succ):
        return np.zeros_like(w_pred), w_succ


class SelectorFirstBranchesSwapped(_FirstStepMutant):
    """The first step reads the anchor's row from the successor codebook and the candidates' from the
    predecessor codebook (the later steps right)."""

    variant = "branches_swapped"

    def first(self, w_pred, w_succ):
        return w_succ, w_pred
