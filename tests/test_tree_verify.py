"""tree_verify: a tree built and verified by hand, the main-chain property against
speculative_accept, tree-shape properties against brute force, greedy longest path,
the chi-square test of the sampled verification (and a planted bug failing it)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reference.tree_verify as tv
from conformance.cases.speculative_accept import accept_inputs
from conformance.cases.tree_verify import generate, lattice, tv_inputs
from reference.rng import Purpose
from reference.speculative_accept import speculative_accept
from tests.casetools import U, race
from tests.test_acceptance_statistics import ALPHA, chi2_sf, gof


def run(inputs, params):
    return tv.tree_verify(**inputs, **params)




# --- by hand -------------------------------------------------------------------------------

# K = 2, k = 2. Step 0 (anchor row 0): ids (1, 2), E = (1, 0). Step 1: ids (3, 1);
# after rank 0 (token 1) E = (0, 2), after rank 1 (token 2) E = (0.5, 0).
IDS = np.array([[1, 2], [3, 1]])
E = np.array([[[1.0, 0.0], [9.0, 9.0]], [[0.0, 2.0], [0.5, 0.0]]])  # row 1 of step 0 is never read


def test_greedy_tree_by_hand():
    # greedy walk: rank 0 (E 1 > 0) then rank 1 (E 2 > 0): chain tokens 1, 1.
    # Scores at rho = 1: log q. Chain: -0.313 (token 1), -0.313 + log 0.881 = -0.440.
    # Candidates: root rank 1 (token 2) log 0.269 = -1.313; under node 0 rank 0 (token 3) -0.313 + log 0.119 = -2.440;
    # under the root's rank 1: token 3 at -1.313 + log 0.622 = -1.787, token 1 at -1.313 + log 0.378 = -2.287.
    bigram = np.zeros((4, 4))
    bigram[0, 2] = bigram[2, 1] = bigram[1, 3] = 2.0  # greedy target after the anchor 0: 2, 1, 3
    inputs, params = tv_inputs(0, [IDS], [E], 0.0, 7, 100, bigram, 6)
    out = run(inputs, params)
    assert out["parent"].tolist() == [[-1, 0, -1, 2, 2, 0]]
    assert out["node_tokens"].tolist() == [[1, 1, 2, 3, 1, 3]]
    ancestors = {0: [0], 1: [0, 1], 2: [2], 3: [2, 3], 4: [2, 4], 5: [0, 5]}
    want = np.zeros((6, 6), np.uint8)
    for n, anc in ancestors.items():
        want[n, anc] = 1
    np.testing.assert_array_equal(out["tree_mask"][0], want)
    # verify: the root's children hold 2 (node 2), node 2's hold 1 (node 4), node 4 is a leaf: bonus 3
    assert out["tokens"].tolist() == [[2, 1, 3]] and out["accepted"].tolist() == [2]
    assert out["num_out"].tolist() == [3]
    np.testing.assert_array_equal(out["tokens.margin"], [[2.0, 2.0, 2.0]])
    # budget 2 is the chain: token 1 is not the target's 2, so the correction is 2
    out = run(*tv_inputs(0, [IDS], [E], 0.0, 7, 100, bigram, 2))
    assert out["tokens"].tolist() == [[2, -1, -1]] and out["accepted"].tolist() == [0]
    # budget 7 > the 6 nodes the lattice holds: padding
    out = run(*tv_inputs(0, [IDS], [E], 0.0, 7, 100, bigram, 7))
    assert out["node_tokens"][0, 6] == -1 and out["parent"][0, 6] == -1 and not out["tree_mask"][0, 6].any()


def test_sampled_sibling_after_rejected_main_child():
    """K = 1, k = 2 at T = 1: both root candidates are nodes. The main child c0 (drawn from q)
    is rejected by U_0 (index 0), the sibling c1 is accepted against the residual by U_1 (index 1)."""
    seed, F = 31337, 4000
    ids = np.array([[0, 1]])
    e = np.array([[[0.3, -0.2], [0.0, 0.0]]])
    q = np.exp([0.3, -0.2]) / np.exp([0.3, -0.2]).sum()
    q = q.astype(np.float32).astype(np.float64)
    j0 = race(q, seed, F, Purpose.DFLASH2_PROPOSAL)  # the walk's rank
    c0, c1 = ids[0, j0], ids[0, 1 - j0]
    u0, u1 = U(seed, F + 1, Purpose.ACCEPT, 0), U(seed, F + 1, Purpose.ACCEPT, 1)
    # p over tokens (0, 1, 2): p(c0) = u0 q(c0) / 2 rejects; the residual max(p - q, 0) lives on c1 and
    # token 2; with p(2) = a x, x = p(c1) - q(c1), a = (1 - u1) / (2 u1): r(c1) = 1 / (1 + a) > u1 accepts
    a = (1 - u1) / (2 * u1)
    p = np.zeros(3)
    p[c0] = u0 * q[j0] / 2
    x = (1 - p[c0] - q[1 - j0]) / (1 + a)
    p[c1], p[2] = q[1 - j0] + x, a * x
    bigram = np.zeros((3, 3))
    bigram[2] = np.log(p)  # the anchor is token 2
    bigram[c1] = np.log([0.2, 0.5, 0.3])
    out = run(*tv_inputs(2, [ids], [e], 1.0, seed, F, bigram, 2))
    assert out["node_tokens"].tolist() == [[c0, c1]] and out["parent"].tolist() == [[-1, -1]]
    bonus = race(np.exp(bigram[c1].astype(np.float32).astype(np.float64)), seed, F + 2, Purpose.BONUS)
    assert out["tokens"].tolist() == [[c1, bonus]] and out["accepted"].tolist() == [1]


def test_budget_outside_1_to_64_is_refused():
    for n in (0, 65):
        with pytest.raises(ValueError, match="tree_nodes"):
            run(*tv_inputs(0, [IDS], [E], 0.0, 7, 100, np.zeros((4, 4)), n))


# --- properties ----------------------------------------------------------------------------


def _random(s, K, k, V, T, N, noise=0.7):
    rng = np.random.default_rng(s)
    bigram = rng.standard_normal((V, V)) * 2.5
    anchor = int(rng.integers(V))
    ids, e = lattice(rng, bigram, anchor, K, k, noise)
    return tv_inputs(anchor, [ids], [e], T, rng.integers(0, 2**64, dtype=np.uint64), rng.integers(0, 2**33), bigram, N)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 6), st.sampled_from([0.0, 0.6, 1.0]), st.integers(0, 2))
def test_chain_budget_is_speculative_accept(s, K, T, short):
    """Budget N <= K: the tree is the walked chain's first N nodes, verified exactly as
    speculative_accept verifies P = N proposals with the retained q (main-chain property)."""
    N = max(1, K - short)
    inputs, params = _random(s, K, 4, 10, T, N)
    out = run(inputs, params)
    ids, e = inputs["ids"][0], inputs["energies"][0]
    seed, F, a = inputs["seed"][0], int(inputs["frontier"][0]), int(inputs["anchor"][0])
    ranks, _ = tv.walk(ids, e, inputs["temperature"][0], np.uint64(seed), F)
    d = [int(ids[i, r]) for i, r in enumerate(ranks)]
    assert out["node_tokens"][0].tolist() == d[:N] and out["parent"][0].tolist() == list(range(-1, N - 1))
    q = None
    if T > 0:
        prev = [0] + ranks[:-1]
        q = np.stack([tv._q(e[i, prev[i]], inputs["temperature"][0]) for i in range(K)])[None]
    sa = speculative_accept(
        **accept_inputs(
            inputs["target_bigram"][[a] + d][None],
            [d],
            N,
            F,
            seed,
            q=q,
            q_ids=None if q is None else ids[None],
            temperature=inputs["temperature"],
        )[0],
        vocab_size=10,
    )
    np.testing.assert_array_equal(out["tokens"], sa["tokens"])
    np.testing.assert_array_equal(out["accepted"], sa["accepted"])
    np.testing.assert_array_equal(out["num_out"], sa["num_out"])
    if T > 0:
        np.testing.assert_allclose(out["tokens.margin"], sa["tokens.margin"], rtol=1e-9)


def _paths(out, ids):
    """Token paths of the nodes (siblings have distinct tokens, so a path names a node)."""
    par, tok = out["parent"][0], out["node_tokens"][0]
    paths = []
    for n in range(len(tok)):
        if tok[n] < 0:
            break
        paths.append((paths[par[n]] if par[n] >= 0 else ()) + (int(tok[n]),))
    return paths


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([0.0, 0.8]), st.integers(1, 40))
def test_tree_is_chain_plus_best_paths_by_score(s, T, extra):
    """Brute force: every path of the lattice (k = 3, K = 3: 39 nodes) scored by its sum of
    log q; the tree past the chain is the top-scoring paths (continuous energies: no ties)."""
    K, k = 3, 3
    inputs, params = _random(s, K, k, 8, T, min(K + extra, 64))
    out = run(inputs, params)
    ids, e = inputs["ids"][0], inputs["energies"][0]
    rho = float(inputs["temperature"][0]) or 1.0
    scored = {}

    def grow(path, ranks, score):
        i = len(path)
        if i == K:
            return
        q = tv._q(e[i, ranks[-1] if ranks else 0], rho).astype(np.float64)
        for c in range(k):
            p = (*path, int(ids[i, c]))
            scored[p] = score + math.log(q[c])
            grow(p, [*ranks, c], scored[p])

    grow((), [], 0.0)
    paths = _paths(out, ids)
    chain = paths[:K]
    assert all(len(p) == i + 1 for i, p in enumerate(chain))  # node i at depth i, parent i - 1
    rest = sorted((p for p in scored if p not in chain), key=lambda p: -scored[p])
    want = rest[: params["tree_nodes"] - K]
    assert paths[K:] == want
    # the tree mask is the ancestor relation of these paths
    m = out["tree_mask"][0]
    for i, p in enumerate(paths):
        for j, r in enumerate(paths):
            assert m[i, j] == (p[: len(r)] == r)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 5), st.integers(1, 63))
def test_budget_grows_the_tree_by_appending(s, K, N):
    a = run(*_random(s, K, 4, 10, 0.8, N))
    b = run(*_random(s, K, 4, 10, 0.8, N + 1))
    np.testing.assert_array_equal(a["parent"][0], b["parent"][0, :N])
    np.testing.assert_array_equal(a["node_tokens"][0], b["node_tokens"][0, :N])
    np.testing.assert_array_equal(a["tree_mask"][0], b["tree_mask"][0, :N, :N])


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 5), st.integers(1, 64))
def test_greedy_accepts_the_longest_target_path_in_the_tree(s, K, N):
    inputs, params = _random(s, K, 4, 10, 0.0, N, noise=1.5)
    out = run(inputs, params)
    big, y = inputs["target_bigram"], [int(inputs["anchor"][0])]
    for _ in range(K + 1):
        y.append(int(np.argmax(big[y[-1]])))
    paths = set(_paths(out, inputs["ids"][0]))
    A = max(m for m in range(K + 1) if m == 0 or tuple(y[1 : m + 1]) in paths)
    assert out["accepted"][0] == A and out["tokens"][0, : A + 1].tolist() == y[1 : A + 2]


def test_same_request_in_any_row_gives_the_same_result():
    one = _random(5, 4, 4, 10, 1.0, 12)
    out1 = run(*one)
    inputs, params = one
    tripled = {k: (np.concatenate([v] * 3) if k != "target_bigram" else v) for k, v in inputs.items()}
    out3 = run(tripled, params)
    for k in out1:
        for b in range(3):
            np.testing.assert_array_equal(out3[k][b], out1[k][0])


# --- the golden cases ------------------------------------------------------------------------

CASES = generate()


def test_generator_is_deterministic_with_unique_ids():
    again = generate()
    assert [c.id for c in again] == [c.id for c in CASES] and len({c.id for c in CASES}) == len(CASES)
    assert 10 <= len(CASES) <= 60
    for a, b in zip(CASES, again):
        assert a.params == b.params
        for k in a.inputs:
            assert a.inputs[k].dtype == b.inputs[k].dtype and a.inputs[k].tobytes() == b.inputs[k].tobytes()
    budgets = {c.params["tree_nodes"] for c in CASES}
    assert {1, 64} <= budgets


@pytest.mark.parametrize("case", [c for c in CASES if "rng_batch_row" in c.flags], ids=lambda c: c.id)
def test_row_keyed_variant_fails_the_batch_row_case(case, monkeypatch):
    ref = run(case.inputs, case.params)
    orig = tv._verify_row
    rows = iter(range(10**6))

    def keyed_by_row(nodes, ids, energies, temperature, seed, *rest):
        return orig(nodes, ids, energies, temperature, np.uint64(seed) ^ np.uint64(next(rows)), *rest)

    monkeypatch.setattr(tv, "_verify_row", keyed_by_row)
    bug = run(case.inputs, case.params)
    assert not np.array_equal(ref["tokens"], bug["tokens"])


# --- distribution preservation (chi-square, as tests/test_acceptance_statistics.py) ---------

V, K, KK, NODES, TRIALS, F = 6, 2, 3, 7, 2500, 500
_rng = np.random.default_rng(2024)
BIGRAM = np.round(_rng.standard_normal((V, V)) * 1.2, 3)
ANCHOR = 0
S_IDS = np.array([[1, 2, 3], [0, 2, 4]])
S_E = np.round(_rng.standard_normal((K, KK, KK)), 3)


def _sampled_trials():
    inputs, params = tv_inputs(
        ANCHOR,
        np.broadcast_to(S_IDS, (TRIALS, K, KK)),
        np.broadcast_to(S_E, (TRIALS, K, KK, KK)),
        1.0,
        np.arange(TRIALS, dtype=np.uint64),
        F,
        BIGRAM,
        NODES,
    )
    return run(inputs, params)["tokens"]


def _p(prev):
    z = BIGRAM[prev].astype(np.float32).astype(np.float64)
    return np.exp(z - z.max()) / np.exp(z - z.max()).sum()


def _tests(tokens):
    first = gof(np.bincount(tokens[:, 0], minlength=V), _p(ANCHOR))
    stat, df = 0.0, 0
    for v in range(V):
        sel = (tokens[:, 1] >= 0) & (tokens[:, 0] == v)
        if sel.sum() * _p(v).min() < 5:
            continue
        s, pv, d = gof(np.bincount(tokens[sel, 1], minlength=V), _p(v))
        stat, df = (math.inf, df + d) if pv == 0 else (stat + s, df + d)
    return first, (stat, chi2_sf(stat, df), df)


@pytest.fixture(scope="module")
def sampled():
    return _sampled_trials()


@pytest.mark.slow
def test_sampled_tree_preserves_the_target(sampled):
    """First token ~ p(. | anchor), second ~ p(. | first) when the first was accepted; each at
    ALPHA = 1e-3 (fixed seeds: deterministic). The trees hold siblings past the chain (7 nodes
    over K = 2), and paths leave the main chain."""
    (s1, p1, d1), (s2, p2, d2) = _tests(sampled)
    assert p1 > ALPHA, f"first token chi2 {s1:.1f} on {d1} df"
    assert p2 > ALPHA, f"second token chi2 {s2:.1f} on {d2} df"
    assert (sampled[:, 1] >= 0).mean() > 0.2  # enough depth-1 acceptances for the second test
    chain0 = [S_IDS[0, tv.walk(S_IDS, S_E, np.float32(1.0), np.uint64(s), F)[0][0]] for s in range(200)]
    left = np.mean([(sampled[s, 1] >= 0) and sampled[s, 0] != chain0[s] for s in range(200)])
    assert left > 0.1  # accepted siblings: the tree, not just the chain, is under test


@pytest.mark.slow
def test_sampled_tree_without_residual_update_fails(monkeypatch):
    """Planted bug: every sibling tested against p itself (no max(r - g, 0) between stages)."""
    monkeypatch.setattr(tv, "_after_rejection", lambda r, g: r)
    (s1, p1, d1), _ = _tests(_sampled_trials())
    assert p1 < ALPHA, f"the bug passed: chi2 {s1:.1f} on {d1} df"
