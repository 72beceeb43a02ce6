"""Cases for speculative_accept (spec: verification; CONTRACTS C3, C5, C6).

Each request is designed for an intended accept count A (the accepted steps
get a high p_i(d), the rejecting step a low one) and redrawn from the case's
generator until the reference scan lands on that A with every decision at
least MARGIN from flipping (C2: unambiguous), except in the exact_tie cases.
Pitfall cases are built so the named bug changes a decision or a token:

- accept_p_q_swapped: the rejecting step has p(d) < q(d) and U > p/q, so the
  swapped test U p(d) < q(d) accepts.
- history_not_updated: greedy, a repetition penalty of 4 on the accepted token
  moves the next row's argmax away from a repeated proposal; sampled, it drops
  p(d) under U.
- bonus_from_wrong_row: P < K, all accepted; rows P-1, P and K have distinct argmaxes.
- residual_no_clamp: the zero-mass test of C6 applied to sum(p - q) (always 0)
  draws the correction from p; the case requires that draw to differ.
- rng_batch_row: the same request at several rows (and the rows of another
  case permuted); a row-dependent key changes some row's tokens.
"""

from __future__ import annotations

import numpy as np

from conformance.registry import ACCEPT_TIE, DECISION, EXACT, FP32_OUTPUT, Case, OpSpec, Output, case_rng, register
from reference.rng import Purpose, exponential_race
from reference.speculative_accept import speculative_accept
from reference.target_distribution import add_to_history, row_probs

OP = "speculative_accept"
MARGIN = 0.02  # probability, logit or log-ratio units; the fp32 baseline errs by ~1e-6 in each
SAMPLING = ("temperature", "top_p", "min_p", "repetition_penalty", "frequency_penalty", "presence_penalty")
TOPK = 16  # retained q support (the DFlash2 selector's top-16)


def accept_inputs(
    logits,
    proposals,
    live_proposals,
    frontier,
    seed,
    *,
    q=None,
    q_ids=None,
    prompt_mask=None,
    output_counts=None,
    vocab_size=None,
    **sampling,
) -> tuple[dict, dict]:
    """(inputs in storage dtypes, params) for a batch; per-row sampling params broadcast from scalars."""
    logits = np.asarray(logits, dtype=np.float32)
    B, _, Vr = logits.shape
    defaults = {"temperature": 1.0, "top_p": 1.0, "min_p": 0.0, "repetition_penalty": 1.0}
    inputs = {
        "logits": logits,
        "proposals": np.asarray(proposals, dtype=np.int32).reshape(B, -1),
        "live_proposals": np.broadcast_to(np.asarray(live_proposals, dtype=np.int32), (B,)).copy(),
        "frontier": np.broadcast_to(np.asarray(frontier, dtype=np.int64), (B,)).copy(),
        "seed": np.broadcast_to(np.asarray(seed, dtype=np.uint64), (B,)).copy(),
        "prompt_mask": np.zeros((B, Vr), np.uint8) if prompt_mask is None else np.asarray(prompt_mask, np.uint8),
        "output_counts": np.zeros((B, Vr), np.int32) if output_counts is None else np.asarray(output_counts, np.int32),
    }
    for name in SAMPLING:
        value = sampling.pop(name, defaults.get(name, 0.0))
        inputs[name] = np.broadcast_to(np.asarray(value, dtype=np.float32), (B,)).copy()
    inputs["top_k"] = np.broadcast_to(np.asarray(sampling.pop("top_k", 0), dtype=np.int32), (B,)).copy()
    if sampling:
        raise TypeError(f"accept_inputs: unknown sampling params {sorted(sampling)}")
    if q is not None:
        inputs["q"] = np.asarray(q, dtype=np.float32)
        inputs["q_ids"] = np.asarray(q_ids, dtype=np.int32)
    return inputs, {"vocab_size": int(Vr if vocab_size is None else vocab_size)}


def force(kwargs, outputs):
    """Teacher forcing (C2): follow the implementation's tokens (its accept count)."""
    return speculative_accept(**kwargs, forced_tokens=np.asarray(outputs["tokens"]))


# --- designed requests ---------------------------------------------------------------------


def _request(rng, K, P, A, V, greedy, retained, vocab, boost):
    """One request's logits [W, Vr], proposals [K] and, retained, q / q_ids [K, TOPK]."""
    W = K + 1
    logits = rng.standard_normal((W, V))
    logits[:, vocab:] = rng.uniform(5, 10, (W, V - vocab))  # padding rows would win if unmasked
    proposals = rng.integers(0, vocab, K)
    for i in range(P):
        d = proposals[i]
        if greedy:
            # accept: d leads by boost; reject: another token leads d by boost
            others = np.delete(logits[i, :vocab], d)
            logits[i, d] = others.max() + boost if i < A else others.max() - boost
        else:
            logits[i, d] += 2 * boost if i < A else -2 * boost
    logits[P + 1 :] = rng.uniform(-20, 20, (K - P, V))  # rows past the live extent are never read
    if greedy and P < K:
        # a scan that ignores live_proposals would accept d_(P+1) here (and draw the bonus elsewhere)
        proposals[P] = int(np.argmax(logits[P, :vocab]))
    q = q_ids = None
    if retained:
        q_ids = np.stack([rng.permutation(vocab)[:TOPK] for _ in range(K)])
        for i in range(K):
            if proposals[i] not in q_ids[i]:
                q_ids[i, rng.integers(TOPK)] = proposals[i]
        e = np.exp(rng.standard_normal((K, TOPK)) * 1.5)
        q = e / e.sum(-1, keepdims=True)
    return logits, proposals, q, q_ids


def _clear(out, rows=None) -> bool:
    """Every decision of the scan at least MARGIN from flipping."""
    rows = range(len(out["accepted"])) if rows is None else rows
    for b in rows:
        L = int(out["num_out"][b])
        if out["accepted.margin"][b] < MARGIN or np.any(out["tokens.margin"][b, :L] < MARGIN):
            return False
    return True


def _designed(
    case_id,
    *,
    B=1,
    K=4,
    P=None,
    A=None,
    V=64,
    vocab=None,
    greedy=False,
    retained=False,
    flags=(),
    check=None,
    seeds=None,
    frontiers=None,
    same_request=False,
    attempts=2000,
    **sampling,
) -> Case:
    """Draw requests from case_rng(case_id) until the scan accepts A[b] in each row, clearly."""
    rng = case_rng(case_id)
    P = np.broadcast_to(np.asarray(K if P is None else P), (B,))
    A = np.broadcast_to(np.asarray(P if A is None else A), (B,))
    vocab = V if vocab is None else vocab
    g = np.broadcast_to(np.asarray(greedy), (B,))
    for _ in range(attempts):
        boost = rng.uniform(0.3, 4.0)
        reqs = [_request(rng, K, P[b], A[b], V, g[b], retained, vocab, boost) for b in range(B)]
        if same_request:
            reqs = [reqs[0]] * B
        seed = rng.integers(0, 2**63, B, dtype=np.uint64) if seeds is None else seeds
        frontier = rng.integers(8, 5000, B) if frontiers is None else frontiers
        temperature = np.where(g, 0.0, rng.choice([0.6, 1.0, 1.5], B))
        inputs, params = accept_inputs(
            np.stack([r[0] for r in reqs]),
            np.stack([r[1] for r in reqs]),
            P,
            frontier,
            seed,
            q=None if not retained else np.stack([r[2] for r in reqs]),
            q_ids=None if not retained else np.stack([r[3] for r in reqs]),
            vocab_size=vocab,
            **{"temperature": temperature, **sampling},
        )
        out = speculative_accept(**inputs, **params)
        if np.array_equal(out["accepted"], A) and _clear(out) and (check is None or check(inputs, params, out)):
            case = Case(id=case_id, inputs=inputs, params=params, flags=tuple(flags))
            if _bites(case):
                return case
    raise RuntimeError(f"{case_id}: no draw met the design in {attempts} attempts")


# --- checks that make a pitfall case bite --------------------------------------------------


def _bites(case: Case) -> bool:
    """Every mutant of the catalog that the case's flags name changes its tokens (every case bites)."""
    from conformance.mutants import decisions_differ

    return decisions_differ(case)


def _row_p(inputs, params, b, i, history):
    sampling = {k: inputs[k][b] for k in (*SAMPLING, "top_k")}
    counts = add_to_history(inputs["output_counts"][b], history)
    return row_probs(inputs["logits"][b, i], inputs["prompt_mask"][b], counts, params["vocab_size"], **sampling)


def _correction_from_p_differs(inputs, params, out) -> bool:
    b = 0
    A = int(out["accepted"][b])
    if A >= int(inputs["live_proposals"][b]):
        return False
    p = _row_p(inputs, params, b, A, inputs["proposals"][b, :A])
    F, s = int(inputs["frontier"][b]), inputs["seed"][b]
    from_p, margin = exponential_race(p, s, F + 1 + A, Purpose.CORRECTION)
    return from_p != out["tokens"][b, A] and margin > MARGIN


def _seed32_differs(inputs, params, out) -> bool:
    """A seed of 2^32 or more also catches a seed truncated to its low word."""
    seed = np.asarray(inputs["seed"], np.uint64)
    if not np.any(seed >= np.uint64(2**32)):
        return True
    low = speculative_accept(**{**inputs, "seed": seed & np.uint64(0xFFFFFFFF)}, **params)
    return not (np.array_equal(low["tokens"], out["tokens"]) and np.array_equal(low["accepted"], out["accepted"]))


def _bonus_rows_differ(inputs, params, out) -> bool:
    b, P = 0, int(inputs["live_proposals"][0])
    K = inputs["proposals"].shape[1]
    hist = inputs["proposals"][b, :P]
    tops = {int(np.argmax(_row_p(inputs, params, b, r, hist))) for r in (P - 1, P, K)}
    return len(tops) == 3


def _history_case(case_id, greedy, retained=False) -> Case:
    """d_1 = d_2 = t; row 1 favours t unless the repetition penalty 4 of the history applies."""
    rng = case_rng(case_id)
    K, V = 3, 32
    for _ in range(2000):
        t = int(rng.integers(V))
        logits = rng.standard_normal((K + 1, V)) * 0.3
        logits[0, t] = 6.0  # accepted at step 0
        logits[1, t] = 4.0  # 4 / 4 = 1 after the penalty ...
        other = int((t + 1 + rng.integers(V - 1)) % V)
        logits[1, other] = 2.5  # ... below this one; without the history t leads by 1.5
        proposals = [t, t, int(rng.integers(V))]
        kw = {"temperature": 0.0 if greedy else 0.5, "repetition_penalty": 4.0}
        q = q_ids = None
        if retained:
            q_ids = np.stack([rng.permutation(V)[:TOPK] for _ in range(K)])
            q_ids[:, 0] = proposals
            q = np.full((K, TOPK), 0.2 / (TOPK - 1))
            q[:, 0] = 0.8
            q, q_ids = q[None], q_ids[None]
        inputs, params = accept_inputs(
            logits[None],
            [proposals],
            2,
            rng.integers(8, 5000),
            rng.integers(0, 2**63, dtype=np.uint64),
            q=q,
            q_ids=q_ids,
            **kw,
        )
        out = speculative_accept(**inputs, **params)
        if int(out["accepted"][0]) != 1 or not _clear(out):
            continue
        # the same scan with history frozen must accept step 1
        p1 = _row_p(inputs, params, 0, 1, [])
        if greedy and int(np.argmax(p1)) != t:
            continue
        if not greedy:
            from reference.rng import uniform

            u = float(uniform(inputs["seed"][0], int(inputs["frontier"][0]) + 2, Purpose.ACCEPT))
            qd = 1.0 if q is None else 0.8
            if not p1[t] - u * qd > MARGIN:
                continue
        return Case(id=case_id, inputs=inputs, params=params, flags=("history_not_updated",))
    raise RuntimeError(case_id)


def _swapped_case(case_id, retained) -> Case:
    """Reject at step 1 with p(d) < q(d): the swapped test U p(d) < q(d) accepts."""

    def check(inputs, params, out):
        p = _row_p(inputs, params, 0, 1, inputs["proposals"][0, :1])
        d = int(inputs["proposals"][0, 1])
        qd = 1.0 if not retained else float(inputs["q"][0, 1][inputs["q_ids"][0, 1] == d].sum())
        return p[d] < qd - MARGIN

    return _designed(case_id, K=4, P=3, A=1, retained=retained, check=check, flags=("accept_p_q_swapped",))


def _residual_zero_case(case_id) -> Case:
    """A zero-mass residual with a retained q that is a distribution in FP32: p is uniform over
    four tokens (exactly 0.25 each: equal logits, the rest at -1e4), q holds 0.25 on the same four
    and 2^-30 on the proposal d, which p gives 0 (q sums to 1 + 2^-30, which is 1 in FP32).
    U q(d) < p(d) = 0 is false for every U: d is rejected in any precision, and r = max(p - q, 0)
    is exactly 0, so the correction is drawn from p (C6). (With q and p both distributions,
    zero residual mass forces q = p off d to within rounding, so drawing the correction from q
    instead of p cannot be told apart by any valid input; the case catches the 0/0 bug instead:
    r / sum(r) is NaN and the sampler returns id 0, which p gives 0.)"""
    rng = case_rng(case_id)
    V = 16
    for _ in range(2000):
        perm = 1 + rng.permutation(V - 1)  # never id 0
        d, support = int(perm[0]), perm[1:5]
        logits = np.full((2, V), -1e4)  # exp(-1e4) = 0 in any precision: only the support carries mass
        logits[0, support] = 0.0
        logits[1] = rng.standard_normal(V)
        rest = np.setdiff1d(np.arange(V), np.r_[d, support])
        q_ids = np.r_[d, support, rest][:TOPK][None]
        q = np.zeros((1, TOPK))
        q[0, 0], q[0, 1:5] = 2.0**-30, 0.25
        inputs, params = accept_inputs(
            logits[None],
            [[d]],
            1,
            rng.integers(8, 5000),
            rng.integers(0, 2**63, dtype=np.uint64),
            q=q[None],
            q_ids=q_ids[None],
            temperature=1.0,
        )
        assert float(np.sum(inputs["q"][0, 0], dtype=np.float32)) == 1.0
        out = speculative_accept(**inputs, **params)
        if int(out["accepted"][0]) == 0 and out["tokens.margin"][0, 0] > MARGIN:
            case = Case(id=case_id, inputs=inputs, params=params, flags=("residual_sum_zero",))
            if _bites(case):
                return case
    raise RuntimeError(case_id)


def _tie_case(case_id) -> Case:
    """Greedy: d ties the argmax but has the higher id (rejected, margin 0); sampled row:
    q(d) = 0 = p(d), so U q(d) < p(d) is false (rejected at an exact tie)."""
    V = 8
    logits = np.zeros((2, 2, V), np.float32)
    logits[0, 0, [2, 5]] = 3.0  # d = 5 ties id 2: the lower id is the argmax
    logits[0, 1, 1] = 2.0
    logits[1, 0, 3] = 1.0
    logits[1, 0, 4] = -1e4  # p(4) = 0 at temperature 1
    logits[1, 1, 6] = 2.0
    q_ids = np.tile(np.arange(V)[None, None], (2, 1, 1))
    q = np.zeros((2, 1, V))
    q[:, 0, 3] = 1.0  # q(4) = 0
    inputs, params = accept_inputs(
        logits, [[5], [4]], 1, [100, 2**20], [7, 7], q=q, q_ids=q_ids, temperature=np.array([0.0, 1.0])
    )
    return Case(id=case_id, inputs=inputs, params=params, flags=("exact_tie", "coin_le_ratio", "greedy_ties_last_wins"))


def generate() -> list[Case]:
    c = f"{OP}/"
    cases = []
    for kind, retained in (("dflash", False), ("dflash2", True)):
        for T, greedy in (("greedy", True), ("sampled", False)):
            for what, P, A in (("all_accept", 5, 5), ("first_reject", 5, 0), ("mid_reject", 5, 2)):
                cases.append(
                    _designed(
                        f"{c}{kind}_{T}_{what}_K6_P{P}",
                        K=6,
                        P=P,
                        A=A,
                        greedy=greedy,
                        retained=retained,
                        # only a scan that reaches P can show a misuse of live_proposals
                        flags=("tail_extent",) if P < 6 and A == P else (),
                    )
                )
    cases += [
        _designed(f"{c}dflash_greedy_temperature_negative", K=3, A=1, greedy=True),
        _designed(f"{c}dflash_P0_bonus_only", K=4, P=0, A=0, flags=("tail_extent",)),
        _designed(f"{c}dflash2_greedy_P0", K=4, P=0, A=0, greedy=True, retained=True, flags=("tail_extent",)),
        _designed(
            f"{c}dflash_P_sweep_0_to_7_K15", B=8, K=15, P=np.arange(8), A=np.arange(8) // 2, flags=("tail_extent",)
        ),
        _designed(
            f"{c}dflash2_P_sweep_8_to_15_K15",
            B=8,
            K=15,
            P=np.arange(8, 16),
            A=[8, 3, 10, 0, 12, 7, 14, 15],
            retained=True,
            flags=("tail_extent",),
        ),
        _designed(f"{c}dflash_greedy_all_accept_K15", K=15, greedy=True),
        _designed(f"{c}dflash2_sampled_all_accept_K15", K=15, retained=True),
        _designed(f"{c}dflash_K1_reject", K=1, A=0),
        _designed(f"{c}dflash2_K1_accept", K=1, A=1, retained=True),
        _designed(
            f"{c}dflash2_K2_mixed_greedy_sampled_B4",
            B=4,
            K=2,
            A=[2, 0, 1, 2],
            retained=True,
            greedy=np.array([True, False, True, False]),
        ),
        # the C5 filters and penalties during the scan
        _designed(f"{c}dflash_filters_topk_topp_minp", B=3, K=5, A=[1, 3, 5], top_k=8, top_p=0.9, min_p=0.05),
        _designed(
            f"{c}dflash2_filters_topk_topp_minp",
            B=3,
            K=5,
            A=[0, 2, 4],
            retained=True,
            top_k=np.array([4, 0, 20]),
            top_p=np.array([1.0, 0.8, 0.95]),
            min_p=np.array([0.1, 0.0, 0.02]),
        ),
        _designed(
            f"{c}dflash2_penalties_history_grows",
            B=2,
            K=6,
            V=24,
            A=[4, 6],
            retained=True,
            repetition_penalty=1.3,
            frequency_penalty=0.4,
            presence_penalty=0.3,
            flags=("history_not_updated",),
        ),
        _designed(
            f"{c}dflash_vocab_padding_V256_vocab250", B=2, K=4, V=256, vocab=250, A=[2, 4], flags=("vocab_padding",)
        ),
        # random keys (C3)
        # 0 and 2^64-1 are symmetric under a swap of the key words: seed edges, not key-order tests
        *[
            _designed(f"{c}dflash2_seed_{name}", K=4, A=2, retained=True, seeds=[seed])
            for name, seed in (("0", 0), ("2p64-1", 2**64 - 1))
        ],
        *[
            _designed(f"{c}dflash2_seed_{name}", K=4, A=2, retained=True, seeds=[seed], flags=("rng_key",),
                      check=_seed32_differs)
            for name, seed in (("1", 1), ("2p32-1", 2**32 - 1), ("2p32", 2**32), ("2p32+7", 2**32 + 7),
                               ("2p63+5", 2**63 + 5))
        ],
        _designed(
            f"{c}dflash_positions_cross_2p32",
            B=2,
            K=6,
            A=[3, 6],
            frontiers=[2**32 - 4, 2**32 - 1],
            flags=("positions_2p32", "rng_key"),
        ),
        _designed(
            f"{c}dflash2_positions_above_2p32",
            B=2,
            K=5,
            A=[2, 5],
            retained=True,
            frontiers=[2**32, 2**40 + 7],
            flags=("positions_2p32", "rng_key"),
        ),
        # pitfalls
        _swapped_case(f"{c}accept_p_q_swapped__dflash_reject", False),
        _swapped_case(f"{c}accept_p_q_swapped__dflash2_reject", True),
        _history_case(f"{c}history_not_updated__greedy_repetition", True),
        _history_case(f"{c}history_not_updated__dflash_sampled_repetition", False),
        _history_case(f"{c}history_not_updated__dflash2_sampled_repetition", False, retained=True),
        _designed(
            f"{c}bonus_from_wrong_row__greedy_P3_K6",
            K=6,
            P=3,
            greedy=True,
            check=_bonus_rows_differ,
            flags=("bonus_from_wrong_row", "tail_extent"),
        ),
        _designed(
            f"{c}bonus_from_wrong_row__sampled_P2_K5",
            K=5,
            P=2,
            retained=True,
            check=_bonus_rows_differ,
            flags=("bonus_from_wrong_row", "tail_extent"),
            temperature=0.3,
        ),
        _designed(
            f"{c}residual_no_clamp__dflash2_mid_reject",
            K=5,
            A=2,
            retained=True,
            check=_correction_from_p_differs,
            flags=("residual_no_clamp",),
        ),
        _designed(
            f"{c}residual_no_clamp__dflash_first_reject",
            K=3,
            A=0,
            check=_correction_from_p_differs,
            flags=("residual_no_clamp",),
        ),
        _residual_zero_case(f"{c}dflash2_residual_sum_zero"),
        # the pitfall table "More bugs that shipped": each case changes the named bug's tokens
        _designed(f"{c}same_draw_reused__dflash2_mid_reject", K=5, A=2, retained=True, flags=("same_draw_reused",)),
        _designed(f"{c}same_draw_reused__dflash_first_reject", K=3, A=0, flags=("same_draw_reused",)),
        _designed(f"{c}rng_purpose_shared__dflash2_B2_K6", B=2, K=6, A=[2, 4], retained=True,
                  flags=("rng_purpose_shared",)),
        _designed(f"{c}rng_advanced_p0__dflash_P0_sampled_B2", B=2, K=4, P=0, A=0, flags=("rng_advanced_p0",)),
        _designed(f"{c}filters_only_on_bonus__dflash2_topk4_minp0.1_B2", B=2, K=5, A=[2, 3], retained=True, top_k=4,
                  min_p=0.1, flags=("filters_only_on_bonus",)),
        _designed(f"{c}penalties_last_token_only__dflash_greedy_V8", K=5, V=8, A=4, greedy=True,
                  repetition_penalty=2.0, flags=("penalties_last_token_only",)),
        _designed(f"{c}penalties_last_token_only__dflash2_sampled_V16", K=5, V=16, A=3, retained=True,
                  repetition_penalty=2.0, frequency_penalty=0.5, flags=("penalties_last_token_only",)),
        _designed(f"{c}engine_wide_seed__dflash2_B3", B=3, K=4, A=[1, 2, 0], retained=True,
                  flags=("engine_wide_seed",)),
        # penalties at temperatures other than 1 (coverage)
        _designed(f"{c}dflash2_penalties_temperature_0.5_1.7", B=2, K=5, V=24, A=[3, 5], retained=True,
                  repetition_penalty=1.5, frequency_penalty=0.3, presence_penalty=0.2,
                  temperature=np.array([0.5, 1.7]), flags=("history_not_updated",)),
        _designed(f"{c}dflash_penalties_temperature_0.3_greedy", B=2, K=5, V=24, A=[2, 4], greedy=np.array([False, True]),
                  repetition_penalty=1.8, presence_penalty=0.5, temperature=np.array([0.3, 0.0]),
                  flags=("history_not_updated",)),
        _tie_case(f"{c}exact_tie__greedy_lower_id_and_zero_q"),
        _designed(
            f"{c}rng_batch_row__same_request_4_rows",
            B=4,
            K=5,
            A=1,
            retained=True,
            same_request=True,
            seeds=np.full(4, 12345, np.uint64),
            frontiers=np.full(4, 777),
            flags=("rng_batch_row",),
        ),
        # the rng family: the key's high word and each field of the counter (position, purpose, index);
        # a rejection (accept coin, correction race) in row 0 and a bonus race in row 1, both seeds >= 2^32
        _designed(f"{c}rng_counter__dflash2_B2_K5_seeds_above_2p32", B=2, K=5, A=[2, 5], retained=True,
                  seeds=np.array([2**32 + 12345, 2**40 + 99], np.uint64),
                  flags=("rng_counter", "rng_seed_low_word", "rng_key")),
    ]
    # the rows of a sampled case, permuted: each request's results move with it
    base = next(x for x in cases if x.id == f"{c}dflash2_K2_mixed_greedy_sampled_B4")
    perm = np.array([2, 0, 3, 1])
    cases.append(
        Case(
            id=f"{c}rng_batch_row__permuted_rows_of_dflash2_K2_mixed",
            inputs={k: v[perm] for k, v in base.inputs.items()},
            params=dict(base.params),
            flags=("rng_batch_row",),
        )
    )
    return cases


register(
    OpSpec(
        name=OP,
        reference=speculative_accept,
        inputs=(
            "logits",
            "proposals",
            "live_proposals",
            "q",
            "q_ids",
            "frontier",
            "seed",
            "prompt_mask",
            "output_counts",
            *SAMPLING,
            "top_k",
        ),
        params=("vocab_size",),
        outputs=(Output("accepted", DECISION, tie_rule=ACCEPT_TIE), Output("tokens", DECISION), Output("num_out", EXACT)),
        generate=generate,
        force=force,
        decision_k=FP32_OUTPUT.k,  # accepted/tokens.scale: the envelope of p, logits or race scores
        doc="Target verification of a proposal block: greedy prefix or min(1, p/q) with residual correction and bonus",
    )
)
