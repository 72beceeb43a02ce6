"""Mutants of proposal_head: proposal columns, logit storage, ties, shortlist ids and padding."""

from __future__ import annotations

import numpy as np

from conformance.mutants.base import Mutant, _ArgsMutant
from reference import numerics, precision
from reference.precision import work
from reference.proposal_head import proposal_head


class NextTokenShift(Mutant):
    """Proposals read autoregressively: column i's token from the hidden one column
    earlier (column 0, having no anchor hidden here, from the last column)."""

    op, pitfall = "proposal_head", "next_token_shift"
    family = "next_token_shift"

    def proposal_head(self, hidden, **kw):
        return self._baseline(proposal_head, hidden=np.roll(hidden, 1, axis=1), **kw)


class NextTokenShiftForward(Mutant):
    """The same column misalignment the other way: column i's token from the hidden one column
    later (the last column, having none, from column 0), as a head that pairs each hidden with the
    label slot after it."""

    op, pitfall, variant = "proposal_head", "next_token_shift", "forward"
    family = "next_token_shift"

    def proposal_head(self, hidden, **kw):
        return self._baseline(proposal_head, hidden=np.roll(hidden, -1, axis=1), **kw)


class Bf16Logits(Mutant):
    """Head logits stored BF16 before the argmax (a GEMM writing the model dtype): logits one BF16
    ulp apart tie, and the lowest row wins."""

    op, pitfall = "proposal_head", "bf16_logits"
    family = "rounding"

    def proposal_head(self, hidden, head, vocab_size, shortlist=None):
        logits = numerics.to_bf16(precision.matmul(work(hidden), work(head).T).astype(np.float64))
        ids = np.arange(head.shape[0]) if shortlist is None else np.asarray(shortlist, np.int64)
        eligible = (ids >= 0) & (ids < int(vocab_size))
        best = np.argmax(np.where(eligible, logits, -np.inf), axis=-1)
        return {"tokens": ids[best].astype(np.int32)}


class HeadTiesToHighest(Mutant):
    """Argmax ties to the highest row (last maximum) instead of the lowest (C4)."""

    op, pitfall = "proposal_head", "exact_tie"
    family = "ties"

    def proposal_head(self, head, shortlist=None, **kw):
        gid = np.arange(head.shape[0], dtype=np.int32) if shortlist is None else np.asarray(shortlist)
        return self._baseline(proposal_head, head=head[::-1], shortlist=gid[::-1].copy(), **kw)


class HeadShortlistNoRemap(Mutant):
    """An indexed head's row number returned as the token (no shortlist remap)."""

    op, pitfall = "proposal_head", "shortlist_remap"
    family = "shortlist_remap"

    def proposal_head(self, head, vocab_size, shortlist=None, **kw):
        out = self._baseline(proposal_head, head=head, vocab_size=vocab_size, shortlist=shortlist, **kw)
        if shortlist is None:
            return out
        row = {}
        for r, g in enumerate(np.asarray(shortlist).tolist()):
            row.setdefault(int(g), r)
        return {"tokens": np.vectorize(lambda t: row[int(t)], otypes=[np.int32])(out["tokens"])}


class HeadVocabPadding(_ArgsMutant):
    """Padded vocabulary rows eligible (vocab_size ignored)."""

    op, pitfall, fn = "proposal_head", "vocab_padding", proposal_head
    family = "vocab_pad"

    def change(self, kw):
        return {**kw, "vocab_size": 2**31 - 1}
