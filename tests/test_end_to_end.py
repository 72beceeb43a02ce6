"""End-to-end speculative rounds on a tiny random model (docs/ops.md "one end-to-end round (and a loop
of rounds)"; spec: the round flowchart; CONTRACTS C3, C5, C6, C7).

A random toy target (reference.toy_target: 3 causal blocks, H = 32, 40 public ids in 48 head
rows) and random draft weights in the published state-dict layout (reference.state_dict) at
reduced DFlash (one local layer, S = 5, then one full layer) and DFlash2 (two local layers, S = 6,
rank 8, top-8) geometries run through reference.round. What the tests show:

- greedy (temperature <= 0): the speculative loop publishes exactly the tokens of plain greedy
  decoding of the target alone, for K = 3 and 7, three target/draft/prompt seeds (prompt length 1,
  F = 0; 4; and 12 > S, a prefill chunk longer than the ring), with and without penalties, and
  with EOS / stop ids taken from the plain output so that they cut it. The runs are checked to
  contain accepted proposals, rejections, P = 0 rounds and ring wrap-around, so the equality is
  not the trivial one of a loop that never accepts;
- sampled (temperature 1.5, top-k 5, repetition / presence / frequency penalties): over
  N_TRIALS requests that differ only in their seed, the first output token follows the target's
  p_0 and the second, given the first, follows the target's p_1 with the first in the history
  (Pearson chi-square, ALPHA = 1e-3 from tests/test_acceptance_statistics.py: a correct loop
  with ideal uniforms fails each test with probability 1e-3; seeds are fixed, so the outcome is
  deterministic), for DFlash (one-hot q) and DFlash2 (retained q). The same first-token test fails
  when the loop runs with an acceptance function (passed in as a parameter) whose accept test has
  p and q swapped; the bug's expected statistic is computed in closed form and checked to exceed
  the critical value many times over, and the test-local scan without the swap reproduces
  speculative_accept token for token, so the failure is the swap's;
- batch invariance: four requests with different prompts (mixed frontiers), seeds, budgets,
  sampling and EOS run together, alone and permuted, and get the same rounds and outputs;
- context catch-up (C7): after the loop, each layer's ring / paged pool holds what a one-shot
  materialization of all committed positions gives;
- state dict: a missing or mis-shaped tensor is refused naming the key; distinct context K/V role
  tensors change the context and the draft hidden while the block role still reads k_proj/v_proj;
- coverage: a state whose frontiers and pending rows disagree is refused, as is a proposal from
  a context that has not caught up.
"""

from __future__ import annotations

import dataclasses
import math
from functools import cache

import numpy as np
import pytest

from reference import round as rd
from reference import state_dict as sdm
from reference import toy_target as tt
from reference.config import PRESETS, reduced
from reference.context_kv import context_kv, live_mask
from reference.feature_capture import feature_capture
from reference.masked_block import masked_block
from reference.preview_commit import CoverageError
from reference.rng import Purpose, exponential_race, uniform
from reference.speculative_accept import speculative_accept
from reference.target_distribution import add_to_history, row_probs
from tests.test_acceptance_statistics import ALPHA, chi2_sf, critical, gof

ROWS, VOCAB, HIDDEN = 48, 40, 32
N_TRIALS = 1000  # requests per sampled experiment
N_BUG = 400  # requests per planted-bug experiment (the bugs' effects are large; checked below)


def config(variant: str, K: int):
    common = {"hidden": HIDDEN, "layers": 2, "intermediate": 64, "heads": 4, "kv_heads": 2, "head_dim": 8,
              "vocab": ROWS, "num_target_layers": 3, "K": K}
    if variant == "dflash":
        return reduced(PRESETS["qwen3.5-35b-a3b-dflash"], window=5, target_layer_ids=[0, 2], **common)
    return reduced(PRESETS["qwen3.5-27b-dflash2"], window=6, rank=8, top_k=8, target_layer_ids=[1, 2], **common)


@cache
def target(seed: int) -> tt.ToyTarget:
    return tt.random_target(np.random.default_rng(seed), vocab_size=VOCAB, rows=ROWS, hidden=HIDDEN, head_spread=1.5)


@cache
def state_dict(variant: str, seed: int) -> dict:
    return sdm.random_state_dict(config(variant, 3), np.random.default_rng(seed))


@cache
def drafter(variant: str, K: int, target_seed: int, draft_seed: int) -> rd.Drafter:
    return rd.make_drafter(state_dict(variant, draft_seed), config(variant, K), target(target_seed))


def test_configs_have_the_intended_geometry():
    a, b = config("dflash", 3), config("dflash2", 7)
    assert a.windows == (5, 0) and a.full_pool and a.mask_token_id == ROWS - 1 >= VOCAB
    assert b.windows == (6, 6) and not b.full_pool and b.W == 8 > b.sliding_window


# --- the toy target -------------------------------------------------------------------------


def test_toy_target_incremental_equals_at_once_and_is_causal():
    t = target(0)
    tokens = np.random.default_rng(1).integers(0, VOCAB, 11)
    cache, whole = tt.prefill(t, tokens)
    pieces, c = [], tt.empty_cache(t)
    for lo, hi in ((0, 1), (1, 4), (4, 4), (4, 11)):
        step = tt.forward(t, c, tokens[lo:hi])
        c = tt.commit(c, step, hi - lo)
        pieces.append(step)
    np.testing.assert_allclose(np.concatenate([s.logits for s in pieces]), whole.logits, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.concatenate([s.block_outputs for s in pieces], axis=1), whole.block_outputs,
                               rtol=1e-12, atol=1e-12)
    assert c.length == cache.length == 11
    other = tokens.copy()
    other[7] = (other[7] + 1) % VOCAB
    _, changed = tt.prefill(t, other)
    np.testing.assert_array_equal(changed.block_outputs[:, :7], whole.block_outputs[:, :7])
    assert not np.allclose(changed.block_outputs[:, 7:], whole.block_outputs[:, 7:])


def test_toy_target_padded_rows_would_win_without_the_mask():
    _, step = tt.prefill(target(0), np.arange(VOCAB))
    assert (np.argmax(step.logits, axis=-1) >= VOCAB).mean() > 0.3


# --- greedy: the loop equals plain greedy decoding ------------------------------------------

PENALTIES = rd.Sampling(repetition_penalty=1.3, presence_penalty=0.2, frequency_penalty=0.05)
# (target seed, draft seed, prompt, sampling): prompt lengths 1 (F = 0), 4, and 12 > S
GREEDY_CASES = (
    (0, 100, (7,), rd.Sampling()),
    (1, 101, (3, 30, 12, 5), PENALTIES),
    (2, 102, (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12), PENALTIES),
)
BUDGET = 30


def greedy_request(case: int, ending: str) -> tuple[rd.Request, tuple[int, ...]]:
    """The request and its plain-decoding reference. ``ending`` "eos" / "stop" takes the id from the
    plain output so that it cuts it (the expected output then ends at its first occurrence)."""
    tseed, _, prompt, sampling = GREEDY_CASES[case]
    req = rd.Request(prompt, BUDGET, seed=case, sampling=sampling)
    plain = rd.plain_decode(req, target(tseed))
    if ending == "none":
        return req, plain
    end = plain[12 if ending == "eos" else 6]
    other = next(v for v in range(VOCAB) if v not in plain)  # listed, never produced: must not cut
    ids = {"eos": {"eos_ids": (end, other)}, "stop": {"stop_ids": (end,), "eos_ids": (other,)}}[ending]
    req = dataclasses.replace(req, **ids)
    return req, rd.plain_decode(req, target(tseed))


@cache
def greedy_run(variant: str, K: int, case: int, ending: str):
    tseed, dseed, _, _ = GREEDY_CASES[case]
    req, plain = greedy_request(case, ending)
    return plain, rd.generate([req], drafter(variant, K, tseed, dseed), target(tseed))


@pytest.mark.parametrize("ending", ["none", "eos", "stop"])
@pytest.mark.parametrize("case", range(len(GREEDY_CASES)))
@pytest.mark.parametrize("K", [3, 7])
@pytest.mark.parametrize("variant", ["dflash", "dflash2"])
def test_greedy_loop_equals_plain_greedy_decoding(variant, K, case, ending):
    plain, res = greedy_run(variant, K, case, ending)
    if ending != "none":
        assert len(plain) < BUDGET  # the id did cut the plain output
    assert res.outputs[0] == plain
    assert all(v < VOCAB for v in plain)
    state = res.states[0]
    prompt = GREEDY_CASES[case][2]
    assert state.done and state.frontier == len(prompt) - 1 + len(plain)
    assert state.anchor == plain[-1] and state.pending.shape[1] == state.frontier - state.ctx_frontier


@pytest.mark.parametrize("variant", ["dflash", "dflash2"])
def test_greedy_runs_cover_acceptance_rejection_and_ring_wrap(variant):
    records = [r[0] for K in (3, 7) for c in range(len(GREEDY_CASES)) for e in ("none", "eos", "stop")
               for r in greedy_run(variant, K, c, e)[1].rounds]
    S = config(variant, 3).sliding_window
    assert sum(r.accepted >= 1 for r in records) >= 10  # multi-token rounds happen
    assert any(r.accepted >= 2 for r in records)
    assert sum(r.accepted < r.P for r in records) > len(records) / 2  # corrections happen
    assert any(r.P == 0 for r in records)  # the budget tail verifies the anchor alone
    assert max(r.frontier for r in records) > 4 * S  # the rings wrapped several times


def one_shot_context(variant, K, case):
    """The caught-up final state of a greedy run and, independently, every committed position's
    context materialized at once: per layer a ring of capacity F (slot p mod F = p, nothing
    overwritten) and the stored chunk as context_kv gives it into the layer's own storage."""
    tseed, dseed, _, _ = GREEDY_CASES[case]
    d = drafter(variant, K, tseed, dseed)
    state = rd.materialize(greedy_run(variant, K, case, "none")[1].states[0], d)
    committed = [*state.request.prompt, *state.outputs[:-1]]
    assert state.ctx_frontier == state.frontier == len(committed)
    _, step = tt.prefill(target(tseed), committed)
    c = feature_capture(block_outputs=step.block_outputs, **d.feature)["context"]
    F, shape = state.frontier, (state.frontier, config(variant, K).num_key_value_heads, config(variant, K).head_dim)
    full = [context_kv(context=c, k_cache=np.zeros(shape), v_cache=np.zeros(shape), start=0, storage="ring", **w)
            for w in d.context]
    own = []
    for new, weights in zip(rd._empty_context(d, state.request), d.context):
        kw = {"storage": "paged", "page_size": d.page_size, "page_table": new.page_table} if new.paged \
            else {"storage": "ring"}
        out = context_kv(context=c, k_cache=new.k, v_cache=new.v, start=0, **kw, **weights)
        own.append((out, live_mask(F, new.k.shape, kw["storage"], new.page_table, d.page_size)))
    return d, state, full, own


@pytest.mark.parametrize("variant", ["dflash", "dflash2"])
def test_catch_up_matches_one_shot_materialization(variant):
    """C7: after a loop of rounds (chunks of N rows each) the live slots of each layer's ring or
    paged pool hold what materializing every committed position at once gives."""
    _, state, _, own = one_shot_context(variant, 3, 2)
    for store, (ref, live) in zip(state.context, own):
        assert live.any() and (store.paged or state.frontier > 4 * store.capacity())  # rings wrapped
        # one BF16 ulp of slack: the target ran in other chunks (float64 summation order)
        np.testing.assert_allclose(store.k[live], ref["k_cache"][live], rtol=2**-7, atol=1e-6)
        np.testing.assert_allclose(store.v[live], ref["v_cache"][live], rtol=2**-7, atol=1e-6)


@pytest.mark.parametrize("variant", ["dflash", "dflash2"])
def test_proposal_reads_exactly_the_live_context(variant):
    """The draft hidden of the loop's next round equals masked_block over a one-shot context that
    holds every position (the window mask alone clipping local layers): the rings and the paged
    pool give the draft neither fewer nor other context rows."""
    cfg = config(variant, 7)
    d, state, full, _ = one_shot_context(variant, 7, 2)
    assert state.frontier > 2 * cfg.sliding_window
    driver = rd.propose([state], d, [cfg.W])["hidden"]
    ref = masked_block(anchor=[state.anchor], frontier=[state.frontier], live=[cfg.W],
                       context_k=np.stack([o["k_cache"][None] for o in full]),
                       context_v=np.stack([o["v_cache"][None] for o in full]), **d.block)["hidden"]
    np.testing.assert_allclose(driver, ref, rtol=2**-6, atol=1e-3)


# --- sampled: the output distribution is the target's ---------------------------------------

SAMPLED = rd.Sampling(temperature=1.5, top_k=5, repetition_penalty=1.3, presence_penalty=0.2, frequency_penalty=0.1)
SAMPLED_PROMPT = (3, 17, 5, 22, 9)
SAMPLED_TARGET = 2
# draft seeds (picked by a search) under which round 1 accepts one proposal in ~39% / ~29% of
# requests and both in ~5% / ~6% (DFlash / DFlash2): every acceptance path is taken
SAMPLED_DRAFT = {"dflash": 131, "dflash2": 115}
SAMPLED_BUDGET = 3  # round 1 verifies P = 2 proposals; two rounds give every request >= 2 outputs


def sampled_setup(variant):
    d = drafter(variant, 3, SAMPLED_TARGET, SAMPLED_DRAFT[variant])
    req = rd.Request(SAMPLED_PROMPT, SAMPLED_BUDGET, sampling=SAMPLED)
    return d, req, rd.start(req, d, target(SAMPLED_TARGET))


def run_sampled(variant, n, accept=speculative_accept, first_seed=0):
    """Two rounds for n requests differing only in their seed: outputs [n, 2] and round-1 records."""
    d, req, s0 = sampled_setup(variant)
    states = [dataclasses.replace(s0, request=dataclasses.replace(req, seed=first_seed + i)) for i in range(n)]
    res = rd.resume(states, d, target(SAMPLED_TARGET), accept, max_rounds=2)
    assert all(len(o) >= 2 for o in res.outputs)
    return np.array([o[:2] for o in res.outputs]), list(res.rounds[0])


@cache
def sampled_trials(variant):
    return run_sampled(variant, N_TRIALS)


def p_next(outputs=()):
    req = rd.Request(SAMPLED_PROMPT, SAMPLED_BUDGET, sampling=SAMPLED)
    return rd.next_token_probs(req, target(SAMPLED_TARGET), outputs)


def first_token_gof(outputs):
    return gof(np.bincount(outputs[:, 0], minlength=ROWS), p_next())


def pooled_gof(counts, p):
    """gof after pooling the least likely outcomes into one bin until every bin expects >= 5
    (the chi-square approximation's rule); (statistic, p-value, df), df 0 when one bin is left.
    A count outside p's support is an impossible outcome: p-value 0."""
    counts, p = np.asarray(counts, float), np.asarray(p, float)
    n = counts.sum()
    if np.any(counts[p <= 0] > 0):
        return math.inf, 0.0, 0
    order = [int(i) for i in np.argsort(p) if p[i] > 0]  # ascending
    pooled = [i for i in order if n * p[i] < 5]
    while pooled and n * p[pooled].sum() < 5 and len(pooled) < len(order):
        pooled.append(order[len(pooled)])
    single = [i for i in order if i not in pooled]
    if len(single) + bool(pooled) < 2:
        return 0.0, 1.0, 0
    bins = [[i] for i in single] + ([pooled] if pooled else [])
    return gof([counts[b].sum() for b in bins], [p[b].sum() for b in bins])


def second_token_gof(outputs):
    """y_2 given y_1 = v follows p_1 with v in the history: one pooled test per stratum v, whose
    statistics and degrees of freedom add up. Returns (stat, p-value, df, requests in strata with
    df > 0)."""
    stat, df, used = 0.0, 0, 0
    for v in np.unique(outputs[:, 0]):
        sel = outputs[:, 0] == v
        s, pv, d = pooled_gof(np.bincount(outputs[sel, 1], minlength=ROWS), p_next((int(v),)))
        if pv == 0.0:
            return math.inf, 0.0, d, int(sel.sum())
        stat, df, used = stat + s, df + d, used + int(sel.sum()) * (d > 0)
    return stat, chi2_sf(stat, df), df, used


def test_sampled_target_has_filters_and_penalties_active():
    p0 = p_next()
    assert (p0 > 0).sum() == SAMPLED.top_k and p0[p0 > 0].min() * N_TRIALS >= 20
    assert not np.allclose(p_next((int(np.argmax(p0)),)), p_next((int(np.argsort(p0)[-2]),)))


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["dflash", "dflash2"])
def test_sampled_first_two_outputs_follow_the_target(variant):
    outputs, first_round = sampled_trials(variant)
    stat, pv, df = first_token_gof(outputs)
    assert pv > ALPHA, f"first token: chi2 {stat:.1f} on {df} df, p = {pv:.2e}"
    stat, pv, df, used = second_token_gof(outputs)
    assert used >= 0.7 * N_TRIALS and df >= 4  # most requests sit in informative strata
    assert pv > ALPHA, f"second token: chi2 {stat:.1f} on {df} df, p = {pv:.2e}"
    # the experiment exercised every path: accepted proposals, corrections, a second round
    accepted = np.array([r.accepted for r in first_round])
    assert 0.1 < (accepted >= 1).mean() < 0.9 and (accepted == 2).mean() > 0.02
    assert 0.1 < np.mean([r.n == 1 for r in first_round]) < 0.95
    if variant == "dflash2":
        assert len({r.proposals[0] for r in first_round}) >= 3  # the selector sampled d_1


# --- planted bug: accept with p and q swapped -----------------------------------------------


def plain_scan(*, swap, logits, proposals, live_proposals, frontier, seed, prompt_mask, output_counts, vocab_size,
               top_k, q=None, q_ids=None, **sampling):
    """The sampled acceptance scan of C6 written out (C3 draws, C5 rows, history grows as it
    goes); ``swap`` plants the bug: accept iff U p(d) < q(d) instead of U q(d) < p(d)."""
    B, W, rows = np.shape(logits)
    tokens = np.full((B, W), -1, np.int32)
    accepted = np.zeros(B, np.int32)
    for b in range(B):
        params = {**{k: v[b] for k, v in sampling.items()}, "top_k": top_k[b]}
        assert params["temperature"] > 0
        counts, F, s, P = output_counts[b], int(frontier[b]), np.uint64(seed[b]), int(live_proposals[b])
        for i in range(P + 1):
            p = row_probs(logits[b, i], prompt_mask[b], counts, vocab_size, **params)
            if i == P:
                tokens[b, i], accepted[b] = exponential_race(p, s, F + 1 + i, Purpose.BONUS)[0], P
                break
            d, qv = int(proposals[b, i]), np.zeros(rows)
            if q is None:
                qv[d] = 1
            else:
                np.add.at(qv, q_ids[b, i], q[b, i])
            u = float(uniform(s, F + 1 + i, Purpose.ACCEPT))
            if (u * p[d] < qv[d]) if swap else (u * qv[d] < p[d]):
                tokens[b, i] = d
                counts = add_to_history(counts, [d])
                continue
            r = np.maximum(p - qv, 0)
            tokens[b, i] = exponential_race(r if r.sum() > 0 else p, s, F + 1 + i, Purpose.CORRECTION)[0]
            accepted[b] = i
            break
    return {"accepted": accepted, "tokens": tokens, "num_out": accepted + 1}


def accept_p_q_swapped(**kw):
    return plain_scan(swap=True, **kw)


def accept_checked(**kw):
    """speculative_accept, asserting on the way that the unswapped plain_scan agrees with it."""
    ref = speculative_accept(**kw)
    mine = plain_scan(swap=False, **kw)
    for name in ("accepted", "tokens", "num_out"):
        np.testing.assert_array_equal(mine[name], ref[name], err_msg=name)
    return ref


def first_token_law(p, qv, swap):
    """The law of y_1 when d_1 ~ q_0, in closed form: accepted with the (buggy) accept probability,
    else drawn from the normalized residual max(p - q, 0) (p when it has no mass)."""
    r = np.maximum(p - qv, 0)
    r = r / r.sum() if r.sum() > 0 else p
    law = np.zeros_like(p)
    for d in np.flatnonzero(qv > 0):
        acc = (min(1.0, qv[d] / p[d]) if p[d] > 0 else 1.0) if swap else min(1.0, p[d] / qv[d])
        law[d] += qv[d] * acc
        law += qv[d] * (1 - acc) * r
    return law


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["dflash", "dflash2"])
def test_planted_p_q_swap_fails_the_first_token_test(variant):
    d, _, s0 = sampled_setup(variant)
    prop = rd.propose([rd.materialize(s0, d)], d, [SAMPLED_BUDGET])  # round 1's live = P + 1 columns
    qv = np.zeros(ROWS)
    if prop["q"] is None:
        qv[prop["tokens"][0, 0]] = 1
    else:
        np.add.at(qv, prop["q_ids"][0, 0], prop["q"][0, 0])
    p = p_next()
    np.testing.assert_allclose(first_token_law(p, qv, swap=False), p, atol=1e-6)  # the helper is right
    law, sup = first_token_law(p, qv, swap=True), p > 0
    noncentrality = math.inf if law[~sup].sum() > 1e-9 else N_BUG * float(((law - p)[sup] ** 2 / p[sup]).sum())
    assert noncentrality > 10 * critical(int(sup.sum()) - 1)

    control, _ = run_sampled(variant, 60, accept=accept_checked, first_seed=10**6)
    assert control.shape == (60, 2)
    outputs, _ = run_sampled(variant, N_BUG, accept=accept_p_q_swapped)
    stat, pv, df = first_token_gof(outputs)
    assert pv < ALPHA, f"p/q swap passed: chi2 {stat:.1f} on {df} df"


# --- batch invariance -----------------------------------------------------------------------

BATCH = (
    rd.Request((5,), 12, seed=0),
    rd.Request((1, 9, 2, 8, 3, 7, 4, 6, 5), 15, seed=11, sampling=rd.Sampling(temperature=1.0, top_k=8)),
    rd.Request((30, 31, 32, 33), 9, seed=2**40 + 3, sampling=SAMPLED, eos_ids=(4, 17)),
    rd.Request((2, 4, 6, 8, 10, 12), 20, seed=7, sampling=PENALTIES, stop_ids=(3,)),
)


@pytest.mark.parametrize("variant", ["dflash", "dflash2"])
def test_batch_gives_each_request_its_own_outputs(variant):
    d, t = drafter(variant, 3, 1, 101), target(1)
    together = rd.generate(BATCH, d, t)
    frontiers = {len(r.prompt) - 1 for r in BATCH}
    assert len(frontiers) == len(BATCH)  # mixed frontiers in every batched round
    for i, req in enumerate(BATCH):
        alone = rd.generate([req], d, t)
        assert alone.outputs[0] == together.outputs[i]
        assert [r[0] for r in alone.rounds] == [r[i] for r in together.rounds if r[i] is not None]
    order = [2, 0, 3, 1]
    permuted = rd.generate([BATCH[i] for i in order], d, t)
    assert permuted.outputs == [together.outputs[i] for i in order]
    assert any(len(set(o)) > 1 for o in together.outputs)


# --- state dict -----------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["dflash", "dflash2"])
def test_state_dict_layout_has_the_published_names(variant):
    cfg = config(variant, 3)
    sd = state_dict(variant, 100)
    assert sd["fc.weight"].shape == (HIDDEN, 2 * HIDDEN) and str(sd["fc.weight"].dtype) == "bfloat16"
    assert sd["layers.1.self_attn.k_proj.weight"].shape == (16, HIDDEN)
    if variant == "dflash2":
        assert sd["layers.0.attention_conv.base_kernel"].shape == (2, 2, HIDDEN)
        assert sd["layers.1.mlp_conv.kernel_projection.weight"].shape == (2 * 2 * HIDDEN // 16, HIDDEN)
        assert sd["candidate_selector.hidden_projection.weight"].shape == (8, HIDDEN)
        assert sd["candidate_selector.predecessor_codebook"].shape == (ROWS, 8)
    else:
        assert not any(k.startswith("candidate_selector") or "conv" in k for k in sd)
    assert set(sd) == set(sdm.expected_shapes(cfg))


@pytest.mark.parametrize(
    ("variant", "key", "shape"),
    [
        ("dflash", "layers.1.mlp.up_proj.weight", None),
        ("dflash", "fc.weight", (HIDDEN, 3 * HIDDEN)),
        ("dflash2", "candidate_selector.successor_codebook", None),
        ("dflash2", "layers.0.attention_conv.kernel_projection.weight", (8, HIDDEN + 1)),
    ],
)
def test_state_dict_refuses_missing_and_misshaped_tensors(variant, key, shape):
    sd = dict(state_dict(variant, 100))
    if shape is None:
        del sd[key]
    else:
        sd[key] = np.zeros(shape)
    with pytest.raises(sdm.StateDictError) as err:
        rd.make_drafter(sd, config(variant, 3), target(0))
    msg = str(err.value)
    assert err.value.key == key and key in msg and "\n" not in msg
    assert ("missing" in msg) if shape is None else (str(list(shape)) in msg)


def test_distinct_context_role_tensors_change_the_context_not_the_block_role():
    variant, tseed = "dflash", 2
    cfg, sd, t = config(variant, 3), state_dict(variant, 100), target(tseed)
    rng = np.random.default_rng(5)
    kd = cfg.num_key_value_heads * cfg.head_dim
    alt_k = rng.standard_normal((2, kd, HIDDEN)) / np.sqrt(HIDDEN)
    alt_v = rng.standard_normal((2, kd, HIDDEN)) / np.sqrt(HIDDEN)
    shared, distinct = rd.make_drafter(sd, cfg, t), rd.make_drafter(sd, cfg, t, context_wk=alt_k, context_wv=alt_v)
    for name in ("wk", "wv"):
        np.testing.assert_array_equal(np.asarray(distinct.block[name], float), np.asarray(shared.block[name], float))
    np.testing.assert_array_equal(np.asarray(shared.context[1]["wk"], float),
                                  np.asarray(sd["layers.1.self_attn.k_proj.weight"], float))
    np.testing.assert_array_equal(distinct.context[1]["wv"], alt_v[1])

    req = rd.Request(tuple(range(1, 13)), 4)
    states = {}
    for label, d in (("shared", shared), ("distinct", distinct)):
        states[label] = rd.materialize(rd.start(req, d, t), d)
    for a, b in zip(states["shared"].context, states["distinct"].context):
        assert not np.allclose(a.k, b.k) and not np.allclose(a.v, b.v)

    def hidden(d, state):
        F = state.frontier
        views = [rd._ring_view(c, F, F, w) for c, w in zip(state.context, cfg.windows)]
        return masked_block(anchor=[state.anchor], frontier=[F], live=[cfg.W],
                            context_k=np.stack([v[0][None] for v in views]),
                            context_v=np.stack([v[1][None] for v in views]), **d.block)["hidden"]

    assert not np.allclose(hidden(shared, states["shared"]), hidden(distinct, states["distinct"]))
    # and the target stays the authority: greedy output is unchanged by the draft's context role
    greedy = rd.Request(tuple(range(1, 13)), 20)
    assert rd.generate([greedy], distinct, t).outputs[0] == rd.plain_decode(greedy, t)


def test_state_dict_refuses_a_misshaped_context_role_tensor():
    cfg, sd = config("dflash", 3), state_dict("dflash", 100)
    with pytest.raises(sdm.StateDictError, match=r"context wk\[0\]"):
        rd.make_drafter(sd, cfg, target(0), context_wk=np.zeros((2, 16, HIDDEN + 1)))


# --- coverage refusals ----------------------------------------------------------------------


def test_state_with_disagreeing_coverage_is_refused():
    d, t = drafter("dflash", 3, 0, 100), target(0)
    s = rd.start(rd.Request((1, 2, 3, 4, 5), 5), d, t)
    assert s.frontier == 4 and s.ctx_frontier == 0 and s.pending.shape[1] == 4
    with pytest.raises(CoverageError):
        dataclasses.replace(s, ctx_frontier=1)  # 1 + 4 pending rows != frontier 4
    with pytest.raises(CoverageError):
        rd.propose([s], d, [4])  # a proposal needs the context caught up first
    with pytest.raises(rd.RoundError):
        dataclasses.replace(s, frontier=5, pending=np.zeros((3, 5, HIDDEN)))  # target cache holds 4
    caught = rd.materialize(s, d)
    assert caught.ctx_frontier == caught.frontier == 4 and caught.pending.shape[1] == 0
    with pytest.raises(rd.RoundError):
        dataclasses.replace(caught, ctx_written=2)  # storage written to 2, frontier 4
    with pytest.raises(rd.RoundError):
        rd.run_round([dataclasses.replace(caught, done=True)], d, t)
