"""DFlash2 unary candidates: stable top-k of the proposal head (spec: "For each mask
hidden h_i, the selected head produces stable top-16 unary scores u_i and global token
IDs C_i"; CONTRACTS C4 for the order and the transform, C1 for the FP32 scores).

    z[b,i,r] = head[r] . hidden[b,i]            r a head row; global id gid(r) = r, or
                                                 shortlist[r] for an indexed head
    rows with gid(r) >= vocab_size (or < 0) take no part
    C_i = gid of the k rows ordered by z descending, ties to the lower row index
    u_i = c * tanh(m * z / c)  on the selected rows, in float, represented FP32
          (m = output_multiplier, c = softcap; 0 = off: m only -> m z, c only -> c tanh(z / c))

Selection uses the raw logits; the transform comes after (C4). ``ids.margin`` at
rank r is min(s_(r-1) - s_r, s_r - s_(r+1)) over the raw logits in order s, where
rank k-1's lower neighbour is the best row left out (inf where there is none): 0 for
an exact tie that the row order decided.

``forced_ids`` (teacher forcing, C2) gives global ids chosen by an implementation:
the scores are then those of the forced ids (NaN for an id that names no eligible
row), while ``ids`` and its margin stay the reference's own choice.
"""

from __future__ import annotations

import numpy as np

from reference import precision as P
from reference.backend import portable, xp
from reference.precision import inter, represent, work


def _global_ids(n_rows: int, shortlist) -> np.ndarray:
    if shortlist is None:
        return xp.arange(n_rows, dtype=np.int64)
    gid = xp.asarray(shortlist, dtype=np.int64)
    if gid.shape != (n_rows,):
        raise ValueError(f"candidate_topk: shortlist has shape {gid.shape}, head has {n_rows} rows")
    return gid


def _transform(z, output_multiplier: float, softcap: float) -> np.ndarray:
    one = z.dtype.type
    if output_multiplier > 0:
        z = z * one(output_multiplier)
    if softcap > 0:
        c = one(softcap)
        z = c * P.tanh(z / c)
    return z


def _ranked(z, output_multiplier: float, softcap: float):
    """The values the selection orders: the raw logits (C4), not the transformed scores."""
    return z


def _forced_rows(forced_ids, gid, eligible) -> np.ndarray:
    """Head row of each forced global id (the lowest eligible row holding it; -1: none)."""
    rows = xp.flatnonzero(eligible)  # ascending
    order = xp.argsort(gid[rows], kind="stable")  # by id; equal ids keep the lower row first
    ids = gid[rows][order]
    forced = xp.asarray(forced_ids, dtype=np.int64)
    if ids.size == 0:
        return xp.full(forced.shape, -1, dtype=np.int64)
    at = xp.minimum(xp.searchsorted(ids, forced, side="left"), ids.size - 1)
    return xp.where(ids[at] == forced, rows[order[at]], -1).astype(np.int64)


@portable
def candidate_topk(
    hidden,
    head,
    vocab_size: int,
    top_k: int,
    output_multiplier: float = 0.0,
    softcap: float = 0.0,
    shortlist=None,
    forced_ids=None,
) -> dict[str, np.ndarray]:
    """hidden [B,K,H], head [Vr,H], shortlist [Vr] -> scores [B,K,k] FP32, ids [B,K,k] int32."""
    with np.errstate(invalid="ignore"):  # inf hidden times a zero head row: a NaN logit, on purpose
        z = inter(P.matmul(work(hidden), work(head).T), "logits")  # [B,K,Vr]
    gid = _global_ids(z.shape[-1], shortlist)
    eligible = (gid >= 0) & (gid < vocab_size)
    n_eligible = int(eligible.sum())
    if n_eligible < top_k:
        raise ValueError(f"candidate_topk: {n_eligible} eligible rows, top_k = {top_k}")

    # a stable sort on -z keeps equal logits in row order: the C4 tie rule
    ranked = _ranked(z, output_multiplier, softcap)
    key = xp.where(eligible, -ranked, np.inf)
    order = xp.argsort(key, axis=-1, kind="stable")[..., : min(top_k + 1, n_eligible)]
    s = xp.take_along_axis(ranked, order, axis=-1).astype(np.float64)
    rows = order[..., :top_k]

    with np.errstate(invalid="ignore"):  # a NaN score, or two equal infinite ones, has a NaN gap: left NaN
        gaps = s[..., :-1] - s[..., 1:]  # gap below each rank that has a successor
    inf = xp.full(s.shape[:-1] + (1,), np.inf)
    above = xp.concatenate([inf, gaps[..., : top_k - 1]], axis=-1)
    below = gaps[..., :top_k] if n_eligible > top_k else xp.concatenate([gaps, inf], axis=-1)
    margin = xp.minimum(above, below)

    regret = None
    if forced_ids is not None:
        rows = _forced_rows(forced_ids, gid, eligible)
        forced = xp.asarray(forced_ids, dtype=np.int64)
        repeated = (forced[..., :, None] == forced[..., None, :]).sum(axis=-1) > 1
        rows = xp.where(repeated, -1, rows)  # an id listed twice is no top-k
    picked = xp.take_along_axis(z, xp.maximum(rows, 0), axis=-1)
    picked = xp.where(rows >= 0, picked, np.nan)
    if forced_ids is not None:
        # how far the implementation's id at each rank is from the reference's (raw logits): an
        # ambiguous rank may hold a near-tied id, never an arbitrary one
        regret = xp.where(rows >= 0, xp.abs(s[..., :top_k] - xp.where(rows >= 0, picked, 0)), np.inf)
    scores = represent(_transform(picked, output_multiplier, softcap), "fp32")
    ids = gid[order[..., :top_k]].astype(np.int32)
    out = {"scores": scores, "ids": ids, "ids.margin": margin}
    if regret is not None:
        out["ids.regret"] = regret.astype(np.float64)
    return out
