"""The acceptance scan preserves the target distribution (spec: verification; C3, C5, C6).

Many requests (seeds 0..N-1, everything else fixed) go through the reference
speculative_accept with the exact C3 machinery; the proposal d_1 is drawn from q_0
(one-hot q: a fixed draft argmax; retained q: the selector's race at F, purpose
DFLASH2_PROPOSAL). The first output token must follow p_0, and, when d_1 was
accepted, the second must follow p_1 formed with d_1 in the history. Each is a
chi-square goodness-of-fit test at ALPHA = 1e-3: with ideal uniforms a correct
scan fails with probability 1e-3 per test; the seeds are fixed, so the outcome is
deterministic and either always passes or always fails. The same test run on
planted bugs (residual without the clamp, p/q swapped in the accept test, history
not updated) must fail, and the expected chi-square of each bug (its
noncentrality N * sum (p_bug - p)^2 / p) is checked to exceed the critical value
many times over, so their failure is no accident of the seeds.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reference.speculative_accept as sa
from conformance.cases.speculative_accept import accept_inputs
from reference.rng import Purpose, exponential_race
from reference.target_distribution import add_to_history, row_probs

ALPHA = 1e-3
N = 3000  # trials per experiment


# --- the chi-square survival function, without scipy ---------------------------------------


def gamma_q(a: float, x: float) -> float:
    """Regularized upper incomplete gamma Q(a, x) (Numerical Recipes 6.2): the series
    for P below x = a + 1, Lentz's continued fraction for Q above; 1e-15 relative."""
    if x <= 0:
        return 1.0
    lead = math.exp(-x + a * math.log(x) - math.lgamma(a))
    if x < a + 1:
        term = total = 1.0 / a
        n = a
        while abs(term) > abs(total) * 1e-16:
            n += 1
            term *= x / n
            total += term
        return 1.0 - total * lead
    tiny = 1e-300
    b = x + 1 - a
    c, d = 1 / tiny, 1 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        h *= d * c
        if abs(d * c - 1) < 1e-16:
            break
    return lead * h


def chi2_sf(x: float, df: int) -> float:
    return gamma_q(df / 2, x / 2)


def test_chi2_sf_known_values():
    # textbook critical values (5% and 1% points) and the exact Q(1, y) = e^-y
    assert chi2_sf(3.841458820694124, 1) == pytest.approx(0.05, rel=1e-9)
    assert chi2_sf(6.634896601021214, 1) == pytest.approx(0.01, rel=1e-9)
    assert chi2_sf(18.307038053275146, 10) == pytest.approx(0.05, rel=1e-9)
    assert chi2_sf(124.34211340400407, 100) == pytest.approx(0.05, rel=1e-9)
    assert chi2_sf(0.0, 3) == 1.0
    assert chi2_sf(10.0, 2) == pytest.approx(math.exp(-5.0), rel=1e-12)


@settings(max_examples=200, deadline=None)
@given(st.floats(0.01, 400.0), st.integers(1, 60))
def test_chi2_sf_matches_closed_forms(x, k):
    """Even df = 2k: Q(k, y) = e^-y sum_{j<k} y^j / j! (Poisson tail); odd df = 1: erfc(sqrt(x/2))."""
    y = x / 2
    poisson = math.exp(-y) * sum(y**j / math.factorial(j) for j in range(k))
    assert chi2_sf(x, 2 * k) == pytest.approx(poisson, rel=1e-10, abs=1e-300)
    assert chi2_sf(x, 1) == pytest.approx(math.erfc(math.sqrt(y)), rel=1e-10, abs=1e-300)


def gof(counts, p) -> tuple[float, float, int]:
    """Pearson chi-square of counts against p over p's support: (statistic, p-value, df).
    A count outside the support is an impossible outcome: p-value 0."""
    counts, p = np.asarray(counts, float), np.asarray(p, float)
    n = counts.sum()
    if np.any(counts[p <= 0] > 0):
        return math.inf, 0.0, 0
    sup = p > 0
    expected = n * p[sup]
    assert expected.min() >= 5, "too few expected counts for the chi-square approximation"
    stat = float(((counts[sup] - expected) ** 2 / expected).sum())
    df = int(sup.sum()) - 1
    return stat, chi2_sf(stat, df), df


def critical(df: int) -> float:
    """The chi-square quantile at ALPHA by bisection on chi2_sf."""
    lo, hi = 0.0, 1000.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if chi2_sf(mid, df) > ALPHA else (lo, mid)
    return hi


# --- the experiment ------------------------------------------------------------------------

V = 8
F = 1000
SAMPLING = {
    "temperature": 0.8,
    "top_k": 6,  # ids 2 and 6 (the two lowest) drop
    "top_p": 0.97,
    "min_p": 0.02,
    "repetition_penalty": 1.3,
    "frequency_penalty": 0.2,
    "presence_penalty": 0.1,
}
LOGITS = np.array(
    [
        [1.0, 0.6, -2.0, 1.4, 0.2, 0.9, -2.5, 0.4],  # p_0
        [0.3, 1.1, 0.5, 0.8, -0.1, 1.2, -3.0, 0.7],  # p_1 (history grows by d_1)
        [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],  # p_2: the bonus row
    ],
    np.float32,
)
PROMPT = np.array([1, 0, 0, 1, 0, 0, 0, 0], np.uint8)
COUNTS = np.array([0, 1, 0, 0, 2, 0, 0, 0], np.int32)
# retained q over four candidates per step; id 6 is in q's support but filtered out of p
Q_IDS = np.array([[3, 5, 0, 6], [5, 1, 3, 6]], np.int32)
Q = np.array([[0.45, 0.3, 0.15, 0.1], [0.4, 0.25, 0.25, 0.1]], np.float32)
ONE_HOT_D = (5, 1)  # the DFlash draft's argmax tokens


def p_of(row, history=()):
    s = {k: np.float32(v) for k, v in SAMPLING.items()}
    counts = add_to_history(COUNTS, list(history))
    return row_probs(LOGITS[row], PROMPT, counts, V, **{**s, "top_k": SAMPLING["top_k"]})


def run_trials(retained: bool):
    seeds = np.arange(N, dtype=np.uint64)
    if retained:
        # the selector's draws: rank ~ q_i at position F + i, purpose DFLASH2_PROPOSAL
        ranks = [
            [exponential_race(Q[i].astype(np.float64), s, F + i, Purpose.DFLASH2_PROPOSAL)[0] for i in range(2)]
            for s in seeds
        ]
        proposals = np.array([[Q_IDS[i, r] for i, r in enumerate(rr)] for rr in ranks])
        q, q_ids = np.broadcast_to(Q, (N, 2, 4)), np.broadcast_to(Q_IDS, (N, 2, 4))
    else:
        proposals, q, q_ids = np.tile(ONE_HOT_D, (N, 1)), None, None
    inputs, params = accept_inputs(
        np.broadcast_to(LOGITS, (N, 3, V)),
        proposals,
        2,
        F,
        seeds,
        q=q,
        q_ids=q_ids,
        prompt_mask=np.broadcast_to(PROMPT, (N, V)),
        output_counts=np.broadcast_to(COUNTS, (N, V)),
        **SAMPLING,
    )
    return sa.speculative_accept(**inputs, **params)["tokens"]


def first_token_test(tokens):
    return gof(np.bincount(tokens[:, 0], minlength=V), p_of(0))


def second_token_test(tokens):
    """y_2 given y_1 = v (present when d_1 = v was accepted) follows p_1 with v in the history;
    the strata's statistics and degrees of freedom add up."""
    stat, df = 0.0, 0
    for v in range(V):
        sel = (tokens[:, 1] >= 0) & (tokens[:, 0] == v)
        p1 = p_of(1, [v])
        if sel.sum() * p1[p1 > 0].min() < 5:
            continue
        s, pv, d = gof(np.bincount(tokens[sel, 1], minlength=V), p1)
        if pv == 0.0:
            return math.inf, 0.0, d
        stat, df = stat + s, df + d
    assert df > 0
    return stat, chi2_sf(stat, df), df


@pytest.fixture(scope="module", params=[False, True], ids=["one_hot_q", "retained_q"])
def correct(request):
    return request.param, run_trials(request.param)


def test_target_has_filters_and_penalties_active():
    p0 = p_of(0)
    assert (p0 == 0).sum() >= 2 and p0[p0 > 0].min() * N >= 5
    assert not np.allclose(p_of(1, [5]), p_of(1, [1]))  # the history changes p_1


@pytest.mark.slow
def test_first_output_token_follows_p0(correct):
    _, tokens = correct
    stat, pv, df = first_token_test(tokens)
    assert pv > ALPHA, f"chi2 {stat:.1f} on {df} df, p = {pv:.2e}"


@pytest.mark.slow
def test_second_output_token_follows_p1_given_first(correct):
    _, tokens = correct
    stat, pv, df = second_token_test(tokens)
    assert pv > ALPHA, f"chi2 {stat:.1f} on {df} df, p = {pv:.2e}"


# --- planted bugs: the same tests must fail --------------------------------------------------


def _no_clamp(p, qv):
    # C6's zero-mass test on the unclamped residual: sum(p - q) = 0 for normalized p, q
    r = p - qv
    return p if abs(r.sum()) < 1e-6 else np.maximum(r, 0)


def _swapped(p_d, q_d, u):
    return float(q_d - u * p_d)


def _bug_distribution(bug, retained):
    """The first token's law under the bug, in closed form (for the noncentrality)."""
    p = p_of(0)
    qv = np.zeros(V)
    if retained:
        np.add.at(qv, Q_IDS[0], Q[0].astype(np.float64))
    else:
        qv[ONE_HOT_D[0]] = 1.0
    out = np.zeros(V)
    for d in range(V):
        if qv[d] == 0:
            continue
        acc = min(1.0, p[d] / qv[d]) if bug != "accept_p_q_swapped" else (min(1.0, qv[d] / p[d]) if p[d] else 1.0)
        rej = p if bug == "residual_no_clamp" else np.maximum(p - qv, 0)
        if bug == "accept_p_q_swapped":
            rej = np.maximum(p - qv, 0)
        rej = rej / rej.sum() if rej.sum() > 0 else p
        out += qv[d] * ((1 - acc) * rej)
        out[d] += qv[d] * acc
    return out


@pytest.mark.slow
@pytest.mark.parametrize("retained", [False, True], ids=["one_hot_q", "retained_q"])
@pytest.mark.parametrize("bug", ["residual_no_clamp", "accept_p_q_swapped"])
def test_planted_bug_fails_first_token_test(monkeypatch, bug, retained):
    law = _bug_distribution(bug, retained)
    p = p_of(0)
    sup = p > 0
    # expected statistic under the bug ~ df + N sum (law - p)^2 / p (or an impossible outcome)
    noncentrality = math.inf if law[~sup].sum() > 0 else N * float(((law - p)[sup] ** 2 / p[sup]).sum())
    assert noncentrality > 10 * critical(int(sup.sum()) - 1)
    if bug == "residual_no_clamp":
        monkeypatch.setattr(sa, "_correction_weights", _no_clamp)
    else:
        monkeypatch.setattr(sa, "_accept_distance", _swapped)
    stat, pv, df = first_token_test(run_trials(retained))
    assert pv < ALPHA, f"{bug} passed: chi2 {stat:.1f} on {df} df"


@pytest.mark.slow
def test_history_not_updated_fails_second_token_test(monkeypatch):
    monkeypatch.setattr(sa._Row, "accept", lambda self, token: None)
    stat, pv, df = second_token_test(run_trials(True))
    assert pv < ALPHA, f"history_not_updated passed: chi2 {stat:.1f} on {df} df"


# --- the bonus: all proposals accepted, y_3 ~ p_2 with d_1, d_2 in the history ------------------


def bonus_test(tokens):
    """y_3 (present only when both proposals were accepted) follows p_2 given y_1, y_2 in the
    history; strata with too few expected counts per outcome are left out, the rest add up."""
    stat, df = 0.0, 0
    for a in range(V):
        for b in range(V):
            sel = (tokens[:, 2] >= 0) & (tokens[:, 0] == a) & (tokens[:, 1] == b)
            p2 = p_of(2, [a, b])
            if sel.sum() * p2[p2 > 0].min() < 5:
                continue
            s, pv, d = gof(np.bincount(tokens[sel, 2], minlength=V), p2)
            if pv == 0.0:
                return math.inf, 0.0, d
            stat, df = stat + s, df + d
    return stat, (chi2_sf(stat, df) if df else 1.0), df


@pytest.mark.slow
def test_bonus_follows_p2_given_both_accepted(correct):
    _, tokens = correct
    stat, pv, df = bonus_test(tokens)
    assert df > 0, "no stratum with enough all-accept trials"
    assert pv > ALPHA, f"chi2 {stat:.1f} on {df} df, p = {pv:.2e}"


@pytest.mark.slow
def test_bonus_taken_as_argmax_fails_the_bonus_test(monkeypatch):
    draw = sa._draw

    def argmax_bonus(weights, seed, position, purpose):
        if purpose == sa.Purpose.BONUS:  # the planted bug: a greedy bonus at temperature > 0
            return int(np.argmax(weights)), math.inf
        return draw(weights, seed, position, purpose)

    monkeypatch.setattr(sa, "_draw", argmax_bonus)
    stat, pv, df = bonus_test(run_trials(False))
    assert pv < ALPHA, f"argmax bonus passed: chi2 {stat:.1f} on {df} df"
