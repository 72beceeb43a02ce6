"""Teacher forcing judges the implementation's own choice (C2): at an ambiguous decision a
near-tied choice is ACCEPTABLE, an arbitrary one is not; divergences never hide each other;
outputs no decision influences are always compared. (Review findings, 2026-11-29.)"""

import numpy as np

from conformance.compare import Result, compare
from conformance.registry import DECISION, EXACT, Output
from reference.candidate_selector import candidate_selector
from reference.candidate_topk import candidate_topk
from reference.proposal_head import proposal_head

DEC = {"d": Output("d", DECISION)}
BOUND = {"d": {"margin_err": 1e-3}}  # tol = 2e-3 plus an FP32 spacing


def _forced(regret):
    def force(kwargs, impl):
        return {"d": np.array([1, 2]), "d.margin": np.array([1e-4, 5.0]), "d.regret": np.array(regret)}
    return force


def test_a_near_tied_choice_is_acceptable_an_arbitrary_one_fails():
    ref = {"d": np.array([1, 2]), "d.margin": np.array([1e-4, 5.0])}  # element 0 is ambiguous
    impl = {"d": np.array([7, 2])}
    near = compare(DEC, ref, impl, {}, BOUND, _forced([5e-4, 0.0]), dict)
    far = compare(DEC, ref, impl, {}, BOUND, _forced([2.9, 0.0]), dict)
    assert near.result == Result.ACCEPTABLE
    assert far.result == Result.FAIL and "scores 2.9 below the best" in far.detail


def test_two_acceptable_divergences_do_not_hide_each_other():
    # no force: each divergence hides what lies downstream of it, but never the other divergence
    outs = {"a": Output("a", DECISION), "t": Output("t", DECISION), "n": Output("n", EXACT)}
    ref = {"a": np.array([2]), "a.margin": np.array([1e-4]), "t": np.array([[5, 6, -1]]),
           "t.margin": np.array([[1e-4, 1e-4, np.inf]]), "n": np.array([3])}
    impl = {"a": np.array([0]), "t": np.array([[9, -1, -1]]), "n": np.array([1])}
    r = compare(outs, ref, impl, {}, {"a": {"margin_err": 1e-3}, "t": {"margin_err": 1e-3}})
    assert r.result == Result.ACCEPTABLE  # judged, not silently PASS
    assert "a: ambiguous: 1 acceptable" in r.detail and "t: ambiguous: 1 acceptable" in r.detail


def test_an_independent_output_is_compared_after_a_divergence():
    outs = {"a": Output("a", DECISION), "shape": Output("shape", EXACT)}
    ref = {"a": np.array([2]), "a.margin": np.array([1e-4]), "shape": np.array([[0, 0, 1]])}
    impl = {"a": np.array([0]), "shape": np.array([[4, 4, 4]])}
    bnd = {"a": {"margin_err": 1e-3}}
    assert compare(outs, ref, impl, {}, bnd).result == Result.ACCEPTABLE  # hidden when not declared
    assert compare(outs, ref, impl, {}, bnd, independent=("shape",)).result == Result.FAIL


def test_proposal_head_regret_is_the_logit_gap():
    hidden = np.array([[[1.0, 0.0]]])
    head = np.array([[3.0, 0.0], [2.5, 0.0], [-4.0, 0.0], [9.0, 0.0]])  # row 3 is padding
    out = proposal_head(hidden, head, vocab_size=3, forced_tokens=np.array([[1]]))
    assert out["tokens"][0, 0] == 0 and out["tokens.regret"][0, 0] == 0.5
    assert proposal_head(hidden, head, 3, forced_tokens=np.array([[3]]))["tokens.regret"][0, 0] == np.inf


def test_candidate_topk_regret_per_rank_and_repeated_ids():
    hidden = np.array([[[1.0]]])
    head = np.array([[4.0], [3.0], [2.999], [-1.0]])
    out = candidate_topk(hidden, head, vocab_size=4, top_k=3, forced_ids=np.array([[[0, 2, 1]]]))
    np.testing.assert_allclose(out["ids.regret"][0, 0], [0.0, 0.001, 0.001], atol=1e-12)
    far = candidate_topk(hidden, head, vocab_size=4, top_k=3, forced_ids=np.array([[[0, 3, 1]]]))
    assert far["ids.regret"][0, 0, 1] == 4.0  # logit 3.0 at rank 1 against -1.0
    twice = candidate_topk(hidden, head, vocab_size=4, top_k=3, forced_ids=np.array([[[0, 0, 1]]]))
    assert np.isinf(twice["ids.regret"][0, 0, :2]).all()


def test_greedy_selector_under_forcing_reports_the_choice_it_took():
    rng = np.random.default_rng(3)
    kw = {"hidden": rng.standard_normal((1, 2, 16)), "scores": np.array([[[2.0, 1.0, 0.5], [1.0, 0.9, 0.1]]]),
          "ids": np.array([[[1, 2, 3], [4, 5, 6]]]), "anchor": np.array([0]), "w_hidden": np.zeros((4, 16)),
          "w_pred": np.zeros((8, 4)), "w_succ": np.zeros((8, 4)), "temperature": np.array([0.0]),
          "seed": np.array([1], np.uint64), "frontier": np.array([10])}
    out = candidate_selector(**kw, forced_path=np.array([[1, 0]]))  # g = 0: E is the unary score
    assert out["path"][0, 0] == 0 and out["path.regret"][0, 0] == 1.0
    assert out["q"][0, 0, 1] == 1 and out["q"][0, 0].sum() == 1  # q is one-hot where the walk went


def _accept_kwargs(p0, proposal, seed, frontier):
    """One request, K = 1, one-hot q (DFlash), temperature 1 and no filters: p_0 = p0 exactly."""
    v = len(p0)
    with np.errstate(divide="ignore"):  # log 0 = -inf: a token the target never emits
        logits = np.log(np.array([p0, np.full(v, 1.0 / v)], dtype=np.float64))[None].astype(np.float32)
    one = np.ones(1, np.float32)
    return {"logits": logits, "proposals": np.array([[proposal]]), "live_proposals": np.array([1]),
            "frontier": np.array([frontier]), "seed": np.array([seed], np.uint64),
            "prompt_mask": np.zeros((1, v), np.uint8), "output_counts": np.zeros((1, v), np.int32),
            "temperature": one, "top_p": one, "min_p": 0 * one, "repetition_penalty": one,
            "frequency_penalty": 0 * one, "presence_penalty": 0 * one, "top_k": np.zeros(1, np.int32),
            "vocab_size": v}


def test_accept_regret_near_threshold_flip_versus_impossible_correction():
    from reference.rng import Purpose, uniform
    from reference.speculative_accept import speculative_accept

    seed, frontier = 11, 40
    u = float(uniform(seed, frontier + 1, Purpose.ACCEPT))
    # q(d) = 1 (one-hot), so the test is U < p(d): put p(d) a hair above U (accept, tiny margin)
    p_d = u + 1e-6
    p0 = [p_d, (1 - p_d) / 2, (1 - p_d) / 2, 0.0]
    kw = _accept_kwargs(p0, proposal=0, seed=seed, frontier=frontier)
    ref = speculative_accept(**kw)
    assert ref["accepted"][0] == 1
    # an implementation that rejected (a flip within float noise) must still draw *our* correction:
    # the residual race under the same key decides it; the rejected proposal (residual 0) and a
    # token with p = 0 are impossible corrections
    regret = {c: speculative_accept(**kw, forced_tokens=np.array([[c, -1]]))["tokens.regret"][0, 0] for c in range(4)}
    ours, other = sorted((1, 2), key=regret.get)
    assert regret[ours] < 1e-5  # only the flip of the accept test: acceptable
    assert np.isfinite(regret[other]) and regret[other] > regret[ours]  # the race's losing contender
    assert regret[0] == np.inf and regret[3] == np.inf
