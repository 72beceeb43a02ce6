"""Mutants of candidate_topk: tie order, softcap placement, shortlist ids, padding and NaN scores."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from conformance.mutants.base import Mutant, _ArgsMutant
from reference import numerics, precision
from reference.candidate_topk import _transform, candidate_topk
from reference.precision import work


class TopkTiesToHighest(Mutant):
    """Top-k ties broken toward the higher head row."""

    op, pitfall = "candidate_topk", "topk_unstable"
    family = "ties"
    also = ("exact_tie",)

    def candidate_topk(self, head, shortlist=None, **kw):
        # the reference's stable order on the rows reversed is "ties to the highest row" on the originals
        gid = np.arange(head.shape[0], dtype=np.int32) if shortlist is None else np.asarray(shortlist)
        return self._baseline(candidate_topk, head=head[::-1], shortlist=gid[::-1].copy(), **kw)


class TopkSoftcapBeforeSelection(Mutant):
    """Multiplier and softcap applied in BF16 before the top-k: saturated scores tie and
    the ties then go by row, not by the raw logits."""

    op, pitfall = "candidate_topk", "bf16_tie"
    family = "ties"

    BUG: ClassVar[dict] = {"select_on_bf16_transform": True}

    def candidate_topk(self, hidden, head, vocab_size, top_k, output_multiplier=0.0, softcap=0.0, shortlist=None):
        with precision.baseline():
            z = work(hidden) @ work(head).T
            gid = np.arange(head.shape[0]) if shortlist is None else np.asarray(shortlist, np.int64)
            if self.bug.get("select_on_bf16_transform"):  # ranked by the scores as the model dtype holds them
                z_sel = numerics.to_bf16(_transform(z, output_multiplier, softcap))
            else:
                z_sel = z
            key = np.where((gid >= 0) & (gid < vocab_size), -z_sel, np.inf)
            rows = np.argsort(key, axis=-1, kind="stable")[..., :top_k]
            scores = _transform(np.take_along_axis(z, rows, axis=-1), output_multiplier, softcap)
        return {"scores": numerics.storage(scores, "fp32"), "ids": gid[rows].astype(np.int32)}


class TopkShortlistNoRemap(Mutant):
    op, pitfall = "candidate_topk", "shortlist_remap"
    family = "shortlist_remap"

    def candidate_topk(self, shortlist=None, **kw):
        out = self._baseline(candidate_topk, shortlist=shortlist, **kw)
        if shortlist is None:
            return out
        row = {}
        for r, g in enumerate(np.asarray(shortlist).tolist()):
            row.setdefault(int(g), r)
        return {**out, "ids": np.vectorize(lambda t: row[int(t)], otypes=[np.int32])(out["ids"])}


class TopkVocabPadding(_ArgsMutant):
    op, pitfall, fn = "candidate_topk", "vocab_padding", candidate_topk
    family = "vocab_pad"

    def change(self, kw):
        return {**kw, "vocab_size": 2**31 - 1}


class TopkNanFirst(Mutant):
    """Top-k over NaN scores returns rows 0..k-1 (comparisons with NaN are false; vLLM #55250)."""

    op, pitfall = "candidate_topk", "nan_scores"
    family = "nan_order"

    def candidate_topk(self, hidden, head, vocab_size, top_k, output_multiplier=0.0, softcap=0.0, shortlist=None):
        out = self._baseline(candidate_topk, hidden=hidden, head=head, vocab_size=vocab_size, top_k=top_k,
                             output_multiplier=output_multiplier, softcap=softcap, shortlist=shortlist)
        with np.errstate(invalid="ignore"):
            z = np.asarray(hidden, np.float64) @ np.asarray(head, np.float64).T
        gid = np.arange(head.shape[0]) if shortlist is None else np.asarray(shortlist, np.int64)
        rows = np.flatnonzero((gid >= 0) & (gid < vocab_size))[:top_k]
        hit = np.isnan(z).any(axis=-1)
        ids, scores = out["ids"].copy(), np.asarray(out["scores"]).copy()
        with np.errstate(invalid="ignore", over="ignore"):
            ids[hit] = gid[rows]
            scores[hit] = numerics.storage(_transform(z[hit][:, rows], output_multiplier, softcap), "fp32")
        return {"scores": scores, "ids": ids}


# --- variants of the vocabulary-padding and NaN-order families -----------------------------------


class _VocabOffMutant(_ArgsMutant):
    """The public-vocabulary bound off by one: rows >= vocab_size + ``shift`` excluded."""

    op, pitfall, family, fn = "candidate_topk", "vocab_pad_boundary", "vocab_pad", candidate_topk
    shift = 0

    def change(self, kw):
        return {**kw, "vocab_size": int(kw["vocab_size"]) + self.shift}


class VocabPadPlusOne(_VocabOffMutant):
    """The first padding row (id vocab_size) kept eligible: the bound tested as id <= vocab_size."""

    variant, shift = "plus_one", 1


class VocabPadMinusOne(_VocabOffMutant):
    """The last public row (id vocab_size - 1) masked with the padding: the bound taken as vocab_size - 1."""

    variant, shift = "minus_one", -1


class _NanOrderMutant(Mutant):
    """Top-k whose sort puts NaN logits somewhere else than after every number (C4), by ``nan_key``."""

    op, pitfall, family = "candidate_topk", "nan_order", "nan_order"
    BUG: ClassVar[dict] = {}

    def candidate_topk(self, hidden, head, vocab_size, top_k, output_multiplier=0.0, softcap=0.0, shortlist=None):
        with precision.baseline(), np.errstate(invalid="ignore"):
            z = work(hidden) @ work(head).T
            gid = np.arange(head.shape[0]) if shortlist is None else np.asarray(shortlist, np.int64)
            key = -z
            nan = np.isnan(z)
            if self.bug.get("nan_as") == "-inf":  # NaN read as -inf: it ties with the -inf logits, row order decides
                key = np.where(nan, np.inf, key)
            elif self.bug.get("nan_as") == "+inf":  # NaN read as +inf: it ties with the +inf logits
                key = np.where(nan, -np.inf, key)
            elif self.bug.get("nan_as") == "between":  # NaN after +inf and every finite logit, before -inf
                key = np.where(nan, np.finfo(key.dtype).max, key)
            eligible = np.broadcast_to((gid >= 0) & (gid < vocab_size), key.shape)
            key = np.where(eligible, key, np.inf)
            # NaN keys (none left when the bug is on) sort last, as the reference's stable sort has them
            rows = np.argsort(key, axis=-1, kind="stable")
            if self.bug.get("nan_as") == "greatest":  # NaN above every number, +inf included: a second
                # stable sort puts the eligible NaN rows first, each group keeping its order (rows)
                first = np.take_along_axis(nan & eligible, rows, axis=-1)
                rows = np.take_along_axis(rows, np.argsort(~first, axis=-1, kind="stable"), axis=-1)
            rows = rows[..., :top_k]
            scores = _transform(np.take_along_axis(z, rows, axis=-1), output_multiplier, softcap)
        return {"scores": numerics.storage(scores, "fp32"), "ids": gid[rows].astype(np.int32)}


class TopkNanAsNegInf(_NanOrderMutant):
    """NaN logits ranked as -inf (a NaN-to--inf sanitizer before the sort): a NaN row with a low index
    goes ahead of -inf rows instead of after them."""

    variant, BUG = "as_neg_inf", {"nan_as": "-inf"}


class TopkNanAsPosInf(_NanOrderMutant):
    """NaN logits ranked as +inf (a comparator that reads NaN as greater): NaN rows tie with +inf rows."""

    variant, BUG = "as_pos_inf", {"nan_as": "+inf"}


class TopkNanBeforeNegInf(_NanOrderMutant):
    """NaN logits ranked after every finite and +inf logit but ahead of -inf (NaN read as the largest
    finite negative number)."""

    variant, BUG = "before_neg_inf", {"nan_as": "between"}


class TopkNanGreatest(_NanOrderMutant):
    """NaN logits ranked above every number, +inf included, NaN rows by lower row: what
    ``torch.sort(descending=True)`` and ``torch.topk`` do (NaN compares as the largest value)."""

    variant, BUG = "greatest", {"nan_as": "greatest"}
