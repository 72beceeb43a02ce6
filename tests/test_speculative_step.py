"""speculative_step (issue 11): the step Op against independent formulations.

- reference.round.run_round composes the same step its own way (its own ring views over paged
  pools, its own target verify and commit): on the same state it must commit the same tokens.
- Greedy losslessness: the published tokens are the target's own greedy continuation, decoded one
  token at a time from the committed cache (no drafter involved).
- Hand-checked edges: budget 1 (P = 0) publishes exactly one token; bad target tensors are refused
  in one line naming the tensor.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.cases import speculative_step as c
from reference import round as rd
from reference import speculative_step as ss
from reference import toy_target as tt
from reference.numerics import to_bf16
from reference.target_distribution import add_to_history, row_probs


def _setup(seed: int, variant: str, K: int, prompts, temperature=0.0, penalties=False, warm=1):
    rng = np.random.default_rng(seed)
    cfg, sd, drafter, target = c.world(rng, variant, K, len(prompts), spread=1.0, codebook=False)
    sampling = rd.Sampling(temperature=temperature, **(c.PENALTIES if penalties else {}))
    requests = [rd.Request(tuple(int(t) for t in rng.integers(0, c.VOCAB, n)), budget=int(rng.integers(1, 3 * K)),
                           seed=int(rng.integers(0, 2**63)), sampling=sampling) for n in prompts]
    states = [rd.start(r, drafter, target) for r in requests]
    for _ in range(warm):
        if any(s.done for s in states):
            break
        states, _ = rd.run_round(states, drafter, target)
    return cfg, sd, drafter, target, states


def _as_stored(state: rd.RequestState) -> rd.RequestState:
    """The state with the values the step's inputs store: pending block outputs BF16, cache FP32."""
    cache = tt.TargetCache(k=tuple(c.as_fp32(k) for k in state.target_cache.k),
                           v=tuple(c.as_fp32(v) for v in state.target_cache.v))
    return dataclasses.replace(state, pending=to_bf16(state.pending), target_cache=cache)


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), variant=st.sampled_from(["dflash", "dflash2"]), K=st.integers(1, 6),
       prompts=st.lists(st.integers(1, 12), min_size=1, max_size=3), temperature=st.sampled_from([0.0, 0.9]),
       penalties=st.booleans(), warm=st.integers(0, 2))
def test_step_commits_what_the_round_loop_commits(seed, variant, K, prompts, temperature, penalties, warm):
    cfg, sd, drafter, target, states = _setup(seed, variant, K, prompts, temperature, penalties, warm)
    states = [_as_stored(s) for s in states if not s.done]
    if not states:
        return
    budget = [s.budget_left for s in states]
    inputs, params = c._inputs(states, drafter, target, cfg, sd, budget, [], [])
    out = ss.speculative_step(**inputs, **params)
    new, records = rd.run_round(states, drafter, target)
    for b, (s, r) in enumerate(zip(new, records)):
        assert int(out["n"][b]) == r.n and int(out["accepted"][b]) == r.accepted
        assert out["published"][b, : r.n].tolist() == list(r.published)
        assert np.all(out["published"][b, r.n:] == -1)
        assert int(out["frontier"][b]) == s.frontier
        assert out["proposals"][b, : r.P].tolist() == list(r.proposals)
        if r.n:
            assert int(out["next_anchor"][b]) == s.anchor


def _greedy_continuation(state: rd.RequestState, target: tt.ToyTarget, n: int) -> list[int]:
    """The target alone, one token per step from the committed cache (C5 greedy with the history)."""
    cache, token, counts, out = state.target_cache, state.anchor, state.history.copy(), []
    params = state.request.sampling.row_params()
    for _ in range(n):
        step = tt.forward(target, cache, [token])
        cache = tt.commit(cache, step, 1)
        token = int(np.argmax(row_probs(step.logits[0], state.prompt_mask, counts, target.vocab_size, **params)))
        out.append(token)
        counts = add_to_history(counts, [token])
    return out


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("variant", ["dflash", "dflash2"])
def test_greedy_step_publishes_the_targets_own_continuation(seed, variant):
    cfg, sd, drafter, target, states = _setup(100 + seed, variant, 5, [4, 9, 2], penalties=seed % 2 == 1)
    states = [_as_stored(s) for s in states if not s.done]
    budget = [s.budget_left for s in states]
    inputs, params = c._inputs(states, drafter, target, cfg, sd, budget, [], [])
    out = ss.speculative_step(**inputs, **params)
    for b, s in enumerate(states):
        n = int(out["n"][b])
        assert 1 <= n <= min(budget[b], 6)
        assert out["published"][b, :n].tolist() == _greedy_continuation(s, target, n)


def test_budget_one_publishes_one_verified_token():
    cfg, sd, drafter, target, states = _setup(7, "dflash", 4, [5, 6])
    states = [_as_stored(s) for s in states]
    inputs, params = c._inputs(states, drafter, target, cfg, sd, [1, 1], [], [])
    out = ss.speculative_step(**inputs, **params)
    assert out["n"].tolist() == [1, 1] and out["accepted"].tolist() == [0, 0]
    assert out["frontier"].tolist() == [s.frontier + 1 for s in states]
    for b, s in enumerate(states):
        assert out["published"][b].tolist() == [*_greedy_continuation(s, target, 1), -1, -1, -1, -1]
        assert int(out["next_anchor"][b]) == int(out["published"][b, 0])


@pytest.mark.parametrize("change, named", [
    (lambda w: w.pop("target.layers.1.w_up"), "target.layers.1.w_up"),
    (lambda w: w.pop("target.final_norm"), "target.final_norm"),
    (lambda w: w.__setitem__("target.layers.0.bias", np.zeros(3, np.float32)), "target.layers.0.bias"),
])
def test_bad_target_tensors_are_refused_by_name(change, named):
    cfg, sd, drafter, target, states = _setup(3, "dflash", 2, [4])
    inputs, params = c._inputs(states, drafter, target, cfg, sd, [3], [], [])
    change(inputs)
    with pytest.raises(ValueError) as err:
        ss.speculative_step(**inputs, **params)
    msg = str(err.value)
    assert named in msg and "\n" not in msg


def test_budget_zero_is_refused():
    cfg, sd, drafter, target, states = _setup(3, "dflash", 2, [4])
    inputs, params = c._inputs(states, drafter, target, cfg, sd, [0], [], [])
    with pytest.raises(ValueError, match="budget"):
        ss.speculative_step(**inputs, **params)


def test_case_clearness_sees_a_near_tie():
    """The clearness rule must reject a draw with a target near-tie: give the first published
    token's head row a twin (another public row with the same weights) and the ratio drops to 0."""
    case = c.build(f"{c.OP}/dflash_greedy_B2_K3", variant="dflash", K=3, prompts=[5, 9], budget=[8, 8],
                   want=("accept",))
    kw = case.kwargs()
    assert c.step_clearness(kw)[0] >= c.CLEAR
    head = np.array(kw["head"])
    w = int(ss.speculative_step(**kw)["published"][0, 0])
    twin = (w + 1) % c.VOCAB
    head[twin] = head[w]
    assert c.step_clearness(dict(kw, head=head))[0] < c.CLEAR
