"""Mutants of speculative_accept: the accept test, the history, the bonus, the residual and the draws."""

from __future__ import annotations

import numpy as np

from conformance.mutants.base import Mutant, _ArgsMutant, _swap_words
from reference.precision import work
from reference.rng import Purpose, counter_of, exponential_race, key_of, philox4x32, uniform, word_to_uniform
from reference.speculative_accept import speculative_accept
from reference.target_distribution import add_to_history, argmax_with_gap, filtered_probs, penalized_logits


def _argmax_last(z) -> int:
    """argmax with ties to the highest id (the last-wins bug)."""
    z = np.asarray(z)
    return int(np.flatnonzero(z == z.max())[-1])


RNG_COUNTER_BUGS = ("rng_counter-words_swapped", "rng_counter-purpose_from_zero", "rng_counter-index_base1",
                    "rng_counter-position_minus1")


def _draw(seed, position, purpose, bug, index=0):
    """C3's uniform U(seed, position, purpose, index), or the counter an engine with a ``bug`` of the
    rng_counter family builds (the key and the Philox rounds stay right)."""
    if bug not in RNG_COUNTER_BUGS:
        return uniform(seed, position, purpose, index)
    index = np.asarray(index, dtype=np.int64)
    if bug == "rng_counter-position_minus1":  # the position of the proposal, not of the token it decides
        position = position - 1
    if bug == "rng_counter-purpose_from_zero":  # purpose codes counted from 0 (ACCEPT = 1, ...)
        purpose = int(purpose) - 1
    if bug == "rng_counter-index_base1":  # draw indices counted from 1
        index = index + 1
    ctr = counter_of(position, purpose, index)
    if bug == "rng_counter-words_swapped":  # (purpose, index, position lo, position hi)
        ctr = ctr[..., [2, 3, 0, 1]]
    key = np.broadcast_to(key_of(np.uint64(seed)), ctr.shape[:-1] + (2,))
    return word_to_uniform(philox4x32(ctr, key)[..., 0])


def _race(weights, seed, position, purpose, bug) -> int:
    """The exponential race of C3 (reference.rng.exponential_race) on ``_draw``'s uniforms."""
    if bug not in RNG_COUNTER_BUGS:
        return exponential_race(weights, seed, position, purpose)[0]
    support = np.flatnonzero(weights > 0)
    u = _draw(seed, position, purpose, bug, support)
    return int(support[np.argmax(np.log(weights[support]) - np.log(-np.log(u)))])


def _accept_scan(logits, proposals, live_proposals, frontier, seed, prompt_mask, output_counts, vocab_size,
                 q=None, q_ids=None, *, bug=None, **sampling):
    """speculative_accept's scan written out (C3, C5, C6) with one bug switched in by name."""
    B, W, Vr = np.shape(logits)
    K = W - 1
    tokens = np.full((B, W), -1, dtype=np.int32)
    accepted = np.zeros(B, dtype=np.int32)
    mask32 = 0xFFFFFFFF if bug == "positions_2p32" else -1  # the counter's high position word dropped

    def pos(x):
        return int(x) & mask32 if mask32 > 0 else int(x)

    for b in range(B):
        P, F, s = int(live_proposals[b]), int(frontier[b]), np.uint64(seed[b])
        if bug == "tail_extent":  # every proposal slot scanned, live_proposals ignored
            P = K
        prm = {k: v[b] for k, v in sampling.items()}
        greedy = work(prm["temperature"]) <= 0
        counts0 = np.array(output_counts[b], copy=True)
        counts = counts0

        def z_of(i, counts, b=b, prm=prm):
            return penalized_logits(logits[b, i], prompt_mask[b], counts, vocab_size, prm["repetition_penalty"],
                                    prm["frequency_penalty"], prm["presence_penalty"])

        def p_of(z, prm=prm, verified=False):
            if verified and bug == "filters_only_on_bonus":  # top-k/top-p/min-p only for the bonus token
                return filtered_probs(z, prm["temperature"], 0, 1.0, 0.0)
            return filtered_probs(z, prm["temperature"], prm["top_k"], prm["top_p"], prm["min_p"])

        def top_of(z):
            return _argmax_last(z) if bug == "greedy_ties_last_wins" else argmax_with_gap(z)[0]

        out = []
        for i in range(P):
            z, d = z_of(i, counts), int(proposals[b, i])
            if greedy:
                top = top_of(z)
                if top != d:
                    out.append(top)
                    break
            else:
                p = p_of(z, verified=True)
                qv = np.zeros(Vr, dtype=p.dtype)
                if q is None:
                    qv[d] = 1
                else:
                    np.add.at(qv, np.asarray(q_ids[b, i], dtype=np.int64), work(q[b, i]))
                purpose = Purpose.DFLASH2_PROPOSAL if bug == "rng_purpose_shared" else Purpose.ACCEPT
                u = work(_draw(s, pos(F + 1 + i), purpose, bug))
                if bug == "accept_p_q_swapped":
                    ok = u * p[d] < qv[d]
                elif bug == "coin_le_ratio":  # u q <= p: equality (and u q = 0 = p) accepts
                    ok = u * qv[d] <= p[d]
                elif bug == "coin_le_divided":  # u <= p/q: p = q = 0 gives NaN, which rejects (not a mutant:
                    with np.errstate(invalid="ignore", divide="ignore"):  # the vectors cannot tell it apart)
                        ok = bool(u <= p[d] / qv[d])
                else:
                    ok = u * qv[d] < p[d]
                if not ok:
                    r = p - qv
                    if bug == "residual_no_clamp":
                        # the zero-mass test on the unclamped sum(p - q), which is ~0 for normalized p and q
                        weights = p if abs(float(r.sum())) < 1e-6 else np.maximum(r, 0)
                    else:
                        weights = np.maximum(r, 0) if np.maximum(r, 0).sum() > 0 else p
                    if bug == "residual_sum_zero" and np.maximum(r, 0).sum() <= 0:
                        out.append(0)  # r / sum(r) = 0/0: NaN weights, and the sampler returns id 0
                        break
                    cpurpose = Purpose.ACCEPT if bug == "same_draw_reused" else Purpose.CORRECTION
                    out.append(_race(np.asarray(weights, np.float64), s, pos(F + 1 + i), cpurpose, bug))
                    break
            out.append(d)
            if bug == "penalties_last_token_only":  # the penalties see only the last accepted token
                counts = add_to_history(counts0, [d])
            elif bug != "history_not_updated":
                counts = add_to_history(counts, [d])
        else:
            # P - 1 is -1 (the last row, K) when P = 0, as Python indexing has it
            z = z_of(P - 1 if bug == "bonus_from_wrong_row" else P, counts)
            at = F + 1 + P + (1 if bug == "rng_advanced_p0" and P == 0 else 0)
            out.append(top_of(z) if greedy else _race(np.asarray(p_of(z), np.float64), s, pos(at), Purpose.BONUS, bug))
        accepted[b] = len(out) - 1
        tokens[b, : len(out)] = out
    return {"accepted": accepted, "tokens": tokens, "num_out": accepted + 1}


class _AcceptMutant(Mutant):
    op = "speculative_accept"

    def __init__(self, bug: dict | None = None):
        super().__init__({"bug": self.pitfall} if bug is None else bug)

    def speculative_accept(self, **kw):
        return self._baseline(_accept_scan, **self.bug, **kw)


class AcceptPQSwapped(_AcceptMutant):
    """Accept iff U p(d) < q(d): p and q swapped in the test."""

    pitfall = "accept_p_q_swapped"
    family = "accept_test"


class HistoryNotUpdated(_AcceptMutant):
    """Accepted proposals never join the output history during the scan (penalties see stale counts)."""

    pitfall = "history_not_updated"
    family = "filters"


class BonusFromWrongRow(_AcceptMutant):
    """The bonus drawn from p_(P-1) instead of p_P."""

    pitfall = "bonus_from_wrong_row"
    family = "bonus_from_wrong_row"


class ResidualNoClamp(_AcceptMutant):
    """C6's zero-mass test applied to sum(p - q) (always ~0): the correction comes from p."""

    pitfall = "residual_no_clamp"
    family = "residual"


class AcceptRngBatchRow(Mutant):
    """Accept, correction and bonus draws keyed by the batch row as well as the seed."""

    op, pitfall, variant = "speculative_accept", "rng_batch_row", "speculative_accept"
    family = "rng"

    def speculative_accept(self, seed, **kw):
        rows = np.arange(seed.shape[0], dtype=np.uint64)
        return self._baseline(speculative_accept, seed=seed ^ rows, **kw)


class AcceptRngKey(_ArgsMutant):
    op, pitfall, fn = "speculative_accept", "rng_key", speculative_accept
    family = "rng"

    def change(self, kw):
        return {**kw, "seed": _swap_words(kw["seed"])}


class AcceptEngineSeed(_ArgsMutant):
    op, pitfall, fn = "speculative_accept", "engine_wide_seed", speculative_accept
    family = "rng"

    def change(self, kw):
        return {**kw, "seed": np.full_like(kw["seed"], np.asarray(kw["seed"])[0])}


class AcceptVocabPadding(_ArgsMutant):
    op, pitfall, fn = "speculative_accept", "vocab_padding", speculative_accept
    family = "vocab_pad"

    def change(self, kw):
        return {**kw, "vocab_size": np.shape(kw["logits"])[-1]}


class AcceptTailExtent(_AcceptMutant):
    """live_proposals ignored: every proposal slot is verified."""

    pitfall = "tail_extent"
    family = "extent"


class AcceptPositions32(_AcceptMutant):
    """The accept/correction/bonus counter keeps the position's low 32 bits only."""

    pitfall = "positions_2p32"
    family = "rng"


class ResidualSumZeroNan(_AcceptMutant):
    """A zero-mass residual normalized by its sum (0/0): NaN weights, the sampler returns id 0."""

    pitfall = "residual_sum_zero"
    family = "residual"


class CoinLeRatio(_AcceptMutant):
    """Accept iff U q(d) <= p(d): a token with p(d) = 0 = U q(d), or U q(d) = p(d), is accepted."""

    pitfall = "coin_le_ratio"
    family = "accept_test"
    also = ("exact_tie",)


class GreedyTiesLastWins(_AcceptMutant):
    """The verifier's greedy argmax breaks ties last-wins."""

    pitfall = "greedy_ties_last_wins"
    family = "ties"
    also = ("exact_tie",)


class SameDrawReused(_AcceptMutant):
    """The correction race reuses the accept test's Philox stream (purpose ACCEPT)."""

    pitfall = "same_draw_reused"
    family = "rng"


class RngPurposeShared(_AcceptMutant):
    """The verifier's accept uniform drawn from the draft's counter range (purpose DFLASH2_PROPOSAL)."""

    pitfall = "rng_purpose_shared"
    family = "rng"


class RngAdvancedP0(_AcceptMutant):
    """A request with zero proposals still advances its position: its bonus is drawn at F + 2."""

    pitfall = "rng_advanced_p0"
    family = "rng"


class FiltersOnlyOnBonus(_AcceptMutant):
    """top-k/top-p/min-p applied only to the bonus token, not to the verified ones."""

    pitfall = "filters_only_on_bonus"
    family = "filters"


class PenaltiesLastTokenOnly(_AcceptMutant):
    """Only the last accepted token fed to the penalties at each step."""

    pitfall = "penalties_last_token_only"
    family = "filters"


# --- variants of the rng family: the key's words and the counter's fields ------------------------


class AcceptSeedLowWord(_ArgsMutant):
    """The seed held in 32 bits: key = (seed & 0xffffffff, 0), the high key word lost."""

    op, pitfall, fn = "speculative_accept", "rng_seed_low_word", speculative_accept
    family = "rng"

    def change(self, kw):
        return {**kw, "seed": np.asarray(kw["seed"], np.uint64) & np.uint64(0xFFFFFFFF)}


class _CounterMutant(_AcceptMutant):
    pitfall, family = "rng_counter", "rng"

    def __init__(self, bug: dict | None = None):
        Mutant.__init__(self, {"bug": self.key} if bug is None else bug)


class RngCounterWordsSwapped(_CounterMutant):
    """Counter words in the wrong order: (purpose, index, position lo, position hi)."""

    variant = "words_swapped"


class RngPurposeFromZero(_CounterMutant):
    """Purpose codes counted from 0 (ACCEPT = 1, CORRECTION = 2, BONUS = 3): every draw takes another
    purpose's stream (the accept coin the draft's)."""

    variant = "purpose_from_zero"


class RngIndexBase1(_CounterMutant):
    """Draw indices counted from 1: the accept coin at index 1, the race's token v at index v + 1."""

    variant = "index_base1"


class RngPositionMinus1(_CounterMutant):
    """Draws keyed by the position of the proposal's input (F + i) instead of the token it decides
    (F + 1 + i)."""

    variant = "position_minus1"
