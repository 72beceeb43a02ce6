"""Target distribution p_i (CONTRACTS C5, C4 for order and ties).

From the target's logit row z over the padded vocabulary, in this order:

    1. rows >= vocab_size get -inf
    2. repetition penalty rho over prompt and output history:  z > 0 -> z / rho, else z * rho
    3. frequency f, presence r over output history only:       z -= f * count + r * [count > 0]
    4. temperature <= 0: p = one_hot(argmax z), lowest id on ties
    5. z /= temperature
    6. top-k: keep ranks < k, order value descending, ties to the lower id
    7. top-p: in that order, keep the shortest prefix whose mass reaches top_p (at least one)
    8. min-p: drop tokens whose probability is below min_p * the largest
    9. softmax over the kept tokens

Disabled: top_k <= 0, top_p >= 1, min_p <= 0, rho == 1. The top-p mass is
measured on the distribution renormalized over the tokens top-k kept (the usual
engine order: mask, softmax, cumulative sum); min-p is invariant to that choice
because it compares ratios to the largest probability, which every filter keeps.
The output history is ``output_counts`` (count > 0 is "seen"); the scan of
speculative_accept grows it with ``add_to_history`` before forming the next p_i.
"""

from __future__ import annotations

import numpy as np

from reference import precision as P
from reference.precision import represent, work


def penalized_logits(
    logits, prompt_mask, output_counts, vocab_size: int, repetition_penalty, frequency_penalty, presence_penalty
) -> np.ndarray:
    """Steps 1-3 on one row: the processed logits z (greedy decides on these)."""
    z = work(logits).copy()
    z[int(vocab_size) :] = -np.inf
    counts = work(output_counts)
    seen_out = np.asarray(output_counts) > 0
    rho = work(repetition_penalty)
    if rho != 1:
        seen = (np.asarray(prompt_mask) != 0) | seen_out
        z = np.where(seen, np.where(z > 0, z / rho, z * rho), z)
    # -inf rows stay -inf: subtracting a finite penalty cannot revive them
    return z - (work(frequency_penalty) * counts + work(presence_penalty) * seen_out.astype(z.dtype))


def c4_order(z) -> np.ndarray:
    """Indices by value descending, ties to the lower id (C4): a stable sort of -z."""
    return np.argsort(-z, kind="stable")


def argmax_with_gap(z) -> tuple[int, float]:
    """C4 argmax (lowest id on ties) and its lead over the runner-up (inf if none is finite)."""
    order = c4_order(z)
    best = int(order[0])
    if z.size < 2 or not np.isfinite(z[order[1]]):
        return best, float("inf")
    return best, float(z[best] - z[order[1]])


def _softmax_kept(z, keep) -> np.ndarray:
    zk = np.where(keep, z, -np.inf)
    e = P.exp(zk - zk[keep].max())
    return e / e.sum()


def _top_p_count(cum, top_p) -> int:
    """How many tokens top-p keeps: the shortest prefix whose cumulative mass reaches top_p."""
    return int(np.searchsorted(cum, top_p, side="left")) + 1


def filtered_probs(z, temperature, top_k, top_p, min_p) -> np.ndarray:
    """Steps 4-9 on processed logits z (working precision, not yet represented)."""
    t = work(temperature)
    if t <= 0:
        p = np.zeros_like(z)
        p[argmax_with_gap(z)[0]] = 1
        return p
    z = z / t
    order = c4_order(z)
    keep = np.isfinite(z)
    k = int(top_k)
    if k > 0:
        keep[order[k:]] = False
    tp = work(top_p)
    if tp < 1:
        kept_order = order[keep[order]]
        cum = np.cumsum(_softmax_kept(z, keep)[kept_order])
        n = _top_p_count(cum, tp)
        keep[kept_order[min(n, kept_order.size) :]] = False
    mp = work(min_p)
    if mp > 0:
        p = _softmax_kept(z, keep)
        keep &= ~(p < mp * p.max())
    return _softmax_kept(z, keep)


def row_probs(
    logits,
    prompt_mask,
    output_counts,
    vocab_size: int,
    temperature,
    top_p,
    min_p,
    repetition_penalty,
    frequency_penalty,
    presence_penalty,
    top_k,
) -> np.ndarray:
    """p for one row, in working precision (speculative_accept decides on this)."""
    z = penalized_logits(
        logits, prompt_mask, output_counts, vocab_size, repetition_penalty, frequency_penalty, presence_penalty
    )
    return filtered_probs(z, temperature, top_k, top_p, min_p)


def add_to_history(output_counts, tokens) -> np.ndarray:
    """Output history after accepting ``tokens`` (a copy; the repetition penalty reads count > 0)."""
    counts = np.array(output_counts, copy=True)
    np.add.at(counts, np.asarray(tokens, dtype=np.int64), 1)
    return counts


def target_distribution(
    logits,
    prompt_mask,
    output_counts,
    temperature,
    top_p,
    min_p,
    repetition_penalty,
    frequency_penalty,
    presence_penalty,
    top_k,
    vocab_size,
) -> dict[str, np.ndarray]:
    """The Op: probs [N, Vr] (represented fp32), one row per logit row (C5)."""
    rows = [
        row_probs(
            logits[n],
            prompt_mask[n],
            output_counts[n],
            vocab_size,
            temperature[n],
            top_p[n],
            min_p[n],
            repetition_penalty[n],
            frequency_penalty[n],
            presence_penalty[n],
            top_k[n],
        )
        for n in range(np.shape(logits)[0])
    ]
    return {"probs": represent(np.stack(rows) if rows else work(np.zeros(np.shape(logits))), "fp32")}
