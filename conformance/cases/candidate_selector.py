"""Cases for candidate_selector (DFlash2 conditional walk; docs/ops.md sweep: temperature
<= 0, small, 1, large; seeds 0, 2^32-1, 2^32, 2^64-1; positions crossing 2^32; batch
rows permuted).

Random cases are redrawn until every decision is clear: its margin exceeds both 1e-3
and 100x the float32 baseline's margin error, and the baseline walks the same path.
Planted cases:
- planted_path: codebooks reward one path of non-best unary ranks, conditioned on the
  predecessor, so the walk, the unary argmax and any other predecessor disagree.
- exact_tie: two ranks with equal u and identical successor rows are the maximum at
  every step; the higher rank holds the lower token id. All values are small dyadic
  numbers, so every E is exact in FP32 and the tie survives any summation order.
- rng_key / positions_2p32: rows that a 32-bit seed or position would merge.
- rng_batch_row: two rows carry the same request; and the same requests permuted.
- selector_predecessor_row: T = 1 with flat unary scores and strongly
  predecessor-dependent pair terms; the sample differs from the argmax at some step,
  so a walk that follows the argmax row gets a different q.
"""

from __future__ import annotations

import numpy as np

from conformance.registry import BF16_CHAIN, DECISION, FP32_OUTPUT, REPRESENTED, Case, OpSpec, Output, case_rng, register
from reference import precision, scales
from reference.candidate_selector import candidate_selector
from reference.numerics import storage

OP = "candidate_selector"
TOP_K = 16
U64_MAX = 2**64 - 1


def _case(case_id, arrays, flags=()) -> Case:
    a = arrays
    inputs = {
        "hidden": storage(a["hidden"], "bf16"),
        "scores": storage(a["scores"], "fp32"),
        "ids": np.asarray(a["ids"], dtype=np.int32),
        "anchor": np.asarray(a["anchor"], dtype=np.int32),
        "w_hidden": storage(a["w_hidden"], "bf16"),
        "w_pred": storage(a["w_pred"], "bf16"),
        "w_succ": storage(a["w_succ"], "bf16"),
        "temperature": np.asarray(a["temperature"], dtype=np.float32),
        "seed": np.asarray(a["seed"], dtype=np.uint64),
        "frontier": np.asarray(a["frontier"], dtype=np.int64),
    }
    return Case(id=case_id, inputs=inputs, flags=tuple(flags))


def _request_arrays(rng, b, k, h, r, vr, temperature, seed, frontier, *, pair=1.0) -> dict:
    """Gaussian request rows: g ~ N(0, 1), pair terms ~ N(0, pair^2), unary gaps ~ 0.3."""
    sigma = np.sqrt(pair) * r**-0.25  # sum of r products of three factors: std sigma^2 sqrt(r)
    scores = 2.0 - np.cumsum(rng.exponential(0.3, (b, k, TOP_K)), axis=-1)
    return {
        "hidden": rng.standard_normal((b, k, h)),
        "scores": scores,
        "ids": np.stack([rng.choice(vr, TOP_K, replace=False) for _ in range(b * k)]).reshape(b, k, TOP_K),
        "anchor": rng.integers(0, vr, b),
        "w_hidden": rng.standard_normal((r, h)) / np.sqrt(h),
        "w_pred": rng.standard_normal((vr, r)) * sigma,
        "w_succ": rng.standard_normal((vr, r)) * sigma,
        "temperature": np.broadcast_to(np.asarray(temperature, dtype=np.float64), (b,)),
        "seed": np.broadcast_to(np.asarray(seed, dtype=np.uint64), (b,)),
        "frontier": np.broadcast_to(np.asarray(frontier, dtype=np.int64), (b,)),
    }


def is_clear(case: Case) -> bool:
    """Every decision clear of the float32 baseline (see the module doc)."""
    ref = candidate_selector(**case.kwargs())
    with precision.baseline(SPEC.bf16_intermediates):
        base = candidate_selector(**case.kwargs())
    if not np.array_equal(ref["path"], base["path"]):
        return False
    m, mb = ref["path.margin"], base["path.margin"]
    fin = np.isfinite(m)
    err = float(np.abs(m[fin] - mb[fin]).max(initial=0.0))
    return bool(np.all(m[fin] > max(1e-3, 100 * err)))


def _drawn(case_id, *shape, flags=(), accept=None, **kw) -> Case:
    rng = case_rng(case_id)
    for _ in range(200):
        case = _case(case_id, _request_arrays(rng, *shape, **kw), flags)
        if is_clear(case) and (accept is None or accept(case)):
            return case
    raise RuntimeError(f"{case_id}: no clear draw")


def bites(case: Case) -> bool:
    from conformance.mutants import decisions_differ

    return decisions_differ(case)


def _stack_rows(rows: list[dict]) -> dict:
    """Batch rows from per-request arrays (the codebooks and projection are shared)."""
    shared = ("w_hidden", "w_pred", "w_succ")
    out = {k: rows[0][k] for k in shared}
    for k in rows[0]:
        if k not in shared:
            out[k] = np.concatenate([np.asarray(row[k]) for row in rows])
    return out


def _rows_of(a: dict, order) -> dict:
    shared = ("w_hidden", "w_pred", "w_succ")
    return {k: (v if k in shared else np.asarray(v)[list(order)]) for k, v in a.items()}


def _variants(case_id, base_kw, row_values: dict, *, flags, k=4) -> Case:
    """One request repeated over rows that differ only in the given per-row values."""
    rng = case_rng(case_id)
    n = len(next(iter(row_values.values())))
    for _ in range(200):
        one = _request_arrays(rng, 1, k, 32, 16, 256, **base_kw)
        arrays = _rows_of(one, [0] * n)
        arrays.update({key: np.asarray(v) for key, v in row_values.items()})
        case = _case(case_id, arrays, flags)
        if is_clear(case):
            return case
    raise RuntimeError(f"{case_id}: no clear draw")


def planted_path(case_id, plant=(5, 11, 2)) -> Case:
    """Greedy, K = 3. Unary scores fall with rank, so the unary walk is (0, 0, 0); W_pred rows of the
    planted predecessors are random signs, and the successor row of the planted candidate at step i
    is 0.25 sign(W_pred[prev] * g_i): its pair term is 0.25 sum_r |g_i[r]| ~ 3 against ~0.04 noise."""
    rng = case_rng(case_id)
    a = _request_arrays(rng, 1, 3, 32, 16, 256, 0.0, 7, 1000, pair=0.01)
    a["scores"] = np.broadcast_to(1.0 - np.arange(TOP_K) / 16.0, (1, 3, TOP_K))
    g = candidate_selector(**_case(case_id, a).kwargs())["g"]  # g does not depend on the codebooks
    prev = int(a["anchor"][0])
    for i, j in enumerate(plant):
        a["w_pred"][prev] = rng.choice([-1.0, 1.0], 16)
        tok = int(a["ids"][0, i, j])
        a["w_succ"][tok] = 0.25 * np.sign(a["w_pred"][prev] * g[0, i])
        prev = tok
    return _case(case_id, a)


def exact_tie(case_id, b=2, k=4, ranks=(3, 9)) -> Case:
    """Dyadic inputs: h in k/4, W_hidden and codebooks in k/8 (|k| <= 2), H = R = 16, so g = W h is a
    multiple of 1/32 below 2 (exact in BF16) and every pair term a multiple of 2^-11 below 2: E is
    exact in FP32. Ranks a < b tie at u = 8 (others <= 2): E ties at the maximum at every step."""
    rng = case_rng(case_id)
    vr, h, r = 128, 16, 16
    lo, hi = ranks
    ids = np.stack([rng.choice(vr, TOP_K, replace=False) for _ in range(b * k)]).reshape(b, k, TOP_K)
    ids[..., [lo, hi]] = np.sort(ids[..., [lo, hi]], axis=-1)[..., ::-1]  # the lower rank holds the higher id
    scores = rng.integers(-16, 17, (b, k, TOP_K)) / 8.0
    scores[..., [lo, hi]] = 8.0
    w_succ = rng.integers(-2, 3, (vr, r)) / 8.0
    w_succ[ids[..., hi]] = w_succ[ids[..., lo]]
    a = {
        "hidden": rng.integers(-2, 3, (b, k, h)) / 4.0,
        "scores": scores,
        "ids": ids,
        "anchor": rng.integers(0, vr, b),
        "w_hidden": rng.integers(-2, 3, (r, h)) / 8.0,
        "w_pred": rng.integers(-2, 3, (vr, r)) / 8.0,
        "w_succ": w_succ,
        "temperature": np.zeros(b),
        "seed": np.arange(b, dtype=np.uint64),
        "frontier": np.full(b, 50, dtype=np.int64),
    }
    return _case(case_id, a, ("exact_tie",))


def _shared_requests(case_id) -> dict:
    """Four rows, T = 1: rows 0 and 2 are one request (same seed, frontier and inputs)."""
    rng = case_rng(case_id)
    for _ in range(200):
        reqs = [
            _request_arrays(rng, 1, 5, 32, 16, 256, 1.0, s, f) for s, f in [(11, 300), (11, 300), (12, 300), (11, 301)]
        ]
        arrays = _stack_rows([reqs[0], reqs[1], reqs[0], reqs[3]])
        case = _case(case_id, arrays, ("rng_batch_row",))
        if is_clear(case):
            return arrays
    raise RuntimeError(f"{case_id}: no clear draw")


def predecessor_row(case_id) -> Case:
    """T = 1, flat unary scores (gaps ~ 0.015) and pair terms ~ N(0, 2^2) that change with the
    predecessor: q_i depends on which row the walk reads."""

    def sample_leaves_argmax(case):
        kw = case.kwargs()
        greedy = candidate_selector(**{**kw, "temperature": np.zeros_like(kw["temperature"])})
        ref = candidate_selector(**kw)
        return bool(np.any(ref["path"][:, :-1] != greedy["path"][:, :-1]))

    rng = case_rng(case_id)
    for _ in range(200):
        a = _request_arrays(rng, 2, 6, 32, 16, 256, 1.0, [3, 4], [77, 5000], pair=2.0)
        a["scores"] = a["scores"] * 0.05
        case = _case(case_id, a, ("selector_predecessor_row",))
        if is_clear(case) and sample_leaves_argmax(case):
            return case
    raise RuntimeError(f"{case_id}: no clear draw")


def generate() -> list[Case]:
    op = OP
    shared = _shared_requests(f"{op}/rng_batch_row__rows_0_2_one_request")
    permuted = _rows_of(shared, [3, 2, 0, 1])
    p32 = 2**32
    cases = [
        _drawn(f"{op}/greedy_T0_B1_K3_R16_H32", 1, 3, 32, 16, 256, 0.0, 1, 10),
        _drawn(f"{op}/greedy_T-1_B2_K7_R32_H64", 2, 7, 64, 32, 256, -1.0, 1, 10),
        _drawn(f"{op}/greedy_T0_B1_K15_R64_H128", 1, 15, 128, 64, 512, 0.0, 1, 10),
        _drawn(f"{op}/greedy_T0_B3_K1_R16_H16", 3, 1, 16, 16, 64, 0.0, 1, 10),
        _drawn(f"{op}/T0.05_B2_K4_R32_H64", 2, 4, 64, 32, 256, 0.05, [5, 6], [123, 9]),
        _drawn(f"{op}/T1_B2_K7_R32_H64", 2, 7, 64, 32, 256, 1.0, [6, 7], [4096, 17]),
        _drawn(f"{op}/T1_B1_K15_R64_H128", 1, 15, 128, 64, 512, 1.0, 7, 0),
        _drawn(f"{op}/T1_B8_K15_R16_H16", 8, 15, 16, 16, 128, 1.0, np.arange(8) * 3 + 1, np.arange(8) * 50 + 31),
        _drawn(f"{op}/T50_B2_K7_R16_H32", 2, 7, 32, 16, 256, 50.0, [9, 10], [2, 2]),
        _drawn(f"{op}/mixed_T_per_row_B4_K5", 4, 5, 32, 16, 256, [0.0, 0.05, 1.0, 50.0], [1, 2, 3, 4], 64),
        # seeds 0 and 2^64-1 are symmetric under a swap of the key words: edges, not a key-order test
        _drawn(f"{op}/seed_edge__seed_0", 1, 4, 32, 16, 256, 1.0, 0, 100),
        _drawn(f"{op}/seed_edge__seed_2p64-1", 1, 4, 32, 16, 256, 1.0, U64_MAX, 100),
        *[_drawn(f"{op}/rng_key__seed_{name}", 1, 4, 32, 16, 256, 1.0, seed, 100, flags=("rng_key",), accept=bites)
          for name, seed in (("1", 1), ("2p32-1", p32 - 1), ("2p32", p32), ("2p32+7", p32 + 7),
                             ("2p63+5", 2**63 + 5))],
        _drawn(f"{op}/engine_wide_seed__B3_distinct_seeds", 3, 5, 32, 16, 256, 1.0, [11, 2**40 + 3, 7], 300,
               flags=("engine_wide_seed",), accept=bites),
        _drawn(f"{op}/draft_temperature_ignored__T0.4_B2_K6", 2, 6, 32, 16, 256, 0.4, [3, 4], [50, 60],
               flags=("draft_temperature_ignored",), accept=bites),
        _drawn(f"{op}/selector_branches_swapped__T0_and_T1_B2_K5", 2, 5, 32, 16, 256, [0.0, 1.0], [8, 9], [70, 80],
               flags=("selector_branches_swapped",), accept=bites),
        _variants(
            f"{op}/rng_key__seed_rows_0_2p32_2p32-1_2p64-1",
            {"temperature": 1.0, "seed": 0, "frontier": 100},
            {"seed": np.array([0, p32, p32 - 1, U64_MAX], np.uint64)},
            flags=("rng_key",),
        ),
        _variants(
            f"{op}/positions_2p32__frontier_2p32-2_K4",
            {"temperature": 1.0, "seed": 42, "frontier": 0},
            {"frontier": np.array([p32 - 2, p32 - 2 + p32, 2], np.int64)},
            flags=("positions_2p32",),
        ),
        _drawn(f"{op}/positions_2p32__frontier_2p40", 1, 6, 32, 16, 256, 1.0, 5, 2**40 + 3, flags=("positions_2p32",),
               accept=bites),
        planted_path(f"{op}/planted_path_K3"),
        exact_tie(f"{op}/exact_tie__lowest_rank_wins"),
        exact_tie(f"{op}/exact_tie__ranks_0_15", b=1, k=3, ranks=(0, 15)),
        _case(f"{op}/rng_batch_row__rows_0_2_one_request", shared, ("rng_batch_row",)),
        _case(f"{op}/rng_batch_row__permuted", permuted, ("rng_batch_row",)),
        predecessor_row(f"{op}/selector_predecessor_row__T1"),
        # the selector_first family: the first step's predecessor (the anchor), its pair term, its branches
        _drawn(f"{op}/selector_first_step__T0_and_T1_B2_K4", 2, 4, 32, 16, 256, [0.0, 1.0], [21, 22], [90, 91],
               flags=("selector_first_step",), accept=bites),
    ]
    return cases


def force(kwargs, impl):
    """Teacher forcing (C2): each step reads the implementation's previous choice."""
    return candidate_selector(**kwargs, forced_path=np.asarray(impl["path"]), forced_g=impl["g"])


def follow(kwargs, impl):
    """The walk on the implementation's own g (a represented output the energies read)."""
    return candidate_selector(**kwargs, forced_g=impl["g"])


SPEC = register(
    OpSpec(
        name=OP,
        reference=candidate_selector,
        inputs=("hidden", "scores", "ids", "anchor", "w_hidden", "w_pred", "w_succ", "temperature", "seed", "frontier"),
        outputs=(
            Output("g", REPRESENTED, "bf16"),
            Output("path", DECISION),
            Output("tokens", DECISION),
            Output("q", REPRESENTED, "fp32"),
        ),
        generate=generate,
        force=force,
        envelope={"g": BF16_CHAIN, "q": FP32_OUTPUT},
        scales=scales.candidate_selector,
        follow=follow,
        followed=("g",),
        decision_k=FP32_OUTPUT.k,
        doc="DFlash2 conditional walk over top-k candidates: greedy lowest rank or keyed exponential race, FP32 q",
    )
)
