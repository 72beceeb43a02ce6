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
from reference.precision import work


def proposal_head(hidden, head, vocab_size, shortlist=None, forced_tokens=None) -> dict[str, np.ndarray]:
    logits = P.matmul(work(hidden), work(head).T)
    rows = head.shape[0]
    ids = np.arange(rows, dtype=np.int64) if shortlist is None else np.asarray(shortlist, dtype=np.int64)
    eligible = (ids >= 0) & (ids < int(vocab_size))  # negative shortlist entries are padding, as in candidate_topk
    if not eligible.any():
        raise ValueError("proposal_head: no head row has a global id below vocab_size")
    z = np.where(eligible, logits, -np.inf)
    best = np.argmax(z, axis=-1)  # first maximum: the lowest row wins ties (C4)
    top = np.take_along_axis(z, best[..., None], axis=-1)
    rest = z.copy()
    np.put_along_axis(rest, best[..., None], -np.inf, axis=-1)
    runner = np.max(rest, axis=-1, keepdims=True)
    margin = np.where(np.isfinite(runner), top - np.where(np.isfinite(runner), runner, 0), np.inf)[..., 0]
    out = {"tokens": ids[best].astype(np.int32), "tokens.margin": margin.astype(np.float64)}
    if forced_tokens is not None:  # teacher forcing (C2): how far below the best is the implementation's token?
        forced = np.asarray(forced_tokens, dtype=np.int64)[..., None]
        theirs = np.max(np.where(ids == forced, z, -np.inf), axis=-1)  # -inf: not an eligible id at all
        out["tokens.regret"] = (top[..., 0] - theirs).astype(np.float64)
    return out
