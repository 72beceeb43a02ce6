"""DFlash2 candidate selector: a left-to-right conditional walk over the top-k
candidates (spec: "Let predecessor/successor codebooks have shape [vocab_size,R]";
CONTRACTS C1 for g BF16, u FP32, codebooks BF16, q FP32; C3 for the draw; C4 for
the greedy tie rule).

    g_i = W_hidden h_i                                       represented BF16
    pred_token(i, p) = anchor if i = 0, else C_(i-1)[p]
    E_i[p, c] = u_i[c] + sum_r W_pred[pred_token(i, p), r] * g_i[r] * W_succ[C_i[c], r]

The walk reads only the row of the actually selected predecessor, p = j_(i-1):
    temperature <= 0:  j_i = lowest-rank argmax_c E_i[j_(i-1), c],  q_i = one_hot(j_i)
    temperature > 0:   q_i = softmax_c(E_i[j_(i-1), c] / temperature)   represented FP32
                       j_i ~ q_i by the exponential race over q_i's FP32 values, keyed
                       (seed[b], frontier[b] + i, DFLASH2_PROPOSAL, index = rank)
    tokens_i = C_i[j_i]

The batch row never enters the key: a request gets the same walk in any row.
Margins (C2): greedy, E of the winner minus the best other E (0: an exact tie decided
by rank); sampled, the race's log-ratio of winner to runner-up; inf with one contender.

``forced_g`` [B,K,R]: the walk on an implementation's g instead of the reference's.
``forced_path`` [B,K] (teacher forcing): step i takes forced_path[:, i-1] as its
predecessor instead of its own j_(i-1), while still reporting its own choice, margin
and q at step i.
"""

from __future__ import annotations

import numpy as np

from reference import precision as P
from reference import scales
from reference.precision import represent, work
from reference.rng import Purpose, exponential_race, uniform


def _walked(chosen: int, e) -> int:
    """The rank the walk continues from: the one the step chose (sampled, greedy or forced)."""
    return chosen


def _greedy(e) -> tuple[int, float]:
    j = int(np.argmax(e))  # first maximum: the lowest rank wins ties (C4)
    others = np.delete(e, j)
    return j, float(e[j] - others.max()) if others.size else float("inf")


def _softmax(x) -> np.ndarray:
    x = P.exp(x - x.max())
    return x / x.sum()


def candidate_selector(
    hidden, scores, ids, anchor, w_hidden, w_pred, w_succ, temperature, seed, frontier, forced_path=None, forced_g=None
) -> dict[str, np.ndarray]:
    """hidden [B,K,H], scores/ids [B,K,k], anchor/temperature/seed/frontier [B], w_hidden [R,H],
    w_pred/w_succ [V,R] -> g [B,K,R] BF16, path/tokens [B,K] int32, q [B,K,k] FP32."""
    g = represent(P.matmul(work(hidden), work(w_hidden).T), "bf16") if forced_g is None else \
        work(np.asarray(forced_g, np.float64))  # following an implementation's own g (C2 v2)
    u = work(scores)
    ids = np.asarray(ids, dtype=np.int64)
    w_pred, w_succ = work(w_pred), work(w_succ)
    nb, nk, top = ids.shape
    path = np.zeros((nb, nk), dtype=np.int32)
    margin = np.zeros((nb, nk))
    regret = np.zeros((nb, nk))
    q = np.zeros((nb, nk, top), dtype=g.dtype)
    # magnitudes in FP32 units (C2 v2): q's envelope, and the scores each margin compares
    q_scale = np.zeros((nb, nk, top))
    step_scale = np.zeros((nb, nk))
    for b in range(nb):
        t = float(np.asarray(temperature)[b])
        pred_token = int(anchor[b])
        for i in range(nk):
            e = u[b, i] + P.matmul(w_succ[ids[b, i]], w_pred[pred_token] * g[b, i])
            prod = np.abs(np.asarray(w_pred[pred_token] * g[b, i], np.float64))
            se = np.abs(np.asarray(u[b, i], np.float64)) + np.abs(np.asarray(w_succ[ids[b, i]], np.float64)) @ prod
            p = None if forced_path is None else int(forced_path[b, i])
            if t <= 0:
                j, m = _greedy(e)
                q[b, i, j if p is None else p] = 1  # the actual q: one-hot at the choice the walk took
                score = e.astype(np.float64)
                step_scale[b, i] = scales.greedy_scale(score, se)
            else:
                q[b, i] = represent(_softmax(e / e.dtype.type(t)), "fp32")
                position = int(frontier[b]) + i  # absolute position F + i, past 2^32 as well
                j, m = exponential_race(q[b, i], np.uint64(seed[b]), position, Purpose.DFLASH2_PROPOSAL)
                y = np.asarray(e, np.float64) / t
                q_scale[b, i] = scales.softmax_scale(q[b, i], y, (se + np.abs(y) * t) / t + np.abs(y),
                                                     np.ones(top, bool))
                step_scale[b, i] = scales.race_scale(q[b, i], q_scale[b, i], np.uint64(seed[b]), position,
                                                     Purpose.DFLASH2_PROPOSAL)
                score = _race_scores(q[b, i], np.uint64(seed[b]), position) if p is not None else None
            path[b, i], margin[b, i] = j, m
            if p is None:
                p = j
            else:  # teacher forcing: how far below the winner the implementation's choice scored
                regret[b, i] = score[j] - score[p] if 0 <= p < top else np.inf
            pred_token = int(ids[b, i, _walked(p, e)])
    tokens = np.take_along_axis(ids, path[..., None].astype(np.int64), axis=-1)[..., 0].astype(np.int32)
    out = {
        "g": g,
        "path": path,
        "path.margin": margin,
        "tokens": tokens,
        "tokens.margin": margin.copy(),
        "q": q,
        "q.scale": q_scale,
        "path.scale": step_scale,
        "tokens.scale": step_scale.copy(),
    }
    if forced_path is not None:
        out["path.regret"], out["tokens.regret"] = regret, regret.copy()
    return out


def _race_scores(q, seed, position) -> np.ndarray:
    """log(q_c) - log(-log U_c) per rank (the exponential race's scores, C3); -inf where q_c = 0."""
    q = np.asarray(q, dtype=np.float64)
    u = uniform(seed, position, Purpose.DFLASH2_PROPOSAL, np.arange(q.size))
    with np.errstate(divide="ignore"):
        return np.where(q > 0, P.log(q) - P.log(-P.log(u)), -np.inf)
