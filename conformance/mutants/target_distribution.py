"""Mutants of target_distribution: filter order, min-p, penalties, padding and ties."""

from __future__ import annotations

import numpy as np

from conformance.mutants.base import Mutant, _ArgsMutant
from reference.precision import represent, work
from reference.target_distribution import filtered_probs, penalized_logits


def _target_rows(fn_row, logits, prompt_mask, output_counts, vocab_size, **prm):
    rows = [fn_row(logits[n], prompt_mask[n], output_counts[n], vocab_size, **{k: v[n] for k, v in prm.items()})
            for n in range(np.shape(logits)[0])]
    return {"probs": represent(np.stack(rows), "fp32")}


def _temperature_after_filters(logits, prompt_mask, output_counts, vocab_size, temperature, top_p, min_p,
                               repetition_penalty, frequency_penalty, presence_penalty, top_k):
    z = penalized_logits(logits, prompt_mask, output_counts, vocab_size, repetition_penalty, frequency_penalty,
                         presence_penalty)
    if work(temperature) <= 0:
        return filtered_probs(z, temperature, top_k, top_p, min_p)
    keep = filtered_probs(z, 1.0, top_k, top_p, min_p) > 0
    zt = np.where(keep, z / work(temperature), -np.inf)
    e = np.exp(zt - zt[keep].max())
    return e / e.sum()


def _min_p_on_logits(logits, prompt_mask, output_counts, vocab_size, temperature, top_p, min_p,
                     repetition_penalty, frequency_penalty, presence_penalty, top_k):
    z = penalized_logits(logits, prompt_mask, output_counts, vocab_size, repetition_penalty, frequency_penalty,
                         presence_penalty)
    if work(temperature) <= 0 or work(min_p) <= 0:
        return filtered_probs(z, temperature, top_k, top_p, min_p)
    keep = filtered_probs(z, temperature, top_k, top_p, 0.0) > 0
    zt = z / work(temperature)
    keep &= zt >= work(min_p) * zt[keep].max()  # the min-p rule applied to logits, not probabilities
    if not keep.any():
        keep[np.argmax(np.where(np.isfinite(zt), zt, -np.inf))] = True
    zk = np.where(keep, zt, -np.inf)
    e = np.exp(zk - zk[keep].max())
    return e / e.sum()


class _TargetMutant(Mutant):
    op = "target_distribution"
    target_row = None  # the buggy C5 row function (``row`` is the docs/pitfalls.md row every mutant names)

    def target_distribution(self, **kw):
        row = type(self).target_row
        return self._baseline(lambda **a: _target_rows(row, **a), **kw)


class TemperatureAfterFilters(_TargetMutant):
    """top-k/top-p/min-p chosen on the unscaled logits, temperature applied after (sglang-jax #1563)."""

    pitfall = "temperature_after_filters"
    family = "filters"
    target_row = staticmethod(_temperature_after_filters)


class MinPOnLogits(_TargetMutant):
    """min-p applied to logits (z < min_p * max z) instead of probabilities (Camelid #534)."""

    pitfall = "min_p_on_logits"
    family = "filters"
    target_row = staticmethod(_min_p_on_logits)


class PenaltiesMissing(_ArgsMutant):
    """No repetition, frequency or presence penalty."""

    op, pitfall, fn = "target_distribution", "penalties_missing", None
    family = "filters"

    def change(self, kw):
        one = np.ones_like(kw["repetition_penalty"])
        return {**kw, "repetition_penalty": one, "frequency_penalty": 0 * one, "presence_penalty": 0 * one}


class MinPMissing(_ArgsMutant):
    op, pitfall, fn = "target_distribution", "min_p_missing", None
    family = "filters"

    def change(self, kw):
        return {**kw, "min_p": np.zeros_like(kw["min_p"])}


class TargetVocabPadding(_ArgsMutant):
    op, pitfall, fn = "target_distribution", "vocab_padding", None
    family = "vocab_pad"

    def change(self, kw):
        return {**kw, "vocab_size": np.shape(kw["logits"])[-1]}


class TargetTiesToHighest(Mutant):
    """Greedy argmax and top-k ties broken toward the higher id."""

    op, pitfall = "target_distribution", "exact_tie"
    family = "ties"

    def target_distribution(self, logits, prompt_mask, output_counts, vocab_size, **kw):
        v = int(vocab_size)

        def flip(a):
            a = np.array(a, copy=True)
            a[:, :v] = a[:, :v][:, ::-1]
            return a

        out = self._baseline(_target_fn(), logits=flip(logits), prompt_mask=flip(prompt_mask),
                             output_counts=flip(output_counts), vocab_size=vocab_size, **kw)
        return {"probs": flip(out["probs"])}


def _target_fn():
    from reference.target_distribution import target_distribution

    return target_distribution


for _cls in (PenaltiesMissing, MinPMissing, TargetVocabPadding):
    _cls.fn = staticmethod(_target_fn())


# --- variants of the filters family: the order of the steps and the filters' boundary rules --------


def _filters_row(logits, prompt_mask, output_counts, vocab_size, temperature, top_p, min_p, repetition_penalty,
                 frequency_penalty, presence_penalty, top_k, *, penalties_after_temperature=False,
                 top_p_before_top_k=False, top_p_strict=False, top_p_drops_crossing=False, min_p_strict=False,
                 top_k_keeps_ties=False, top_p_keeps_ties=False):
    """reference.target_distribution.row_probs written out (C5 steps 1-9), slips as switches."""
    from reference.target_distribution import _softmax_kept, argmax_with_gap, c4_order

    t = work(temperature)
    if penalties_after_temperature and t > 0:  # z / T first, the penalties on the scaled logits
        z = penalized_logits(work(logits) / t, prompt_mask, output_counts, vocab_size, repetition_penalty,
                             frequency_penalty, presence_penalty)
    else:
        z = penalized_logits(logits, prompt_mask, output_counts, vocab_size, repetition_penalty, frequency_penalty,
                             presence_penalty)
        if t <= 0:
            p = np.zeros_like(z)
            p[argmax_with_gap(z)[0]] = 1
            return p
        z = z / t
    order = c4_order(z)
    keep = np.isfinite(z)
    k = int(top_k)

    def top_k_filter():
        if k > 0 and top_k_keeps_ties:  # a threshold on value: every token tied with the k-th stays
            keep[:] &= z >= z[order[min(k, order.size) - 1]]
        elif k > 0:
            keep[order[k:]] = False

    def top_p_filter():
        tp = work(top_p)
        if tp < 1:
            kept_order = order[keep[order]]
            p_in = _softmax_kept(z, keep)
            cum = np.cumsum(p_in[kept_order])
            if top_p_strict:  # the first prefix whose mass exceeds top_p (an exact reach is not enough)
                n = int(np.searchsorted(cum, tp, side="right")) + 1
            elif top_p_drops_crossing:  # only tokens whose cumulative mass stays within top_p (at least one)
                n = max(1, int(np.searchsorted(cum, tp, side="right")))
            else:
                n = int(np.searchsorted(cum, tp, side="left")) + 1
            drop = kept_order[min(n, kept_order.size):]
            if top_p_keeps_ties:  # a threshold on value: every token as probable as the last one kept stays
                drop = drop[p_in[drop] < p_in[kept_order[min(n, kept_order.size) - 1]]]
            keep[drop] = False

    for step in ((top_p_filter, top_k_filter) if top_p_before_top_k else (top_k_filter, top_p_filter)):
        step()
    mp = work(min_p)
    if mp > 0:
        p = _softmax_kept(z, keep)
        keep &= ~((p <= mp * p.max()) if min_p_strict else (p < mp * p.max()))
        if not keep.any():  # a strict rule can drop the maximum itself: the engine keeps its argmax
            keep[argmax_with_gap(np.where(np.isfinite(z), z, -np.inf))[0]] = True
    return _softmax_kept(z, keep)


class _FiltersMutant(Mutant):
    op, family = "target_distribution", "filters"

    def target_distribution(self, **kw):
        return self._baseline(lambda **a: _target_rows(lambda *r, **q: _filters_row(*r, **q, **self.bug), **a), **kw)


class PenaltiesAfterTemperature(_FiltersMutant):
    """Penalties applied to the temperature-scaled logits (z / T - f count), not before the temperature."""

    pitfall, variant, BUG = "filter_order", "penalties_after_temperature", {"penalties_after_temperature": True}


class TopPBeforeTopK(_FiltersMutant):
    """top-p measured on the whole distribution, then top-k: the mass top-k removed still counts toward top_p."""

    pitfall, variant, BUG = "filter_order", "top_p_before_top_k", {"top_p_before_top_k": True}


class TopPStrict(_FiltersMutant):
    """top-p keeps the first prefix whose mass exceeds top_p: a prefix reaching it exactly takes one more token."""

    pitfall, variant, BUG = "filter_boundary", "top_p_strict", {"top_p_strict": True}


class TopPDropsCrossing(_FiltersMutant):
    """top-p keeps only the tokens whose cumulative mass stays within top_p, dropping the one that crosses it."""

    pitfall, variant, BUG = "filter_boundary", "top_p_drops_crossing", {"top_p_drops_crossing": True}


class MinPStrict(_FiltersMutant):
    """min-p drops p <= min_p * p_max (the spec drops p < min_p * p_max): a token exactly at the threshold goes."""

    pitfall, variant, BUG = "filter_boundary", "min_p_strict", {"min_p_strict": True}


class TopKKeepsTies(_FiltersMutant):
    """top-k as a threshold on value (FlashInfer's top_k_renorm_probs and its sampling kernels find the k-th
    largest value and keep every probability >= it): tokens tied with the k-th all stay, not the lower ids only.

    Its own pitfall, not a filter_boundary variant: filter_boundary's case has no top-k, and the case that
    bites this (ties planted across every rank boundary up to 8) has no top-p or min-p."""

    pitfall, BUG = "top_k_keeps_ties", {"top_k_keeps_ties": True}


class TopPKeepsTies(_FiltersMutant):
    """top-p as a threshold on value (FlashInfer's top_p_renorm_probs and its sampling kernels search a
    probability pivot and keep every probability >= it): tokens tied with the last one of the prefix all stay."""

    pitfall, variant, BUG = "filter_boundary", "top_p_keeps_ties", {"top_p_keeps_ties": True}
