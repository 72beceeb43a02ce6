"""Frontend preview and commit of one verified block (spec: "Frontend preview
chooses the final prefix length N"; CONTRACTS C6).

Per request, with y_1..y_L the licensed tokens (L = num_out), anchor a,
target frontier F and context frontier F_ctx:

    N = L
    N = 0                                 if cancelled
    N = min(N, j)                         j = 1-based index of the first y_j in eos_ids or stop_ids (kept)
    N = min(N, max(budget, 0))            the remaining budget caps it last
    committed   = [a, y_1 .. y_(N-1)]     target input rows, -1 padded to W
    published   = [y_1 .. y_N]            -1 padded to W
    next_anchor = y_N                     -1 when N = 0
    frontier    = F + N
    ctx_frontier = F_ctx                  the context stays behind ...
    pending     = frontier - ctx_frontier ... by the N captured feature rows, until catch-up

Every licensed token is published as is: a token equal to the draft's
mask_token_id is an ordinary output (stripping it is a known bug). A proposal
only starts from a caught-up context, so the input must have F_ctx = F; the
coverage helpers below refuse a state whose frontiers and pending rows disagree,
and a checkpoint, fork or Host replica of a state that still has pending rows.
"""

from __future__ import annotations

import numpy as np


class CoverageError(ValueError):
    """Target frontier, context frontier and pending feature rows disagree, or
    an operation needs a caught-up context and the state has pending rows."""


def check_coverage(frontier, ctx_frontier, pending) -> None:
    """Refuse a state unless ctx_frontier + pending == frontier with pending >= 0, elementwise."""
    f, c, n = (np.asarray(x, dtype=np.int64) for x in (frontier, ctx_frontier, pending))
    bad = (n < 0) | (c < 0) | (c + n != f)
    if np.any(bad):
        i = tuple(int(k) for k in np.argwhere(np.atleast_1d(bad))[0])
        fi, ci, ni = (int(np.atleast_1d(x)[i]) for x in (f, c, n))
        raise CoverageError(
            f"coverage disagrees at request {i}: target frontier {fi}, context frontier {ci}, "
            f"pending rows {ni} (need context frontier + pending = target frontier)"
        )


def catch_up(frontier, ctx_frontier, pending) -> tuple[np.ndarray, np.ndarray]:
    """Materialize the pending feature rows: returns (ctx_frontier, pending) = (frontier, 0)."""
    check_coverage(frontier, ctx_frontier, pending)
    f = np.array(frontier, dtype=np.int64, copy=True)
    return f, np.zeros_like(f)


def require_caught_up(frontier, ctx_frontier, pending, what: str = "checkpoint") -> None:
    """A proposal, checkpoint, fork or Host replica needs pending == 0 (catch up first)."""
    check_coverage(frontier, ctx_frontier, pending)
    if np.any(np.asarray(pending) != 0):
        raise CoverageError(
            f"{what} needs a caught-up context: {np.asarray(pending).tolist()} pending rows; catch up first"
        )


def preview_length(tokens, num_out, budget, cancel, eos_ids, stop_ids) -> int:
    """N for one request."""
    if cancel:
        return 0
    ends = np.isin(tokens[:num_out], np.concatenate([np.ravel(eos_ids), np.ravel(stop_ids)]))
    n = int(np.argmax(ends)) + 1 if ends.any() else num_out
    return min(n, max(int(budget), 0))


def preview_commit(
    tokens, num_out, anchor, frontier, ctx_frontier, budget, cancel, eos_ids, stop_ids, mask_token_id=None
) -> dict[str, np.ndarray]:
    """The Op (C6). ``mask_token_id`` is accepted and deliberately unused: the mask id publishes like any token."""
    tokens = np.asarray(tokens)
    B, W = tokens.shape
    frontier = np.asarray(frontier, dtype=np.int64)
    ctx_frontier = np.asarray(ctx_frontier, dtype=np.int64)
    # the block was proposed, so the context had caught up: no pending rows come in
    check_coverage(frontier, ctx_frontier, np.zeros_like(frontier))
    n = np.zeros(B, dtype=np.int32)
    committed = np.full((B, W), -1, dtype=np.int32)
    published = np.full((B, W), -1, dtype=np.int32)
    next_anchor = np.full(B, -1, dtype=np.int32)
    for b in range(B):
        L = int(num_out[b])
        if not 1 <= L <= W or np.any(tokens[b, :L] < 0):
            raise ValueError(f"preview_commit: request {b} licenses {L} tokens {tokens[b].tolist()} (need 1..{W})")
        N = preview_length(tokens[b], L, budget[b], cancel[b], eos_ids, stop_ids)
        n[b] = N
        if N:
            committed[b, 0] = anchor[b]
            committed[b, 1:N] = tokens[b, : N - 1]
            published[b, :N] = tokens[b, :N]
            next_anchor[b] = tokens[b, N - 1]
    new_frontier = frontier + n
    pending = new_frontier - ctx_frontier
    check_coverage(new_frontier, ctx_frontier, pending)
    return {
        "n": n,
        "committed": committed,
        "published": published,
        "next_anchor": next_anchor,
        "frontier": new_frontier,
        "ctx_frontier": ctx_frontier.copy(),
        "pending": pending,
    }
