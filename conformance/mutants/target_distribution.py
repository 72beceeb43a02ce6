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
    target_row = staticmethod(_temperature_after_filters)


class MinPOnLogits(_TargetMutant):
    """min-p applied to logits (z < min_p * max z) instead of probabilities (Camelid #534)."""

    pitfall = "min_p_on_logits"
    target_row = staticmethod(_min_p_on_logits)


class PenaltiesMissing(_ArgsMutant):
    """No repetition, frequency or presence penalty."""

    op, pitfall, fn = "target_distribution", "penalties_missing", None

    def change(self, kw):
        one = np.ones_like(kw["repetition_penalty"])
        return {**kw, "repetition_penalty": one, "frequency_penalty": 0 * one, "presence_penalty": 0 * one}


class MinPMissing(_ArgsMutant):
    op, pitfall, fn = "target_distribution", "min_p_missing", None

    def change(self, kw):
        return {**kw, "min_p": np.zeros_like(kw["min_p"])}


class TargetVocabPadding(_ArgsMutant):
    op, pitfall, fn = "target_distribution", "vocab_padding", None

    def change(self, kw):
        return {**kw, "vocab_size": np.shape(kw["logits"])[-1]}


class TargetTiesToHighest(Mutant):
    """Greedy argmax and top-k ties broken toward the higher id."""

    op, pitfall = "target_distribution", "exact_tie"

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
