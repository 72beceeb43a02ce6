"""DFlash proposal head: per-column argmax (spec: "After final plain RMSNorm, the mask columns go
through the selected proposal head"; CONTRACTS C2 decision, C4 ties).

    logits[b,i,r] = head[r] . hidden[b,i]          (FP32 accumulation; logits are not rounded)
    global id of row r: r (full Text head) or shortlist[r] (indexed head)
    rows whose global id >= vocab_size are never chosen
    row = argmax_r logits, the lowest row wins ties;  tokens = global id of that row

Mask column i predicts the token at its own position F+1+i: there is no next-token shift, so
tokens[:, i] reads hidden[:, i] only. The proposal q is the point mass on that token.
``tokens.margin`` is winner minus runner-up logit: 0 for an exact tie, inf with one eligible row.
"""

from __future__ import annotations

import numpy as np

from reference import precision as P
from reference.backend import portable, xp
from reference.precision import work


@portable
def proposal_head(hidden, head, vocab_size, shortlist=None, forced_tokens=None) -> dict[str, np.ndarray]:
    logits = P.matmul(work(hidden), work(head).T)
    rows = head.shape[0]
    ids = xp.arange(rows, dtype=np.int64) if shortlist is None else xp.asarray(shortlist, dtype=np.int64)
    eligible = (ids >= 0) & (ids < int(vocab_size))  # negative shortlist entries are padding, as in candidate_topk
    if not eligible.any():
        raise ValueError("proposal_head: no head row has a global id below vocab_size")
    z = xp.where(eligible, logits, -np.inf)
    best = xp.argmax(z, axis=-1)  # first maximum: the lowest row wins ties (C4)
    top = xp.take_along_axis(z, best[..., None], axis=-1)
    rest = xp.where(xp.arange(rows) == best[..., None], -np.inf, z)  # z without the winner
    runner = xp.max(rest, axis=-1, keepdims=True)
    margin = xp.where(xp.isfinite(runner), top - xp.where(xp.isfinite(runner), runner, 0), np.inf)[..., 0]
    out = {"tokens": ids[best].astype(np.int32), "tokens.margin": margin.astype(np.float64)}
    if forced_tokens is not None:  # teacher forcing (C2): how far below the best is the implementation's token?
        forced = xp.asarray(forced_tokens, dtype=np.int64)[..., None]
        theirs = xp.max(xp.where(ids == forced, z, -np.inf), axis=-1)  # -inf: not an eligible id at all
        out["tokens.regret"] = (top[..., 0] - theirs).astype(np.float64)
    return out
