"""Second, independent guards for reference bugs that a single test caught before (issue 14):
RoPE on pairs i >= 1 and at a large position, RMSNorm where eps dominates, target distributions
where penalty order, temperature and min-p interact, and trees whose best path is not the best
local step, with the tree's tie rules (lower depth, then lower parent node, then lower rank).

Every expected value is derived by hand in the comment next to it (or is the written formula
evaluated with the standard library), never by the function under test, so regenerating the
golden vectors from a buggy reference does not make these tests agree with the bug.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import reference.context_kv as ckv
from conformance.cases.tree_verify import tv_inputs
from reference.norms import plain_head_rmsnorm, plain_rmsnorm, rope_1d
from reference.target_distribution import target_distribution
from reference.tree_verify import tree_verify
from tests.casetools import U32
from tests.casetools import philox_py as _philox_py

F32_EPS = 2.0**-24

# --- RoPE ----------------------------------------------------------------------------------------
# D = 8, theta = 2^16: f_i = theta^(-2i/D) = 2^(-16 * 2i / 8) = 2^(-4i) = 1, 2^-4, 2^-8, 2^-12, all
# exact, so a = p f_i is exact in float64 for p < 2^40 * 2^12. The pair of i is (i, i + 4):
#   out[i] = x_i cos a_i - x_(i+4) sin a_i,   out[i+4] = x_(i+4) cos a_i + x_i sin a_i.
# The i/D bug would give f_i = 2^(-2i) (1, 1/4, 1/16, 1/64): the same only at pair 0.

D, THETA = 8, 2.0**16
FREQ = [1.0, 2.0**-4, 2.0**-8, 2.0**-12]


def rope_by_hand(x, p):
    out = [0.0] * D
    for i in range(D // 2):
        a = p * FREQ[i]  # exact (see above)
        c, s = math.cos(a), math.sin(a)
        out[i] = x[i] * c - x[i + 4] * s
        out[i + 4] = x[i + 4] * c + x[i] * s
    return out


X = [0.5, 1.0, -2.0, 3.0, 1.5, -1.0, 0.25, 2.0]


@pytest.mark.parametrize("p", [3, 1000, 2**40 + 5])
def test_rope_every_pair_by_hand(p):
    # at p = 2^40 + 5: a_1 = 2^36 + 5/16, a_2 = 2^32 + 5/256, a_3 = 2^28 + 5/4096, exact in float64
    got = rope_1d(np.array([[X]]), np.array([p]), THETA)[0, 0]
    np.testing.assert_allclose(got, rope_by_hand(X, p), rtol=0, atol=1e-12)


def test_rope_pair_1_alone():
    # x = e_1 at p = 8: pair (1, 5) turns by a_1 = 8 * 2^-4 = 0.5 rad: out[1] = cos 0.5, out[5] = sin 0.5
    x = np.zeros(D)
    x[1] = 1.0
    got = rope_1d(x[None, None], np.array([8]), THETA)[0, 0]
    want = np.zeros(D)
    want[1], want[5] = math.cos(0.5), math.sin(0.5)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-15)


def test_context_k_is_rotated_at_its_absolute_position():
    """context_kv at start 2^40 + 5, two rows (positions 2^40 + 5 and 2^40 + 6): W_key = I, unit
    norm weight, eps = 0 and rows of RMS 1 (entries +-1), so the head norm is the identity and the
    stored K is BF16 of the hand rotation: within half a BF16 spacing, 2^-8 of |K| at most (8 significant
    bits: half a spacing is 2^-8 of the binade's lower end). A wrong angle moves K by O(1)."""
    rows = np.array([[1, 1, 1, 1, -1, -1, -1, -1], [1, -1, 1, -1, 1, -1, 1, -1]], float)
    start, cap = 2**40 + 5, 4
    zeros = np.zeros((cap, 1, D))
    out = ckv.context_kv(rows, zeros, zeros, np.eye(D), np.eye(D), np.ones(D), start=start, eps=0.0, theta=THETA,
                         head_dim=D, storage="ring")
    for t in range(2):
        p = start + t
        want = np.array(rope_by_hand(list(rows[t]), p))
        got = out["k_cache"][p % cap, 0]  # ring slot p mod C
        assert np.all(np.abs(got - want) <= 2.0**-8 * np.abs(want)), (t, got, want)
    assert int(out["frontier"]) == start + 2


# --- RMSNorm where eps dominates ---------------------------------------------------------------


def test_rmsnorm_eps_inside_the_square_root():
    # x = 2^-10 everywhere: mean x^2 = 2^-20; eps = 3 * 2^-20: sqrt(4 * 2^-20) = 2^-9, out = 1/2.
    # (eps after the root: 2^-10 / (2^-10 + 3 * 2^-20) = 1 / (1 + 3 * 2^-10) = 0.99708...)
    x = np.full((1, 4), 2.0**-10)
    np.testing.assert_array_equal(plain_rmsnorm(x, np.ones(4), 3 * 2.0**-20), [[0.5] * 4])
    # x = (3, 4) 2^-10, w = (1, 2): mean x^2 = 12.5 * 2^-20; eps = 3.5 * 2^-20: sqrt(16 * 2^-20) = 4 * 2^-10,
    # out = (3/4 * 1, 4/4 * 2) = (0.75, 2.0)
    got = plain_rmsnorm(np.array([[3.0, 4.0]]) * 2.0**-10, np.array([1.0, 2.0]), 3.5 * 2.0**-20)
    np.testing.assert_array_equal(got, [[0.75, 2.0]])
    # eps = 0, x = (1, 7): mean 25, root 5: (0.2, 1.4) times w = (1, 2)
    np.testing.assert_allclose(plain_rmsnorm(np.array([[1.0, 7.0]]), np.array([1.0, 2.0]), 0.0), [[0.2, 2.8]],
                               rtol=1e-15)


def test_head_rmsnorm_per_head_with_eps_dominating():
    # two heads of D = 2: head 0 (3, 4) 2^-10 as above -> (0.75, 1.0); head 1 (2^-10, 2^-10): mean 2^-20,
    # + 3.5 * 2^-20 = 4.5 * 2^-20, root 2^-10 * 3 / sqrt 2: 2^-10 / that = sqrt(2) / 3 each
    x = np.array([[[3.0, 4.0], [1.0, 1.0]]]) * 2.0**-10
    got = plain_head_rmsnorm(x, np.ones(2), 3.5 * 2.0**-20, 2)
    np.testing.assert_allclose(got, [[[0.75, 1.0], [math.sqrt(2) / 3] * 2]], rtol=1e-15)


def test_context_k_norm_with_eps_dominating():
    """context_kv at position 0 (every angle 0: RoPE is the identity), W_key = I: k_raw = 2^-10 in all
    D = 8 entries, eps = 3 * 2^-20 -> K = 1/2 exactly (BF16 holds it); w = 2 -> 1."""
    rows = np.full((1, D), 2.0**-10)
    zeros = np.zeros((2, 1, D))
    for w, want in ((1.0, 0.5), (2.0, 1.0)):
        out = ckv.context_kv(rows, zeros, zeros, np.eye(D), np.eye(D), np.full(D, w), start=0, eps=3 * 2.0**-20,
                             theta=THETA, head_dim=D, storage="ring")
        np.testing.assert_array_equal(out["k_cache"][0, 0], [want] * D)


# --- target distribution: order of penalties, temperature and filters ----------------------------


def probs(logits, counts=None, prompt=(), T=1.0, top_p=1.0, min_p=0.0, rho=1.0, f=0.0, r=0.0, top_k=0):
    """One row through the Op, from plain Python values."""
    z = np.asarray([logits], np.float32)
    v = z.shape[1]
    pm = np.zeros((1, v), np.uint8)
    pm[0, list(prompt)] = 1
    oc = np.zeros((1, v), np.int32) if counts is None else np.asarray([counts], np.int32)

    def f32(x):
        return np.asarray([x], np.float32)

    return target_distribution(logits=z, prompt_mask=pm, output_counts=oc, temperature=f32(T), top_p=f32(top_p),
                               min_p=f32(min_p), repetition_penalty=f32(rho), frequency_penalty=f32(f),
                               presence_penalty=f32(r), top_k=np.asarray([top_k], np.int32), vocab_size=v)["probs"][0]


def softmax(z):
    e = [math.exp(x - max(z)) for x in z]
    return [x / sum(e) for x in e]


def close(got, want):
    np.testing.assert_allclose(got, want, rtol=8 * F32_EPS, atol=1e-30)


def test_penalties_come_before_temperature():
    # frequency 1 on token 0 (count 1), T = 2: z = (0 - 1, 0) / 2 = (-0.5, 0) -> p0 = 1 / (1 + e^0.5)
    # (after the temperature it would be (0/2 - 1, 0) = (-1, 0): p0 = 1 / (1 + e) = 0.269 instead of 0.378)
    close(probs([0.0, 0.0], counts=[1, 0], f=1.0, T=2.0), softmax([-0.5, 0.0]))
    # presence 1, T = 1/2: z = (0 - 1, 0) / 0.5 = (-2, 0); after the temperature: (-1, 0)
    close(probs([0.0, 0.0], counts=[3, 0], r=1.0, T=0.5), softmax([-2.0, 0.0]))
    # frequency 0.5 x count 2 on token 1, T = 4: z = (1, 1 - 1, 0) / 4 = (0.25, 0, 0)
    close(probs([1.0, 1.0, 0.0], counts=[0, 2, 0], f=0.5, T=4.0), softmax([0.25, 0.0, 0.0]))


def test_min_p_measures_the_tempered_distribution():
    z1 = float(np.float32(-2 * math.log(2)))  # the stored logit: ln(1/4) to FP32
    # T = 2: p1 / p0 = e^(z1 / 2) = 1/2 (to 1e-8) >= min_p 0.4: both stay, p = softmax(z / 2).
    # (min-p on the T = 1 distribution: ratio 1/4 < 0.4 would drop token 1: p = (1, 0).)
    close(probs([0.0, z1], T=2.0, min_p=0.4), softmax([0.0, z1 / 2]))
    # T = 1/2: ratio e^(2 z1) = 1/16 < min_p 0.1: token 1 dropped, p = (1, 0).
    # (at T = 1 the ratio 1/4 >= 0.1 would keep it: p = (16/17, 1/17).)
    np.testing.assert_array_equal(probs([0.0, z1], T=0.5, min_p=0.1), [1.0, 0.0])


def test_min_p_compares_probabilities_not_logits():
    # z = (1, -1): p1 / p0 = e^-2 = 0.135 >= min_p 0.1: both stay. (Logits: -1 < 0.1 * 1 would drop it.)
    close(probs([1.0, -1.0], min_p=0.1), softmax([1.0, -1.0]))
    # z = (3, 1): ratio e^-2 = 0.135 < min_p 0.2: token 1 dropped. (Logits: 1 >= 0.2 * 3 would keep it.)
    np.testing.assert_array_equal(probs([3.0, 1.0], min_p=0.2), [1.0, 0.0])
    # negative logits: z = (-1, -3), T = 1, min_p 0.1: ratio e^-2 >= 0.1, both stay
    close(probs([-1.0, -3.0], min_p=0.1), softmax([-1.0, -3.0]))


def test_min_p_keeps_a_token_exactly_at_the_threshold():
    # "drop tokens whose probability is below min_p * the largest": at min_p = 1 every maximum stays
    # (p = p_max is not below it). z = (1, 1, 0): p = (1/2, 1/2, 0).
    np.testing.assert_array_equal(probs([1.0, 1.0, 0.0], min_p=1.0), [0.5, 0.5, 0.0])


def test_penalties_temperature_and_min_p_together():
    """z = (2, 2, 0), token 0 seen once, frequency 2, T = 2, min_p 0.3:
    penalties: (0, 2, 0); temperature: (0, 1, 0); p ∝ (1, e, 1); ratios to the largest 1/e = 0.368
    >= 0.3: all stay, p = (1, e, 1) / (2 + e).
    Each misordering gives something else: penalty after T: (1 - 2, 1, 0) -> ratios e^-2 (dropped),
    e^-1 (kept) -> (0, e, 1) / (1 + e); min-p before T (on (0, 2, 0)): ratios e^-2 < 0.3 drop both
    sides -> (0, 1, 0); min-p on the logits (0, 1, 0): 0 < 0.3 drops both -> (0, 1, 0)."""
    e = math.e
    close(probs([2.0, 2.0, 0.0], counts=[1, 0, 0], f=2.0, T=2.0, min_p=0.3), [1 / (2 + e), e / (2 + e), 1 / (2 + e)])


def test_top_p_measures_the_tempered_distribution():
    # z = (0, ln(1/4)), T = 2: p = (2/3, 1/3) (to 1e-8); top_p 0.7: 2/3 < 0.7, so both stay.
    # (at T = 1, p = (0.8, 0.2) and 0.8 >= 0.7 would keep one token.)
    z1 = float(np.float32(-2 * math.log(2)))
    close(probs([0.0, z1], T=2.0, top_p=0.7), softmax([0.0, z1 / 2]))


# --- trees: best path, not best step; tie rules ------------------------------------------------


def tree(ids, e, n):
    """Greedy (T = 0: the scores use rho = 1) tree of n nodes; the target is irrelevant here."""
    v = int(np.max(ids)) + 1
    inputs, params = tv_inputs(0, [ids], [e], 0.0, 7, 100, np.zeros((v, v)), n)
    out = tree_verify(**inputs, **params)
    return out["parent"][0].tolist(), out["node_tokens"][0].tolist()


def test_tree_grows_by_path_score_not_by_local_step():
    """K = 2, k = 2. ids: step 0 (1, 2), step 1 (3, 4). E_0 row 0 = (0.5, 0): q_0 = (0.6225, 0.3775).
    E_1 after rank 0 = (0.2, 0): q = (0.5498, 0.4502); after rank 1 = (0, 3): q = (0.0474, 0.9526).
    Greedy chain: rank 0 (token 1), then rank 0 (token 3): nodes 0, 1. Candidates, path score
    (sum of log q) and, in brackets, the local log q of the last step:
      A root rank 1 (token 2):            log 0.3775                = -0.974  [-0.974]
      B under node 0, rank 1 (token 4):   log 0.6225 + log 0.4502   = -1.272  [-0.798]
    A is taken (node 2; by the local step B would be). Its children:
      C rank 1 (token 4): -0.974 + log 0.9526 = -1.023;  rank 0 (token 3): -0.974 + log 0.0474 = -4.02
    C beats B: node 3 = C; then B (node 4), then node 2's rank 0 (node 5)."""
    ids = np.array([[1, 2], [3, 4]])
    e = np.array([[[0.5, 0.0], [0.0, 0.0]], [[0.2, 0.0], [0.0, 3.0]]])  # step 0 reads row 0 only
    assert tree(ids, e, 4) == ([-1, 0, -1, 2], [1, 3, 2, 4])
    assert tree(ids, e, 6) == ([-1, 0, -1, 2, 0, 2], [1, 3, 2, 4, 4, 3])


def test_tree_ties_lower_depth_then_lower_parent_then_lower_rank():
    """K = 2, k = 3, ids: step 0 (1, 2, 3), step 1 (4, 5, 6). Energies (FP32) chosen so that q is
    exact in FP32 and the path scores tie exactly:
      E_0 row 0 = (ln 2, 0, 0): q_0 = (1, 1/2, 1/2) / 2 = (1/2, 1/4, 1/4)
      E_1 after rank 0 = (0, 0, -200): q = (1/2, 1/2, 0)  (e^-200 / 2 underflows FP32)
      E_1 after rank 1 or 2 = (0, -200, -200): q = (1, 0, 0)
    Chain: rank 0 (token 1), then the lowest of the tied ranks 0, 1: rank 0 (token 4). Scores of
    the candidates, with log(1/4) = 2 log(1/2) = L exactly (a power-of-two scaling of ln 2):
      root rank 1, root rank 2: L;  node 0's rank 1: log 1/2 + log 1/2 = L;  node 0's rank 2: -inf.
    Lower depth first: node 2 = root rank 1, node 3 = root rank 2 (lower rank first). Their
    children score L + log 1 = L at rank 0 (-inf at ranks 1, 2). Depth-1 ties at L go to the lower
    parent node: node 0's rank 1 (node 4), node 2's rank 0 (node 5), node 3's rank 0 (node 6).
    Then the -inf ones, in the same order: (parent 0, rank 2), (2, 1), (2, 2), (3, 1), (3, 2)."""
    assert np.log(0.25) == 2 * np.log(0.5)  # the exact tie the derivation needs (scaling by 2 is exact)
    ids = np.array([[1, 2, 3], [4, 5, 6]])
    e = np.zeros((2, 3, 3))
    e[0, 0] = [math.log(2), 0, 0]
    e[1, 0] = [0, 0, -200]
    e[1, 1] = e[1, 2] = [0, -200, -200]
    parents, tokens = tree(ids, e, 7)
    assert parents == [-1, 0, -1, -1, 0, 2, 3]
    assert tokens == [1, 4, 2, 3, 5, 4, 4]
    parents, tokens = tree(ids, e, 12)
    assert parents == [-1, 0, -1, -1, 0, 2, 3, 0, 2, 2, 3, 3]
    assert tokens == [1, 4, 2, 3, 5, 4, 4, 6, 5, 6, 5, 6]


def test_tree_sibling_tie_goes_to_the_lower_rank():
    """K = 1, k = 3, ids (1, 2, 3), E_0 row 0 = (1, 0, 0): q = (e, 1, 1) / (e + 2); the chain takes
    rank 0 (node 0). Ranks 1 and 2 score log(1 / (e + 2)) alike (the same FP32 q): rank 1 first."""
    ids = np.array([[1, 2, 3]])
    e = np.zeros((1, 3, 3))
    e[0, 0] = [1.0, 0.0, 0.0]
    assert tree(ids, e, 2) == ([-1, -1], [1, 2])
    assert tree(ids, e, 3) == ([-1, -1, -1], [1, 2, 3])


def test_tree_ties_across_depths_one_and_two():
    """K = 3, k = 2, ids (1, 2), (3, 4), (5, 6); L = log 1/2. Energies: E_0 = (0, 0): q_0 = (1/2, 1/2);
    E_1 after rank 0 = (0, -200): q = (1, 0); after rank 1 = (0, 0): (1/2, 1/2); E_2 rows (0, 0): (1/2, 1/2).
    Chain (lowest rank on ties): node 0 (d0, rank 0, L), node 1 (d1, rank 0, L + 0), node 2 (d2, rank 0, 2L).
    Candidates: root rank 1 (L); node 0's rank 1 (-inf); node 1's rank 1 (d2, 2L). Root rank 1 is node 3;
    its children (d1) score 2L, tying node 1's rank 1 (d2): the lower depth goes first: node 4 =
    (d1, parent 3, rank 0), node 5 = (d1, parent 3, rank 1), then node 6 = (d2, parent 1, rank 1). Then
    3L: children of node 4 before node 5's (lower parent), rank 0 before 1: nodes 7..10; then -inf."""
    ids = np.array([[1, 2], [3, 4], [5, 6]])
    e = np.zeros((3, 2, 2))
    e[1, 0] = [0, -200]
    parents, tokens = tree(ids, e, 11)
    assert parents == [-1, 0, 1, -1, 3, 3, 1, 4, 4, 5, 5]
    assert tokens == [1, 3, 5, 2, 3, 4, 6, 5, 6, 5, 6]


# --- acceptance decisions by hand (C3, C6) -------------------------------------------------------


def u_hand(seed, position, purpose, index=0):
    """C3 uniform from a plain-Python Philox4x32-10 (independent of reference.rng)."""
    x0 = _philox_py([position & U32, position >> 32, int(purpose), index], [seed & U32, seed >> 32])[0]
    return ((x0 >> 8) | 1) * 2.0**-24


def race_hand(weights, seed, position, purpose):
    best, score = None, -1.0
    for v, w in enumerate(weights):
        if w > 0:
            s = w / -math.log(u_hand(seed, position, purpose, v))
            if s > score:
                best, score = v, s
    return best


def test_tree_sibling_accept_test_uses_its_own_uniform():
    """K = 1, k = 2 at T = 1 (N = 2: both root candidates are nodes). The walk's rank j0 (main child,
    token c0) is drawn by the race at F; p(c0) = 0 rejects it whatever U_0. The residual r = max(p - q, 0)
    normalized has r(c1) = x / (1 - q(c1)) with x = p(c1) - q(c1) (p(c0) = 0, p(2) = 1 - p(c1)). Set
    r(c1) = t, half-way between U_1 and U_0 = U(s, F+1, ACCEPT, 0 or 1), seed chosen with U_1 < U_0 - 0.2:
    the sibling (index 1) is accepted iff U_1 < t: yes. With U_0 it would be rejected."""
    F = 4000
    seed = next(s for s in range(100) if u_hand(s, F + 1, 2, 1) < u_hand(s, F + 1, 2, 0) - 0.2)
    u0, u1 = u_hand(seed, F + 1, 2, 0), u_hand(seed, F + 1, 2, 1)
    t = (u0 + u1) / 2
    ids = np.array([[0, 1]])
    e = np.array([[[0.3, -0.2], [0.0, 0.0]]])
    q = np.float32(np.exp([0.3, -0.2]) / np.exp([0.3, -0.2]).sum()).astype(np.float64)  # the walk's FP32 q
    j0 = race_hand(q, seed, F, 1)  # DFLASH2_PROPOSAL at F + 0
    c0, c1 = int(ids[0, j0]), int(ids[0, 1 - j0])
    x = t * (1 - q[1 - j0])
    p = np.zeros(3)
    p[c1], p[2] = q[1 - j0] + x, 1 - q[1 - j0] - x
    bigram = np.zeros((3, 3))
    with np.errstate(divide="ignore"):
        bigram[2] = np.where(p > 0, np.log(np.where(p > 0, p, 1)), -1000.0)  # the anchor is token 2
    inputs, params = tv_inputs(2, [ids], [e], 1.0, seed, F, bigram, 2)
    out = tree_verify(**inputs, **params)
    assert out["node_tokens"].tolist() == [[c0, c1]]
    assert out["tokens"][0, 0] == c1 and out["accepted"].tolist() == [1]


def _accept(logits, proposals, P, F, seed, **kw):
    from conformance.cases.speculative_accept import accept_inputs
    from reference.speculative_accept import speculative_accept

    inputs, params = accept_inputs(np.asarray(logits, np.float32)[None], [proposals], P, F, seed, **kw)
    return speculative_accept(**inputs, **params)


def test_acceptance_min_p_keeps_the_maxima():
    """min_p = 1 in the acceptance scan: p_0 over logits (1, 1, 0) keeps both maxima, p = (1/2, 1/2, 0);
    proposal d = 1 with one-hot q is accepted iff U(s, F + 1, ACCEPT) < 1/2. Seeds 0..9 by hand."""
    z = [[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]
    F = 50
    for seed in range(10):
        out = _accept(z, [1], 1, F, seed, min_p=1.0)
        assert out["accepted"].tolist() == [int(u_hand(seed, F + 1, 2) < 0.5)], seed


def test_acceptance_of_a_zero_probability_proposal_is_strict():
    """Retained q over ids (0, 1) only; the proposal d = 3 is a padded row (vocab 3 of 4): p(3) = 0
    and q(3) = 0, so U q(3) < p(3) reads 0 < 0: false, rejected with margin 0 (C3 is strict). The
    correction is drawn from r = max(p - q, 0) = (0, 0, 1/3, 0) normalized: token 2."""
    z = [[0.0, 0.0, 0.0, 5.0], [0.0, 0.0, 0.0, 0.0]]
    q = np.array([[[0.5, 0.5]]], np.float32)
    out = _accept(z, [3], 1, 9, 4, q=q, q_ids=[[[0, 1]]], vocab_size=3)
    assert out["accepted"].tolist() == [0] and out["accepted.margin"].tolist() == [0.0]
    assert out["tokens"].tolist() == [[2, -1]]


def test_empty_residual_draws_from_p_not_q():
    """q (unnormalized) = (0.9, 0.6, 0.3) >= p = (1/2, 1/2, 0) everywhere: r = max(p - q, 0) has no mass,
    so the correction is the race over p (C6), never token 2 (p(2) = 0). A seed is chosen where U q(0)
    rejects d = 0 and the race over q would pick token 2."""
    z = [[0.0, 0.0, -1000.0], [0.0, 0.0, 0.0]]
    q = np.array([[[0.9, 0.6, 0.3]]], np.float32)
    F = 70
    seed = next(s for s in range(2000) if u_hand(s, F + 1, 2) * 0.9 > 0.55
                and race_hand([0.9, 0.6, 0.3], s, F + 1, 3) == 2)
    out = _accept(z, [0], 1, F, seed, q=q, q_ids=[[[0, 1, 2]]])
    assert out["accepted"].tolist() == [0]
    assert out["tokens"].tolist() == [[race_hand([0.5, 0.5, 0.0], seed, F + 1, 3), -1]]


def test_selector_greedy_tie_goes_to_the_lowest_rank():
    """candidate_selector at T = 0 with no pair terms (W_pred = 0): E = u = (0, 2, 2, 1) at step 0 and
    (3, 3, 0, 3) at step 1: ranks 1 and 0 (the lowest of each tie), margins 0."""
    from reference.candidate_selector import candidate_selector
    from reference.numerics import storage

    kw = {
        "hidden": storage(np.ones((1, 2, 2)), "bf16"),
        "scores": storage([[[0.0, 2.0, 2.0, 1.0], [3.0, 3.0, 0.0, 3.0]]], "fp32"),
        "ids": np.array([[[4, 5, 6, 7], [8, 9, 10, 11]]], np.int32),
        "anchor": np.array([0], np.int32),
        "w_hidden": storage(np.eye(2), "bf16"),
        "w_pred": storage(np.zeros((12, 2)), "bf16"),
        "w_succ": storage(np.ones((12, 2)), "bf16"),
        "temperature": np.zeros(1, np.float32),
        "seed": np.zeros(1, np.uint64),
        "frontier": np.zeros(1, np.int64),
    }
    out = candidate_selector(**kw)
    assert out["path"].tolist() == [[1, 0]] and out["tokens"].tolist() == [[5, 8]]
    assert out["path.margin"].tolist() == [[0.0, 0.0]]


def test_repetition_penalty_reads_the_prompt():
    """Tokens 0 and 1 are in the prompt only (no output history), rho = 2: z = (2, -1, 0) becomes
    (2 / 2, -1 * 2, 0) = (1, -2, 0) (C5 step 2 covers prompt and output history); T = 1."""
    close(probs([2.0, -1.0, 0.0], prompt=[0, 1], rho=2.0), softmax([1.0, -2.0, 0.0]))
    # greedy acceptance: logits (4, 2), token 0 in the prompt, rho 4: z = (1, 2), so the argmax is 1
    # and the proposal d = 0 is rejected; the correction is 1 (the prompt-blind z = (4, 2) would accept)
    pm = np.array([[1, 0]], np.uint8)
    out = _accept([[4.0, 2.0], [0.0, 0.0]], [0], 1, 5, 1, temperature=0.0, repetition_penalty=4.0, prompt_mask=pm)
    assert out["accepted"].tolist() == [0] and out["tokens"].tolist() == [[1, -1]]


def test_third_sibling_accept_test_uses_index_2():
    """K = 1, k = 3 at T = 1, N = 3: the three root candidates are the nodes, in sibling order: the
    walk's rank j0 (main child), then the two others by q descending (best-first). p is 0 on the
    first two, so both are rejected whatever their uniforms (U q(c) < 0 and U < 0 are false); their
    rejections leave r(c2) = x / (1 - q(c2)) for the third (x = p(c2) - q(c2), the rest of p on
    token 3). Set r(c2) = t half-way between U_2 and U_0 (U_j = U(s, F+1, ACCEPT, j)), with U_2 < U_0 - 0.2:
    accepted with its own U_2; with U_0 it would be rejected."""
    F = 900
    seed = next(s for s in range(200) if u_hand(s, F + 1, 2, 2) < u_hand(s, F + 1, 2, 0) - 0.2)
    u0, u2 = u_hand(seed, F + 1, 2, 0), u_hand(seed, F + 1, 2, 2)
    t = (u0 + u2) / 2
    ids = np.array([[0, 1, 2]])
    en = [0.3, -0.2, 0.1]
    e = np.zeros((1, 3, 3))
    e[0, 0] = en
    q = np.float32(np.exp(en) / np.exp(en).sum()).astype(np.float64)
    j0 = race_hand(q, seed, F, 1)
    rest = sorted((r for r in range(3) if r != j0), key=lambda r: -q[r])
    c0, c1, c2 = j0, rest[0], rest[1]  # ids equal ranks here
    x = t * (1 - q[c2])
    p = np.zeros(4)
    p[c2], p[3] = q[c2] + x, 1 - q[c2] - x
    bigram = np.zeros((4, 4))
    bigram[3] = np.where(p > 0, np.log(np.where(p > 0, p, 1)), -1000.0)  # the anchor is token 3
    inputs, params = tv_inputs(3, [ids], [e], 1.0, seed, F, bigram, 3)
    out = tree_verify(**inputs, **params)
    assert out["node_tokens"].tolist() == [[c0, c1, c2]]
    assert out["tokens"][0, 0] == c2 and out["accepted"].tolist() == [1]
