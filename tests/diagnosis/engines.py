"""One-bug float32 engines written outside the mutant catalog (on the control set's Engine, which
rounds its own way): what a real engine with a catalogued bug, or with a bug no family covers,
looks like to the diagnosis."""

from __future__ import annotations

import numpy as np

from conformance.controls.engine import F32, Engine, f32


class TorchSortTopk(Engine):
    """candidate_topk as torch.sort(descending=True, stable=True) ranks it: NaN before every
    number (the reference ranks NaN after -inf), float32 logits and transform."""

    def candidate_topk(self, hidden, head, vocab_size, top_k, output_multiplier=0.0, softcap=0.0, shortlist=None):
        z = self._linear(f32(hidden), head)
        gid = self._gid(head.shape[0], shortlist)
        eligible = np.broadcast_to((gid >= 0) & (gid < int(vocab_size)), z.shape)
        # lexicographic: ineligible last, then NaN first, then by value descending, then row
        nan = np.isnan(z)
        key = np.where(nan, -np.inf, -np.where(nan, 0, z))
        rank = np.lexsort((np.where(eligible, key, np.inf), ~nan | ~eligible, ~eligible), axis=-1)
        rows = rank[..., : int(top_k)]
        u = np.take_along_axis(z, rows, axis=-1).astype(np.float32)
        if output_multiplier > 0:
            u = (u * F32(output_multiplier)).astype(np.float32)
        if softcap > 0:
            c = F32(softcap)
            u = (c * self._tanh((u / c).astype(np.float32))).astype(np.float32)
        return {"scores": u, "ids": gid[rows].astype(np.int32)}


class WindowLeS(Engine):
    """A local window tested as distance <= S (one key more than the contract's < S)."""

    def draft_attention(self, q, k, v, k_cache, v_cache, frontier, live, window):
        w = int(window)
        return super().draft_attention(q, k, v, k_cache, v_cache, frontier, live, w + 1 if w > 0 else 0)


class ScaledAttention(Engine):
    """Outside every family: the attention output 2% too large (a wrong constant in a kernel)."""

    def draft_attention(self, **kw):
        out = np.asarray(super().draft_attention(**kw)["out"]).astype(np.float32) * F32(1.02)
        from reference import numerics

        return {"out": numerics.storage(out.astype(np.float64), "bf16")}


class ReversedTopk(Engine):
    """Outside every family: the candidates returned in ascending rank order (a reversed slice)."""

    def candidate_topk(self, **kw):
        out = super().candidate_topk(**kw)
        return {"scores": out["scores"][..., ::-1].copy(), "ids": out["ids"][..., ::-1].copy()}


class ThresholdFilters(Engine):
    """target_distribution as FlashInfer's sampling kernels filter: a float32 softmax at the temperature,
    top-k and top-p as thresholds on the probability value (``top_k_renorm_probs`` keeps every p >= the
    k-th largest, ``top_p_renorm_probs`` every p >= the pivot where the sorted prefix mass reaches top_p),
    each renormalized by dividing by the kept sum, then min-p on the renormalized probabilities. Tokens
    tied at a boundary all stay (C4 keeps the lower ids only); everything else rounds its own way."""

    def _row_probs(self, z, prompt_mask, counts, vocab_size, temperature, top_p, min_p, rho, freq, pres, top_k):
        t = F32(temperature)
        if t <= 0:
            return super()._row_probs(z, prompt_mask, counts, vocab_size, temperature, top_p, min_p, rho, freq, pres,
                                      top_k)
        z = f32(z).copy()
        z[int(vocab_size):] = -np.inf
        seen_out = np.asarray(counts) > 0
        rho = F32(rho)
        if rho != 1:
            seen = (np.asarray(prompt_mask) != 0) | seen_out
            z = np.where(seen, np.where(z > 0, z / rho, z * rho), z).astype(np.float32)
        z = (z - (F32(freq) * f32(counts) + F32(pres) * seen_out.astype(np.float32))).astype(np.float32)
        # the online softmax: exp((z - max) / T), one float32 division by the sum
        e = self._exp(((z - np.max(z)) / t).astype(np.float32))
        p = (e / self._sum(e)).astype(np.float32)

        def renorm(keep):
            kept = np.where(keep, p, F32(0)).astype(np.float32)
            return (kept / self._sum(kept)).astype(np.float32)

        k = int(top_k)
        if 0 < k < p.size:
            p = renorm(p >= np.sort(p)[::-1][k - 1])
        if F32(top_p) < 1:
            s = np.sort(p)[::-1]
            before = (self._cumsum(s) - s).astype(np.float32)
            p = renorm(p >= np.min(s[before < F32(top_p)]))
        if F32(min_p) > 0:
            p = renorm(~(p < (F32(min_p) * np.max(p)).astype(np.float32)))
        return p
