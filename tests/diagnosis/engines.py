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
