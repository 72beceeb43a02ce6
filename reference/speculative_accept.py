"""Target verification of one proposal block (spec: verification; CONTRACTS C3, C5, C6).

Per request b with P = live_proposals[b] proposals d_1..d_P, frontier F and seed s,
for i = 0 .. P-1, with p_i the C5 distribution of logit row i whose output
history includes d_1..d_i (accepted proposals join the history first):

    greedy (temperature <= 0):  accept d_(i+1) iff d_(i+1) = argmax p_i
    sampled:                     accept d_(i+1) iff U * q_i(d_(i+1)) < p_i(d_(i+1)),
                                 U = uniform(s, F+1+i, ACCEPT, 0)
    on the first rejection:      r_i(v) = max(p_i(v) - q_i(v), 0)
                                 correction ~ r_i / sum_v r_i(v)   (from p_i when sum_v r_i(v) = 0)
                                 by the exponential race at F+1+i, purpose CORRECTION, index = token id;
                                 greedy: correction = argmax p_i
    all P accepted:              bonus ~ p_P (logit row P) at F+1+P, purpose BONUS; greedy: argmax p_P

q_i is one-hot at d_(i+1) when ``q``/``q_ids`` are absent (DFlash); otherwise the
retained DFlash2 distribution q_i(v) = q[b, i, c] for q_ids[b, i, c] = v.
With A accepted, tokens[b] = y_1 .. y_(A+1) = d_1 .. d_A, correction_or_bonus, then -1;
num_out = A + 1. The batch row never enters a random key.

Margins (C2): an accept test's signed distance is p_i(d) - U q_i(d) (sampled) or,
greedy, the processed-logit lead of the argmax over d (d not the argmax) or of d
over the runner-up (d the argmax). ``tokens.margin`` holds |distance| of the test
that placed d at positions < A, and the draw's margin at position A (race
log-ratio; greedy: top-1 minus top-2 processed logit); inf past L.
``accepted.margin`` is the smallest |distance| of the tests performed: flipping
any of them changes A.

Teacher forcing: with ``forced_tokens`` [B, W] (an implementation's tokens, -1
past its L), the scan follows that implementation's accept count A' = L' - 1
(at most P): it accepts exactly the first A' proposals into the history, stops
at step A', and reports at each step the reference's own choice and margin.
num_out is then A' + 1; ``accepted`` is the reference's own count along that
path (the first step it would reject, or one past the path if it never would).
``tokens.regret`` scores each of the implementation's tokens: 0 where it is ours; the
accept test's |distance| where it kept a proposal we reject; where it rejected, the
larger of that test's distance (if we accept) and how far its correction's race score
(greedy: processed logit) sits below ours; inf for a token its distribution cannot
produce. The harness accepts a divergence only within tolerance of that regret.
"""

from __future__ import annotations

import numpy as np

from reference import scales
from reference.precision import work
from reference.rng import Purpose, exponential_race, uniform
from reference.target_distribution import add_to_history, argmax_with_gap, filtered_probs, penalized_logits

INF = float("inf")


class _Row:
    """The C5 pipeline of one request, with its growing output history."""

    def __init__(self, b, logits, prompt_mask, output_counts, vocab_size, params):
        self.logits = logits[b]
        self.prompt = prompt_mask[b]
        self.counts = np.array(output_counts[b], copy=True)
        self.vocab_size = vocab_size
        self.p = {k: v[b] for k, v in params.items()}
        self.greedy = work(self.p["temperature"]) <= 0

    def z(self, i) -> np.ndarray:
        p = self.p
        return penalized_logits(
            self.logits[i],
            self.prompt,
            self.counts,
            self.vocab_size,
            p["repetition_penalty"],
            p["frequency_penalty"],
            p["presence_penalty"],
        )

    def z_magnitude(self, i) -> np.ndarray:
        """s of row i's processed logits in FP32 units (C2 v2: the decisions' ambiguity band)."""
        p = self.p
        return scales.penalized_magnitude(self.logits[i], self.prompt, self.counts, self.vocab_size,
                                          p["repetition_penalty"], p["frequency_penalty"], p["presence_penalty"])

    def probs(self, z) -> np.ndarray:
        p = self.p
        return filtered_probs(z, p["temperature"], p["top_k"], p["top_p"], p["min_p"])

    def accept(self, token) -> None:
        self.counts = add_to_history(self.counts, [token])


def _q_vector(q, q_ids, b, i, proposal, size, dtype) -> np.ndarray:
    qv = np.zeros(size, dtype=dtype)
    if q is None:
        qv[proposal] = 1
    else:
        np.add.at(qv, np.asarray(q_ids[b, i], dtype=np.int64), work(q[b, i]))
    return qv


def _greedy_test(z, d) -> tuple[bool, float]:
    top, gap = argmax_with_gap(z)
    if top == d:
        return True, gap
    return False, -float(z[top] - z[d]) if np.isfinite(z[d]) else -INF


def _bonus_row(live: int) -> int:
    """The logit row the bonus is drawn from once all ``live`` proposals are accepted: row P (C6)."""
    return live


def _accept_distance(p_d, q_d, u) -> float:
    """Signed distance of the accept test U q(d) < p(d): accept iff positive."""
    return float(p_d - u * q_d)


def _correction_weights(p, qv) -> np.ndarray:
    """r = max(p - q, 0), or p itself when r has no mass (C6)."""
    r = np.maximum(p - qv, 0)
    return r if r.sum() > 0 else p


def _draw(weights, seed, position, purpose) -> tuple[int, float]:
    return exponential_race(np.asarray(weights, dtype=np.float64), seed, position, purpose)


def _race_regret(weights, seed, position, purpose, ours: int, theirs: int) -> float:
    """How far the implementation's draw ``theirs`` scored below the race winner ``ours`` (C3
    scores log r - log(-log U)); inf for a token the distribution cannot produce."""
    w = np.asarray(weights, dtype=np.float64)
    if not 0 <= theirs < w.size or w[theirs] <= 0:
        return INF
    if theirs == ours:
        return 0.0
    u = uniform(seed, position, purpose, np.array([ours, theirs]))
    score = np.log(w[[ours, theirs]]) - np.log(-np.log(u))
    return float(score[0] - score[1])


def _logit_regret(z, ours: int, theirs: int) -> float:
    """Greedy: how far the implementation's token sits below the argmax (processed logits)."""
    if not 0 <= theirs < z.size or not np.isfinite(z[theirs]):
        return INF
    return float(z[ours] - z[theirs])


def _forced_count(forced_row, P) -> int:
    valid = np.flatnonzero(np.asarray(forced_row) < 0)
    length = int(valid[0]) if valid.size else np.size(forced_row)
    return min(max(length - 1, 0), P)


def speculative_accept(
    logits,
    proposals,
    live_proposals,
    frontier,
    seed,
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
    q=None,
    q_ids=None,
    forced_tokens=None,
) -> dict[str, np.ndarray]:
    """The Op (C3, C5, C6). Returns accepted, tokens, num_out and the decision margins."""
    if (q is None) != (q_ids is None):
        raise ValueError("speculative_accept: q and q_ids come together (retained q) or not at all (one-hot q)")
    B, W, Vr = np.shape(logits)
    K = W - 1
    params = {
        "temperature": temperature,
        "top_p": top_p,
        "min_p": min_p,
        "repetition_penalty": repetition_penalty,
        "frequency_penalty": frequency_penalty,
        "presence_penalty": presence_penalty,
        "top_k": top_k,
    }
    accepted = np.zeros(B, dtype=np.int32)
    tokens = np.full((B, W), -1, dtype=np.int32)
    num_out = np.zeros(B, dtype=np.int32)
    acc_margin = np.full(B, INF)
    tok_margin = np.full((B, W), INF)
    # the magnitude of the scores each margin compares (FP32 units, C2 v2), element by element
    acc_scale = np.zeros(B)
    tok_scale = np.zeros((B, W))
    regret = np.zeros((B, W))  # teacher forcing: how far each of the implementation's tokens is from ours
    for b in range(B):
        P = int(live_proposals[b])
        if not 0 <= P <= K:
            raise ValueError(f"speculative_accept: live_proposals[{b}] = {P} outside 0..{K}")
        F = int(frontier[b])
        s = np.uint64(seed[b])
        row = _Row(b, logits, prompt_mask, output_counts, vocab_size, params)
        forced = None if forced_tokens is None else _forced_count(forced_tokens[b], P)
        own = None  # the reference's own accept count along the path
        for i in range(P + 1):
            r = i if i < P else _bonus_row(P)
            z = row.z(r)
            p = None if row.greedy else row.probs(z)
            sz = row.z_magnitude(r)
            sp = None if row.greedy else scales.probs_scale(z, sz, float(row.p["temperature"]), p)
            theirs = None if forced is None else int(forced_tokens[b, i])
            if i == P:  # every proposal on the path was accepted: the bonus from row P
                if row.greedy:
                    tokens[b, i], tok_margin[b, i] = argmax_with_gap(z)
                    tok_scale[b, i] = scales.greedy_scale(z, sz)
                else:
                    tokens[b, i], tok_margin[b, i] = _draw(p, s, F + 1 + P, Purpose.BONUS)
                    tok_scale[b, i] = scales.race_scale(p, sp, s, F + 1 + P, Purpose.BONUS)
                if theirs is not None:
                    ours = int(tokens[b, i])
                    regret[b, i] = (_logit_regret(z, ours, theirs) if row.greedy
                                    else _race_regret(p, s, F + 1 + P, Purpose.BONUS, ours, theirs))
                own = P if own is None else own
                break
            d = int(proposals[b, i])
            if row.greedy:
                ok, dist = _greedy_test(z, d)
                dist_scale = scales.greedy_scale(z, sz)
            else:
                qv = _q_vector(q, q_ids, b, i, d, Vr, p.dtype)
                u = work(uniform(s, F + 1 + i, Purpose.ACCEPT))
                dist = _accept_distance(p[d], qv[d], u)
                dist_scale = float(sp[d] + abs(u * qv[d]))
                ok = dist > 0
            if abs(dist) < acc_margin[b]:
                acc_margin[b], acc_scale[b] = abs(dist), dist_scale
            if ok:
                tokens[b, i], tok_margin[b, i], tok_scale[b, i] = d, abs(dist), dist_scale
            else:
                own = i if own is None else own
                if row.greedy:
                    tokens[b, i], tok_margin[b, i] = argmax_with_gap(z)
                    tok_scale[b, i] = dist_scale
                else:
                    weights = _correction_weights(p, qv)
                    tokens[b, i], tok_margin[b, i] = _draw(weights, s, F + 1 + i, Purpose.CORRECTION)
                    tok_scale[b, i] = scales.race_scale(weights, sp, s, F + 1 + i, Purpose.CORRECTION)
            if theirs is not None:
                they_accept = i < forced
                if they_accept:  # their token is d: wrong only if the accept test was clearly a reject
                    regret[b, i] = 0.0 if ok else abs(dist)
                else:  # they rejected: the test must be near its threshold, and their correction near ours
                    flip = 0.0 if not ok else abs(dist)
                    if row.greedy:
                        corr_z = z
                        ours = argmax_with_gap(corr_z)[0]
                        draw = _logit_regret(corr_z, ours, theirs)
                    else:
                        weights = _correction_weights(p, qv)
                        ours = _draw(weights, s, F + 1 + i, Purpose.CORRECTION)[0]
                        draw = _race_regret(weights, s, F + 1 + i, Purpose.CORRECTION, ours, theirs)
                    regret[b, i] = max(flip, draw)
            if not (ok if forced is None else i < forced):
                own = i + 1 if own is None else own  # forced to stop where the reference would go on
                break
            row.accept(d)
        accepted[b] = own
        num_out[b] = i + 1
    out = {
        "accepted": accepted,
        "accepted.margin": acc_margin,
        "accepted.scale": acc_scale,
        "tokens": tokens,
        "tokens.margin": tok_margin,
        "tokens.scale": tok_scale,
        "num_out": num_out,
    }
    if forced_tokens is not None:
        out["tokens.regret"] = regret
    return out
