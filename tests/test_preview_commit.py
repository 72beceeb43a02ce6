"""preview_commit (C6): hand-derived commits, coverage refusals, an independent preview
loop over random blocks, planted bugs on the flagged cases, and the generator."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.cases.preview_commit import MASK, OUTPUTS, generate, pc_inputs
from reference.preview_commit import (
    CoverageError,
    catch_up,
    check_coverage,
    preview_commit,
    require_caught_up,
)

EOS, STOP = 900, 950


def commit(tokens, L, **kw):
    kw.setdefault("eos_ids", [EOS])
    kw.setdefault("stop_ids", [STOP])
    inputs, params = pc_inputs([tokens], L, kw.pop("anchor", 9), kw.pop("frontier", 100), **kw)
    return {k: v.tolist() for k, v in preview_commit(**inputs, **params).items()}


def test_N_equals_L():
    out = commit([5, 6, 7, -1], 3)
    assert out == {
        "n": [3],
        "committed": [[9, 5, 6, -1]],
        "published": [[5, 6, 7, -1]],
        "next_anchor": [7],
        "frontier": [103],
        "ctx_frontier": [100],
        "pending": [3],
    }


def test_eos_inside_the_block_is_kept():
    out = commit([5, EOS, 7, 8], 4)
    assert out["n"] == [2] and out["published"] == [[5, EOS, -1, -1]] and out["committed"] == [[9, 5, -1, -1]]
    assert out["next_anchor"] == [EOS] and out["frontier"] == [102] and out["pending"] == [2]


def test_first_of_stop_and_eos_cuts():
    assert commit([5, STOP, EOS, 8], 4)["n"] == [2]
    assert commit([EOS, STOP, 7, 8], 4)["n"] == [1]


def test_eos_past_L_is_not_read():
    assert commit([5, 6, EOS, -1], 2)["n"] == [2]


def test_cancel_commits_nothing():
    out = commit([5, EOS, 7, 8], 4, cancel=1)
    assert out["n"] == [0] and out["committed"] == [[-1] * 4] and out["published"] == [[-1] * 4]
    assert out["next_anchor"] == [-1] and out["frontier"] == [100] and out["pending"] == [0]


@pytest.mark.parametrize("budget,n", [(1, 1), (0, 0), (-5, 0), (2, 2), (3, 3), (10, 3)])
def test_budget_caps_last(budget, n):
    out = commit([5, 6, 7, 8], 3, budget=budget)
    assert out["n"] == [n] and out["frontier"] == [100 + n]
    assert out["next_anchor"] == [[-1, 5, 6, 7][n]]


def test_budget_below_the_eos_cut():
    assert commit([5, 6, EOS, 8], 4, budget=2)["n"] == [2]


def test_mask_token_is_published():
    out = commit([5, MASK, 7, -1], 3)
    assert out["published"] == [[5, MASK, 7, -1]] and out["committed"] == [[9, 5, MASK, -1]]
    assert commit([5, 6, MASK, -1], 3)["next_anchor"] == [MASK]


def test_refuses_a_block_proposed_without_catch_up():
    with pytest.raises(CoverageError, match="context frontier 98"):
        commit([5, 6], 2, ctx_frontier=98)
    with pytest.raises(CoverageError):
        commit([5, 6], 2, ctx_frontier=101)


@pytest.mark.parametrize("L", [0, 5])
def test_refuses_num_out_outside_1_to_W(L):
    with pytest.raises(ValueError, match="licenses"):
        commit([5, 6, 7, 8], L)


def test_coverage_helpers():
    check_coverage([103, 50], [100, 50], [3, 0])
    with pytest.raises(CoverageError, match="target frontier 103, context frontier 100, pending rows 2"):
        check_coverage([103], [100], [2])
    with pytest.raises(CoverageError):
        check_coverage([100], [101], [-1])
    ctx, pending = catch_up([103, 50], [100, 50], [3, 0])
    assert ctx.tolist() == [103, 50] and pending.tolist() == [0, 0]
    with pytest.raises(CoverageError, match="fork needs a caught-up context"):
        require_caught_up([103], [100], [3], what="fork")
    require_caught_up([103], [103], [0])
    with pytest.raises(CoverageError):
        catch_up([103], [100], [4])


# --- rounds with an independent preview -----------------------------------------------------


def preview_loop(tokens, L, budget, cancel, ends):
    """N by walking the tokens one at a time, stopping as the frontend would."""
    if cancel:
        return 0
    n = 0
    for t in tokens[:L]:
        if n >= budget:
            break
        n += 1
        if t in ends:
            break
    return n


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 5))
def test_rounds_follow_an_independent_preview(s, rounds):
    rng = np.random.default_rng(s)
    F = F0 = int(rng.integers(0, 2**40))
    anchor = int(rng.integers(0, 20))
    stream = []
    for _ in range(rounds):
        W = int(rng.integers(1, 17))
        L = int(rng.integers(1, W + 1))
        toks = np.full(W, -1)
        toks[:L] = rng.integers(0, 20, L)  # ids 0..19: EOS 3 and stop 7 appear often
        budget, cancel = int(rng.integers(-1, 20)), int(rng.random() < 0.15)
        inputs, params = pc_inputs([toks], L, anchor, F, budget=budget, cancel=cancel, eos_ids=[3], stop_ids=[7])
        out = preview_commit(**inputs, **params)
        n = preview_loop(toks.tolist(), L, budget, cancel, {3, 7})
        assert out["n"][0] == n
        assert out["committed"][0, :n].tolist() == ([anchor] + toks[: n - 1].tolist() if n else [])
        assert out["published"][0, :n].tolist() == toks[:n].tolist()
        assert np.all(out["committed"][0, n:] == -1) and np.all(out["published"][0, n:] == -1)
        assert out["frontier"][0] == F + n and out["ctx_frontier"][0] == F and out["pending"][0] == n
        if n:
            assert out["next_anchor"][0] == toks[n - 1]
        else:
            assert out["next_anchor"][0] == -1
        # before the next proposal (or a checkpoint) the context must catch up
        if n:
            with pytest.raises(CoverageError):
                require_caught_up(out["frontier"], out["ctx_frontier"], out["pending"])
        ctx, pending = catch_up(out["frontier"], out["ctx_frontier"], out["pending"])
        require_caught_up(out["frontier"], ctx, pending)
        stream += toks[:n].tolist()
        F = int(out["frontier"][0])
        anchor = int(out["next_anchor"][0]) if n else anchor
        if cancel:
            break
    assert F - F0 == len(stream)  # the frontier advanced by exactly the published tokens


# --- the golden cases and their planted bugs -------------------------------------------------

CASES = generate()


def _buggy(case, bug):
    """preview_commit with one planted bug, rebuilt from the independent preview loop."""
    kw = case.kwargs()
    B, W = kw["tokens"].shape
    ends = set(kw["eos_ids"].tolist()) | set(kw["stop_ids"].tolist())
    n, published = [], np.full((B, W), -1)
    for b in range(B):
        toks, L = kw["tokens"][b].tolist(), int(kw["num_out"][b])
        N = preview_loop(toks, L, int(kw["budget"][b]), int(kw["cancel"][b]), ends)
        if bug == "preview_cut_before_eos" and N and toks[N - 1] in ends:
            N -= 1
        out = toks[:N]
        if bug == "mask_token_stripped":
            out = [t for t in out if t != kw["mask_token_id"]]
        n.append(len(out))
        published[b, : len(out)] = out
    return np.array(n), published


@pytest.mark.parametrize(
    "case,bug",
    [(c, f) for c in CASES for f in c.flags if f in ("preview_cut_before_eos", "mask_token_stripped")],
    ids=lambda x: x if isinstance(x, str) else x.id,
)
def test_flagged_case_catches_its_bug(case, bug):
    out = preview_commit(**case.kwargs())
    n, published = _buggy(case, None)
    assert np.array_equal(out["n"], n) and np.array_equal(out["published"], published)  # the loop agrees
    n, published = _buggy(case, bug)
    assert not (np.array_equal(out["n"], n) and np.array_equal(out["published"], published))


def test_generator_is_deterministic_with_unique_ids():
    again = generate()
    assert [c.id for c in again] == [c.id for c in CASES] and len({c.id for c in CASES}) == len(CASES)
    assert 10 <= len(CASES) <= 60
    for a, b in zip(CASES, again):
        assert a.params == b.params == {"mask_token_id": MASK}
        for k in a.inputs:
            assert a.inputs[k].dtype == b.inputs[k].dtype and a.inputs[k].tobytes() == b.inputs[k].tobytes()


def test_cases_cover_the_sweep():
    outs = [preview_commit(**c.kwargs()) for c in CASES]
    n = np.concatenate([o["n"] for o in outs])
    L = np.concatenate([c.inputs["num_out"] for c in CASES])
    assert (n == 0).any() and (n == L).any() and (n == 1).any() and ((n > 0) & (n < L)).any()
    assert all(set(o) == set(OUTPUTS) for o in outs)
