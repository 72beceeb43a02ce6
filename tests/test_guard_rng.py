"""Guards of reference/rng.py (CONTRACTS C3) and of the C3/C4 tie rules that no generated case
reaches (issue 14): known answers that hold whatever the vectors say.

* Random123's known-answer lines checked on ``reference.rng.philox4x32`` itself (the other test
  files check them on a plain-Python twin only).
* Hand uniforms read off those lines: U = ((x0 >> 8) | 1) 2^-24 where x0 >> 8 is even, so the
  forced low bit is visible, reached through the full key/counter layout of C3.
* Exponential-race ties: two indices whose 24-bit uniforms are equal for one (seed, position,
  purpose). They were found once by a birthday search (seed 14, positions upward from 0, all n
  indices of a position drawn at once; a collision needs about 2^25 / n^2 positions) and the
  numbers are committed here; the test re-derives the uniforms with an independent
  plain-Python Philox. With equal weights the race is an exact tie: the lowest index wins (C3),
  in the race itself and where the Ops use it (selector walk, correction, bonus).
"""

from __future__ import annotations

import math

import numpy as np

from conformance.cases.speculative_accept import accept_inputs
from reference.candidate_selector import candidate_selector
from reference.numerics import storage
from reference.rng import Purpose, exponential_race, philox4x32, uniform, word_to_uniform
from reference.speculative_accept import speculative_accept
from tests.casetools import U32, philox_py


def u_py(seed, position, purpose, index):
    """C3 by hand: key (seed lo, seed hi), counter (pos lo, pos hi, purpose, index), word 0."""
    x0 = philox_py([position & U32, position >> 32, purpose, index], [seed & U32, seed >> 32])[0]
    return ((x0 >> 8) | 1) * 2.0**-24


KAT = [  # Random123 kat_vectors, philox4x32 10 rounds: counter, key, output
    ([0, 0, 0, 0], [0, 0], [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]),
    ([U32] * 4, [U32] * 2, [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]),
    ([0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344], [0xA4093822, 0x299F31D0],
     [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]),
]


def test_reference_philox_reproduces_random123_known_answers():
    for ctr, key, want in KAT:
        assert philox4x32(np.array(ctr, np.uint64), np.array(key, np.uint64)).tolist() == want
        assert philox_py(ctr, key) == want
    # batched: the three lines at once (leading axes broadcast)
    got = philox4x32(np.array([c for c, _, _ in KAT], np.uint64), np.array([k for _, k, _ in KAT], np.uint64))
    assert got.tolist() == [w for _, _, w in KAT]


def test_hand_uniforms_from_the_known_answers():
    """Each line as a keyed draw (C3 layout: seed -> key (lo, hi), position -> counter words 0, 1,
    purpose -> word 2, index -> word 3):
      line 1, seed 0, position 0, purpose 0, index 0: x0 = 0x6627e8d5, x0 >> 8 = 0x6627e8 (even),
        | 1 -> 0x6627e9: U = 0x6627e9 / 2^24 = 6694889 / 16777216
      line 3, seed 0x299f31d0_a4093822, position 0x85a308d3_243f6a88, purpose 0x13198a2e,
        index 0x03707344: x0 = 0xd16cfe09 -> 0xd16cfe (even) | 1 = 0xd16cff: U = 13724927 / 2^24
      line 2, all ones: x0 = 0x408f276d -> 0x408f27 (already odd): U = 4230951 / 2^24"""
    assert float(uniform(np.uint64(0), 0, 0, 0)) == 6694889 / 2**24
    assert 0x6627E9 == 6694889 and 0xD16CFF == 13724927 and 0x408F27 == 4230951
    got = uniform(np.uint64(0x299F31D0_A4093822), 0x85A308D3_243F6A88, 0x13198A2E, 0x03707344)
    assert float(got) == 13724927 / 2**24
    assert float(uniform(np.uint64(2**64 - 1), 2**64 - 1, U32, U32)) == 4230951 / 2**24


def test_word_to_uniform_by_hand():
    # x0 -> ((x0 >> 8) | 1) 2^-24: the low byte is dropped, the lowest kept bit forced to 1
    words = [0, 0xFF, 0x100, 0x200, 0x2FF, 0xFFFFFFFF, 0x80000000]
    want = [1, 1, 1, 3, 3, 2**24 - 1, 2**23 + 1]
    assert word_to_uniform(np.array(words, np.uint64)).tolist() == [w * 2.0**-24 for w in want]
    # so U is in (0, 1), never 0 (whose -ln is inf) and never 1 (whose -ln is 0)
    assert 0 < word_to_uniform(np.uint64(0)) < word_to_uniform(np.uint64(U32)) < 1


def test_uniform_matches_plain_python_for_wide_seeds_positions_and_indices():
    cases = [(14, 3134, 1, 2), (2**63 + 12345, 2**32 + 7, 2, 0), (2**32 - 1, 2**33 - 1, 3, 50000), (0, 0, 4, U32)]
    for seed, pos, purpose, index in cases:
        assert float(uniform(np.uint64(seed), pos, purpose, index)) == u_py(seed, pos, purpose, index)


def test_race_draws_each_index_from_its_own_counter():
    """Weights 0 at indices 0..2: the contenders are v = 3, 4, 5 with U_v drawn at index v (not at
    their rank 0, 1, 2 within the support). Winner argmax w_v / -ln U_v by hand."""
    seed, pos = 2024, 77
    w = [0.0, 0.0, 0.0, 1.0, 2.0, 1.5]
    score = {v: w[v] / -math.log(u_py(seed, pos, Purpose.CORRECTION, v)) for v in (3, 4, 5)}
    best = max(score, key=score.get)
    got, margin = exponential_race(np.array(w), np.uint64(seed), pos, Purpose.CORRECTION)
    assert got == best
    runner = max(s for v, s in score.items() if v != best)
    assert abs(margin - math.log(score[best] / runner)) < 1e-12


# --- exact ties of the race (C3: the lowest index wins) ---------------------------------------

SEED = 14
# (purpose, position, (i, j)): U(SEED, position, purpose, i) == U(SEED, position, purpose, j), i < j
COLLISIONS = [
    (Purpose.DFLASH2_PROPOSAL, 3134, (2, 6)),  # first among indices 0..15 (selector ranks)
    (Purpose.CORRECTION, 7584, (6, 35)),  # second among indices 0..63 (token ids)
    (Purpose.BONUS, 8916, (8, 19)),  # first among indices 0..63
]


def find_collisions(seed, purpose, n_index, n_positions, chunk=50_000):
    """The offline search that found COLLISIONS (not run by the tests; a few seconds):
    positions p upward from 0 where two of the indices 0..n_index-1 draw equal uniforms."""
    for p0 in range(0, n_positions, chunk):
        pos = np.arange(p0, p0 + chunk, dtype=np.int64)
        u = uniform(np.uint64(seed), pos[:, None], purpose, np.arange(n_index)[None, :])
        for h in np.flatnonzero((np.diff(np.sort(u, axis=1), axis=1) == 0).any(axis=1)):
            vals, counts = np.unique(u[h], return_counts=True)
            yield int(pos[h]), np.flatnonzero(u[h] == vals[counts > 1][0]).tolist()


def test_committed_collisions_are_exact_ties():
    for purpose, pos, (i, j) in COLLISIONS:
        ui, uj = u_py(SEED, pos, purpose, i), u_py(SEED, pos, purpose, j)
        assert ui == uj, (purpose, pos, i, j)
        assert float(uniform(np.uint64(SEED), pos, purpose, i)) == ui == float(uniform(np.uint64(SEED), pos, purpose, j))


def test_race_tie_goes_to_the_lowest_index():
    for purpose, pos, (i, j) in COLLISIONS:
        for scale in (1.0, 0.25, 3e-5):  # any common weight: r/E equal for both
            w = np.zeros(j + 3)
            w[i] = w[j] = scale
            got, margin = exponential_race(w, np.uint64(SEED), pos, purpose)
            assert got == i and margin == 0.0, (purpose, pos, scale, got)
        # the weights still decide when they differ: the heavier one of the two wins either way
        w = np.zeros(j + 1)
        w[i], w[j] = 1.0, 1.5
        assert exponential_race(w, np.uint64(SEED), pos, purpose)[0] == j


def test_selector_walk_tie_goes_to_the_lowest_rank():
    """candidate_selector at T = 1, frontier 3134, seed 14, k = 8: unary scores 0 at ranks 2 and 6
    and -200 elsewhere (no pair terms: W_pred = 0), so q = FP32 softmax = 1/2 at ranks 2 and 6 and
    exactly 0 elsewhere (e^-200 / 2 is below FP32's smallest subnormal). The race at F + 0 with
    purpose 1 sees equal weights and equal uniforms at ranks 2 and 6: rank 2 (token 12) wins."""
    k = 8
    u = np.full((1, 1, k), -200.0)
    u[0, 0, [2, 6]] = 0.0
    kw = {
        "hidden": storage(np.ones((1, 1, 2)), "bf16"),
        "scores": storage(u, "fp32"),
        "ids": (np.arange(k, dtype=np.int32) + 10).reshape(1, 1, k),
        "anchor": np.array([0], np.int32),
        "w_hidden": storage(np.eye(2), "bf16"),
        "w_pred": storage(np.zeros((20, 2)), "bf16"),
        "w_succ": storage(np.zeros((20, 2)), "bf16"),
        "temperature": np.ones(1, np.float32),
        "seed": np.array([SEED], np.uint64),
        "frontier": np.array([3134], np.int64),
    }
    out = candidate_selector(**kw)
    want_q = [0, 0, 0.5, 0, 0, 0, 0.5, 0]
    np.testing.assert_array_equal(out["q"][0, 0], want_q)
    assert out["path"].tolist() == [[2]] and out["tokens"].tolist() == [[12]]
    assert out["path.margin"][0, 0] == 0.0


def _two_token_logits(v, a, b):
    """FP32 logits 0 at tokens a and b, -1000 elsewhere: p = 1/2 at a and b, exactly 0 elsewhere."""
    z = np.full(v, -1000.0, np.float32)
    z[[a, b]] = 0.0
    return z


def test_bonus_tie_goes_to_the_lowest_token():
    """No proposals (P = 0), frontier 8915: the bonus is drawn from p at F + 1 = 8916, purpose BONUS,
    index = token id. p = 1/2 at tokens 8 and 19, whose uniforms collide: token 8 wins."""
    logits = _two_token_logits(24, 8, 19)[None, None, :]
    inputs, params = accept_inputs(logits, np.zeros((1, 0)), 0, 8915, SEED)
    out = speculative_accept(**inputs, **params)
    assert out["tokens"].tolist() == [[8]] and out["num_out"].tolist() == [1]
    assert out["tokens.margin"][0, 0] == 0.0


def test_correction_tie_goes_to_the_lowest_token():
    """One proposal d = 0 at frontier 7583 with p(0) = 0 (logit -1000): U q(0) < p(0) = 0 fails,
    rejected. The residual max(p - q, 0) with one-hot q at 0 is p: 1/2 at tokens 6 and 35. The
    correction race at F + 1 = 7584, purpose CORRECTION, sees colliding uniforms: token 6 wins."""
    z = _two_token_logits(40, 6, 35)
    logits = np.stack([z, z])[None]  # rows 0 (the test of d_1) and 1 (the bonus row, unused)
    inputs, params = accept_inputs(logits, [[0]], 1, 7583, SEED)
    out = speculative_accept(**inputs, **params)
    assert out["accepted"].tolist() == [0] and out["tokens"].tolist() == [[6, -1]]
    assert out["tokens.margin"][0, 0] == 0.0
