"""Mutants of preview_commit: where the preview is cut and which tokens are stripped."""

from __future__ import annotations

import numpy as np

from conformance.mutants.base import Mutant
from reference.preview_commit import preview_commit


class PreviewCutBeforeEos(Mutant):
    """The preview ends before the first EOS or stop token instead of after it."""

    op, pitfall = "preview_commit", "preview_cut_before_eos"
    family = "preview_cut_before_eos"

    def preview_commit(self, tokens, num_out, budget, cancel, eos_ids, stop_ids, **kw):
        # cutting at j - 1 is the reference's cut with the budget lowered to j - 1
        ends = np.isin(tokens, np.concatenate([np.ravel(eos_ids), np.ravel(stop_ids)]))
        ends &= np.arange(tokens.shape[1]) < np.asarray(num_out)[:, None]
        j = np.where(ends.any(axis=1), np.argmax(ends, axis=1) + 1, tokens.shape[1] + 1)
        cut = np.minimum(np.asarray(budget), j - 1).astype(budget.dtype)
        return self._baseline(preview_commit, tokens=tokens, num_out=num_out, budget=cut, cancel=cancel,
                              eos_ids=eos_ids, stop_ids=stop_ids, **kw)


class PreviewCutAfterNext(Mutant):
    """The same cut one token off the other way: the preview keeps the token after the first EOS or
    stop token (an inclusive end index used as a length)."""

    op, pitfall, variant = "preview_commit", "preview_cut_before_eos", "one_after"
    family = "preview_cut_before_eos"

    def preview_commit(self, tokens, num_out, budget, cancel, eos_ids, stop_ids, **kw):
        ends = np.isin(tokens, np.concatenate([np.ravel(eos_ids), np.ravel(stop_ids)]))
        ends &= np.arange(tokens.shape[1]) < np.asarray(num_out)[:, None]
        # the reference cuts at j (the end token included); this keeps j + 1 where output remains
        j = np.where(ends.any(axis=1), np.argmax(ends, axis=1) + 1, tokens.shape[1] + 1)
        stripped = {"eos_ids": np.asarray([], np.asarray(eos_ids).dtype),
                    "stop_ids": np.asarray([], np.asarray(stop_ids).dtype)}
        cut = np.minimum(np.asarray(budget), np.minimum(j + 1, np.asarray(num_out))).astype(budget.dtype)
        return self._baseline(preview_commit, tokens=tokens, num_out=num_out, budget=cut, cancel=cancel, **stripped,
                              **kw)


class MaskTokenStripped(Mutant):
    """Published tokens equal to mask_token_id dropped from the output (and from n)."""

    op, pitfall = "preview_commit", "mask_token_stripped"
    family = "mask_token_stripped"

    def preview_commit(self, mask_token_id, **kw):
        out = self._baseline(preview_commit, mask_token_id=mask_token_id, **kw)
        published = np.full_like(out["published"], -1)
        n = out["n"].copy()
        for b, row in enumerate(out["published"]):
            kept = [int(t) for t in row[: n[b]] if t != mask_token_id]
            published[b, : len(kept)], n[b] = kept, len(kept)
        return {**out, "published": published, "n": n}
