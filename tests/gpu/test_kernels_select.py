"""The selection / sampling / verification kernels (kernels_cu/exact/select.py) against the
float64 reference, through the conformance harness's own comparison (CONTRACTS C2).

Every case goes the way a golden vector does: ``generate.case_bytes`` runs the reference
and the float32 baseline and derives the bounds (represented: 2x the baseline's worst ULP
error + 1; decisions: a divergence is acceptable only where the reference margin is
positive and within 2x the baseline's margin error + an fp32-spacing floor), then
``runner.run_case`` calls the kernels and compares, teacher forcing included. A FAIL or
ERROR fails the test with the harness's own message.

Cases: every registered case of these Ops (conformance/cases/*.py), plus local ones for
what those do not sweep (target_distribution and preview_commit have local specs while
they have no case module), plus a few hypothesis draws per Op, plus kernel-only
properties (batch-row permutation, determinism). With DFLASH_SELECT_REPORT set, the
per-case results are written there as JSON.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from conformance import generate, registry, runner, vectors
from conformance.compare import Result
from conformance.registry import EXACT, REPRESENTED, Case, OpSpec, Output, case_rng
from reference.numerics import storage
from reference.preview_commit import preview_commit
from reference.target_distribution import target_distribution

pytestmark = pytest.mark.gpu

SAMPLING = ("temperature", "top_p", "min_p", "repetition_penalty", "frequency_penalty", "presence_penalty")
EDGE_SEEDS = [0, 2**32 - 1, 2**32, 2**64 - 1]
HYPO = settings(max_examples=6, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

_RESULTS: list = []


def _impl():
    from kernels_cu.exact.select import SelectionOps

    class SelectImpl(SelectionOps):
        array_module = "cupy"
        name = "kernels_cu.exact.select.SelectionOps"

    return SelectImpl()


@pytest.fixture(scope="module")
def impl(cupy):
    return _impl()


@pytest.fixture(scope="module", autouse=True)
def _report():
    yield
    path = os.environ.get("DFLASH_SELECT_REPORT")
    if path and _RESULTS:
        rows = [{"op": r.op, "case": r.case, "result": r.result.name, "detail": r.detail, "worst_ulp": r.worst_ulp,
                 "ulp_bound": r.ulp_bound, "worst_norm": r.worst_norm, "norm_bound": r.norm_bound,
                 "seconds": round(r.seconds, 4), "source": src} for src, r in _RESULTS]
        with open(path, "w") as fh:
            json.dump(rows, fh, indent=1)


# --- local specs for Ops without a case module (the registry's wins once it exists) --------

TD_LOCAL = OpSpec(
    name="target_distribution",
    reference=target_distribution,
    inputs=("logits", "prompt_mask", "output_counts", *SAMPLING, "top_k"),
    params=("vocab_size",),
    outputs=(Output("probs", REPRESENTED, "fp32"),),
    generate=list,
    doc="C5 target distribution (local spec of the GPU tests)",
)

PC_LOCAL = OpSpec(
    name="preview_commit",
    reference=preview_commit,
    inputs=("tokens", "num_out", "anchor", "frontier", "ctx_frontier", "budget", "cancel", "eos_ids", "stop_ids"),
    params=("mask_token_id",),
    outputs=tuple(Output(n, EXACT) for n in ("n", "committed", "published", "next_anchor", "frontier",
                                              "ctx_frontier", "pending")),
    generate=list,
    doc="C6 preview and commit (local spec of the GPU tests)",
)


def _spec(op: str) -> OpSpec:
    specs = registry.ops()
    if op in specs:
        return specs[op]
    return {"target_distribution": TD_LOCAL, "preview_commit": PC_LOCAL}[op]


def _vector(spec: OpSpec, case: Case) -> vectors.Vector:
    return vectors.parse_vector(generate.case_bytes(spec, case), case.id)


def run_cases(impl, spec: OpSpec, cases, source: str) -> list:
    results = []
    for case in cases:
        res = runner.run_case(impl, _vector(spec, case), timeout=None, force=spec.force, independent=spec.independent)
        _RESULTS.append((source, res))
        results.append(res)
    return results


def assert_conforms(results) -> None:
    bad = [f"{r.case}: {r.result.name}: {r.detail}" for r in results if r.result.failed]
    assert not bad, "\n".join(bad)
    assert all(r.result in (Result.PASS, Result.ACCEPTABLE) for r in results), [
        (r.case, r.result.name, r.detail) for r in results if r.result not in (Result.PASS, Result.ACCEPTABLE)]


# --- the registered cases ---------------------------------------------------------------------

REGISTERED = ("candidate_topk", "candidate_selector", "speculative_accept", "target_distribution", "preview_commit",
              "tree_verify")


@pytest.mark.parametrize("op", REGISTERED)
def test_registered_cases(impl, op):
    specs = registry.ops()
    if op not in specs:
        pytest.skip(f"{op} has no conformance/cases module yet (its local cases run below)")
    spec = specs[op]
    cases = list(spec.generate())
    assert cases
    assert_conforms(run_cases(impl, spec, cases, "registered"))


# --- target_distribution: local cases ---------------------------------------------------------


def td_case(case_id, n, vr, *, vocab=None, scale=3.0, quantum=None, temperature=(0.0, -1.0, 0.05, 1.0, 50.0, 0.7),
            top_k=(0, 1, 5, 40), top_p=(1.0, 0.9, 0.5, 0.0), min_p=(0.0, 0.05, 0.3), rho=(1.0, 1.3, 0.8),
            freq=(0.0, 0.5), pres=(0.0, 0.25)) -> Case:
    """N rows of Gaussian logits with per-row filter and penalty settings drawn from the
    given choices; redrawn while the baseline bound is not derivable (a baseline filter
    decision flipped, which would make its ULP error infinite)."""
    rng = case_rng(case_id)
    vocab = vr if vocab is None else vocab
    for _ in range(50):
        logits = rng.standard_normal((n, vr)) * scale
        if quantum:  # values on a grid: exact ties in every order, decided by the id (C4)
            logits = np.round(logits / quantum) * quantum
        logits[:, vocab:] = rng.uniform(20, 30, (n, vr - vocab))  # padding would win if not masked
        counts = np.where(rng.random((n, vr)) < 0.05, rng.integers(1, 4, (n, vr)), 0)

        def pick(choices):
            return rng.choice(np.asarray(choices, dtype=np.float64), n)

        case = Case(
            id=case_id,
            inputs={
                "logits": logits.astype(np.float32),
                "prompt_mask": (rng.random((n, vr)) < 0.05).astype(np.uint8),
                "output_counts": counts.astype(np.int32),
                "temperature": pick(temperature).astype(np.float32),
                "top_p": pick(top_p).astype(np.float32),
                "min_p": pick(min_p).astype(np.float32),
                "repetition_penalty": pick(rho).astype(np.float32),
                "frequency_penalty": pick(freq).astype(np.float32),
                "presence_penalty": pick(pres).astype(np.float32),
                "top_k": pick(top_k).astype(np.int32),
            },
            params={"vocab_size": int(vocab)},
        )
        try:
            generate.case_bytes(_spec("target_distribution"), case)
        except generate.GenerationError:
            continue
        return case
    raise RuntimeError(f"{case_id}: no draw with a derivable bound")


def td_cases() -> list[Case]:
    op = "target_distribution"
    return [
        td_case(f"{op}/mixed_rows_N16_V64", 16, 64),
        td_case(f"{op}/mixed_rows_N12_V1000", 12, 1000),
        td_case(f"{op}/greedy_T0_and_negative_grid_ties_V300", 6, 300, quantum=0.25, temperature=(0.0, -1.0)),
        td_case(f"{op}/top_k_ties_at_boundary_grid_V200", 8, 200, quantum=0.5, temperature=(1.0, 0.05),
                top_k=(3, 7, 16), top_p=(1.0,), min_p=(0.0,)),
        td_case(f"{op}/top_p_ties_grid_V200", 8, 200, quantum=0.5, temperature=(1.0, 0.7), top_k=(0,),
                top_p=(0.3, 0.6, 0.9), min_p=(0.0,)),
        td_case(f"{op}/top_p_zero_keeps_one_V128", 4, 128, temperature=(1.0, 50.0), top_p=(0.0,), top_k=(0,)),
        td_case(f"{op}/top_k_beyond_vocab_V64", 4, 64, top_k=(64, 100, 2**31 - 1), temperature=(1.0,)),
        td_case(f"{op}/T0.05_subnormal_probabilities_V500", 4, 500, scale=4.0, temperature=(0.05,), top_k=(0,),
                top_p=(1.0,), min_p=(0.0,)),
        td_case(f"{op}/T50_near_uniform_V500", 4, 500, temperature=(50.0,)),
        td_case(f"{op}/vocab_padding_V256_vocab250", 8, 256, vocab=250),
        td_case(f"{op}/penalties_only_V128", 6, 128, temperature=(1.0,), top_k=(0,), top_p=(1.0,), min_p=(0.0,),
                rho=(1.5, 0.7), freq=(0.0, 1.0), pres=(0.5,)),
        td_case(f"{op}/qwen_vocab_V151936_vocab151643", 3, 151936, vocab=151643, temperature=(0.0, 0.6, 1.0),
                top_k=(0, 20), top_p=(0.95, 1.0), min_p=(0.0, 0.05)),
    ]


def test_target_distribution_local_cases(impl):
    assert_conforms(run_cases(impl, _spec("target_distribution"), td_cases(), "local"))


@HYPO
@given(st.integers(1, 6), st.integers(2, 400), st.integers(0, 2**31 - 1))
def test_target_distribution_property(n, vr, draw):
    case = td_case(f"target_distribution/hypothesis_{draw}", n, vr)
    assert_conforms(run_cases(_impl(), _spec("target_distribution"), [case], "hypothesis"))


def test_target_distribution_is_deterministic(impl, cupy):
    case = td_cases()[1]
    a = cupy.asnumpy(impl.target_distribution(**case.kwargs())["probs"])
    b = cupy.asnumpy(impl.target_distribution(**case.kwargs())["probs"])
    # fixed reduction trees: the same bits run after run, not merely close ones
    np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))
    assert np.all(np.abs(a.sum(axis=1) - 1) < 1e-5)


# --- candidate_topk ---------------------------------------------------------------------------


def topk_case(case_id, b, k, h, vr, *, dup=0, vocab=None, shortlist=False, top_k=16, mult=0.0, cap=0.0) -> Case:
    """Gaussian rows; ``dup`` head rows are copies of others (exact ties, margin 0, which
    the C4 tie rule must settle identically)."""
    rng = case_rng(case_id)
    head = rng.standard_normal((vr, h)) / np.sqrt(h) * 4
    if dup:
        src = rng.choice(vr, dup, replace=False)
        dst = rng.choice(np.setdiff1d(np.arange(vr), src), dup, replace=False)
        head[dst] = head[src]
    inputs = {"hidden": storage(rng.standard_normal((b, k, h)), "bf16"), "head": storage(head, "bf16")}
    vocab = vr if vocab is None else vocab
    if shortlist:
        inputs["shortlist"] = rng.permutation(vocab + 40)[:vr].astype(np.int32)  # some ids >= vocab
    return Case(id=case_id, inputs=inputs,
                params={"vocab_size": int(vocab), "top_k": top_k, "output_multiplier": mult, "softcap": cap})


def test_candidate_topk_local_cases(impl):
    op = "candidate_topk"
    cases = [
        topk_case(f"{op}/dup_rows_ties_V512_H64", 2, 4, 64, 512, dup=200),
        Case(id=f"{op}/zero_hidden_all_rows_tie",  # every logit 0: the row order alone decides
             inputs={"hidden": storage(np.zeros((1, 2, 32)), "bf16"),
                     "head": storage(case_rng(op).standard_normal((128, 32)), "bf16")},
             params={"vocab_size": 100, "top_k": 16, "output_multiplier": 0.0, "softcap": 0.0}),
        topk_case(f"{op}/shortlist_dup_rows_V300", 1, 3, 32, 300, dup=100, vocab=3000, shortlist=True),
        topk_case(f"{op}/top_k64_V1000_softcap", 1, 2, 32, 1000, top_k=64, mult=0.5, cap=20.0),
        topk_case(f"{op}/qwen_vocab_V151936_H128_K3", 1, 3, 128, 151936, vocab=151643, dup=1000, cap=30.0),
    ]
    assert_conforms(run_cases(impl, _spec(op), cases, "local"))


@HYPO
@given(st.integers(1, 3), st.integers(1, 5), st.sampled_from([16, 48, 96]), st.integers(32, 700),
       st.integers(0, 2**31 - 1), st.booleans())
def test_candidate_topk_property(b, k, h, vr, draw, use_shortlist):
    top_k = min(16, vr)
    case = topk_case(f"candidate_topk/hypothesis_{draw}", b, k, h, vr, dup=vr // 4, shortlist=use_shortlist,
                     vocab=vr + 20 if use_shortlist else vr, top_k=top_k)
    if use_shortlist:
        assume(int((case.inputs["shortlist"] < vr + 20).sum()) >= top_k)
    assert_conforms(run_cases(_impl(), _spec("candidate_topk"), [case], "hypothesis"))


# --- candidate_selector -----------------------------------------------------------------------


def selector_case(case_id, b, k, h, r, vr, temperature, seed, frontier, top=16, pair=1.0) -> Case:
    rng = case_rng(case_id)
    sigma = np.sqrt(pair) * r**-0.25
    scores = 2.0 - np.cumsum(rng.exponential(0.3, (b, k, top)), axis=-1)
    inputs = {
        "hidden": storage(rng.standard_normal((b, k, h)), "bf16"),
        "scores": storage(scores, "fp32"),
        "ids": np.stack([rng.choice(vr, top, replace=False) for _ in range(b * k)]).reshape(b, k, top)
        .astype(np.int32),
        "anchor": rng.integers(0, vr, b).astype(np.int32),
        "w_hidden": storage(rng.standard_normal((r, h)) / np.sqrt(h), "bf16"),
        "w_pred": storage(rng.standard_normal((vr, r)) * sigma, "bf16"),
        "w_succ": storage(rng.standard_normal((vr, r)) * sigma, "bf16"),
        "temperature": np.broadcast_to(np.asarray(temperature, np.float32), (b,)).copy(),
        "seed": np.broadcast_to(np.asarray(seed, np.uint64), (b,)).copy(),
        "frontier": np.broadcast_to(np.asarray(frontier, np.int64), (b,)).copy(),
    }
    return Case(id=case_id, inputs=inputs)


@HYPO
@given(st.integers(1, 4), st.integers(1, 8), st.sampled_from([16, 64]), st.sampled_from([16, 64, 256]),
       st.sampled_from([0.0, -1.0, 0.05, 1.0, 50.0]), st.sampled_from(EDGE_SEEDS),
       st.sampled_from([0, 2**32 - 3, 2**40]), st.integers(0, 2**31 - 1))
def test_candidate_selector_property(b, k, h, r, t, seed, frontier, draw):
    case = selector_case(f"candidate_selector/hypothesis_{draw}", b, k, h, r, 300, t, seed, frontier)
    assert_conforms(run_cases(_impl(), _spec("candidate_selector"), [case], "hypothesis"))


def test_candidate_selector_rows_permuted(impl, cupy):
    case = selector_case("candidate_selector/permute", 5, 6, 32, 64, 300, [0.0, 0.05, 1.0, 50.0, 1.0],
                         [0, 2**32 - 1, 2**32, 2**64 - 1, 9], [5, 2**32 - 2, 7, 2**40, 11])
    kw = case.kwargs()
    perm = np.array([3, 0, 4, 1, 2])
    shared = ("w_hidden", "w_pred", "w_succ")
    kp = {n: (v if n in shared else v[perm]) for n, v in kw.items()}
    a = {n: cupy.asnumpy(v) for n, v in impl.candidate_selector(**kw).items()}
    p = {n: cupy.asnumpy(v) for n, v in impl.candidate_selector(**kp).items()}
    for n in a:  # the row only selects tensors: each request's result moves with it, bit for bit
        np.testing.assert_array_equal(p[n], a[n][perm], err_msg=n)


# --- speculative_accept -----------------------------------------------------------------------


def accept_case(case_id, b, k, vr, *, retained, temperature, seed, frontier, p_live=None, **sampling) -> Case:
    from conformance.cases.speculative_accept import accept_inputs

    rng = case_rng(case_id)
    logits = rng.standard_normal((b, k + 1, vr)) * 2
    proposals = rng.integers(0, vr, (b, k))
    top = np.argmax(logits[:, :k], axis=-1)  # half the proposals are the row's argmax: long accepted runs
    proposals = np.where(rng.random((b, k)) < 0.6, top, proposals)
    live = rng.integers(0, k + 1, b) if p_live is None else p_live
    q = q_ids = None
    if retained:
        kq = min(16, vr)
        q_ids = np.stack([rng.permutation(vr)[:kq] for _ in range(b * k)]).reshape(b, k, kq)
        hit = rng.random((b, k)) < 0.8
        q_ids[..., 0] = np.where(hit, proposals, q_ids[..., 0])
        q_ids = np.stack([[_dedupe(row) for row in rows] for rows in q_ids])
        e = np.exp(rng.standard_normal((b, k, kq)) * 1.5)
        q = e / e.sum(-1, keepdims=True)
    inputs, params = accept_inputs(logits, proposals, live, frontier, seed, q=q, q_ids=q_ids,
                                   temperature=temperature, **sampling)
    return Case(id=case_id, inputs=inputs, params=params)


def _dedupe(ids) -> np.ndarray:
    """Distinct ids, the first kept: a top-k support has no repeats."""
    out, seen = [], set()
    pool = iter(x for x in range(10**6) if x not in set(ids))
    for x in ids:
        out.append(int(x) if int(x) not in seen else next(pool))
        seen.add(out[-1])
    return np.asarray(out)


def test_speculative_accept_local_cases(impl):
    op = "speculative_accept"
    cases = [
        accept_case(f"{op}/T0.05_dflash2_B4_K6", 4, 6, 200, retained=True, temperature=0.05, seed=EDGE_SEEDS,
                    frontier=[2**32 - 3, 0, 9, 2**40]),
        accept_case(f"{op}/T50_dflash_B4_K6", 4, 6, 200, retained=False, temperature=50.0, seed=EDGE_SEEDS,
                    frontier=[2**32 - 1, 1, 2**32, 77]),
        accept_case(f"{op}/mixed_T_filters_B6_K5", 6, 5, 300, retained=True,
                    temperature=[0.0, -1.0, 0.05, 1.0, 50.0, 0.7], seed=12, frontier=2**32 - 2, top_k=[0, 5, 0, 20, 0, 3],
                    top_p=[1.0, 0.9, 0.8, 1.0, 0.5, 1.0], min_p=[0.0, 0.0, 0.05, 0.1, 0.0, 0.0],
                    repetition_penalty=1.2, frequency_penalty=0.3, presence_penalty=0.2),
        accept_case(f"{op}/P_0_to_K_B8_K7", 8, 7, 128, retained=True, temperature=1.0, seed=3, frontier=100,
                    p_live=np.arange(8)),
        accept_case(f"{op}/qwen_vocab_V151936_B2_K3", 2, 3, 151936, retained=True, temperature=[0.0, 0.8],
                    seed=[2**64 - 1, 5], frontier=[2**32 - 2, 4096], top_k=[0, 50], top_p=[1.0, 0.95]),
    ]
    assert_conforms(run_cases(impl, _spec(op), cases, "local"))


@HYPO
@given(st.integers(1, 4), st.integers(1, 8), st.integers(16, 300), st.booleans(),
       st.sampled_from([0.0, 0.05, 1.0, 50.0]), st.sampled_from(EDGE_SEEDS), st.sampled_from([3, 2**32 - 4, 2**33]),
       st.integers(0, 2**31 - 1))
def test_speculative_accept_property(b, k, vr, retained, t, seed, frontier, draw):
    case = accept_case(f"speculative_accept/hypothesis_{draw}", b, k, vr, retained=retained, temperature=t,
                       seed=seed, frontier=frontier, top_k=int(draw % 3) * 7, min_p=0.02 * (draw % 2))
    assert_conforms(run_cases(_impl(), _spec("speculative_accept"), [case], "hypothesis"))


def test_speculative_accept_rows_permuted(impl, cupy):
    case = accept_case("speculative_accept/permute", 6, 5, 150, retained=True,
                       temperature=[0.0, 0.05, 1.0, 50.0, 1.0, 0.7], seed=[0, 2**32 - 1, 2**32, 2**64 - 1, 1, 1],
                       frontier=[1, 2**32 - 2, 3, 2**40, 5, 5], p_live=[5, 0, 3, 5, 4, 2])
    kw = case.kwargs()
    perm = np.array([5, 2, 0, 4, 1, 3])
    kp = {n: (v[perm] if isinstance(v, np.ndarray) else v) for n, v in kw.items()}
    a = {n: cupy.asnumpy(v) for n, v in impl.speculative_accept(**kw).items()}
    p = {n: cupy.asnumpy(v) for n, v in impl.speculative_accept(**kp).items()}
    for n in a:
        np.testing.assert_array_equal(p[n], a[n][perm], err_msg=n)


# --- preview_commit ---------------------------------------------------------------------------


def pc_case(case_id, b, w) -> Case:
    rng = case_rng(case_id)
    L = rng.integers(1, w + 1, b)
    tokens = np.where(np.arange(w)[None] < L[:, None], rng.integers(0, 50, (b, w)), -1)
    frontier = rng.integers(0, 2**40, b)
    return Case(
        id=case_id,
        inputs={
            "tokens": tokens.astype(np.int32),
            "num_out": L.astype(np.int32),
            "anchor": rng.integers(0, 50, b).astype(np.int32),
            "frontier": frontier.astype(np.int64),
            "ctx_frontier": frontier.astype(np.int64),
            "budget": rng.choice([-3, 0, 1, 2, 5, 100], b).astype(np.int64),
            "cancel": (rng.random(b) < 0.2).astype(np.uint8),
            "eos_ids": np.array([3, 7], np.int32),
            "stop_ids": np.array([11], np.int32),
        },
        params={"mask_token_id": 5},
    )


def test_preview_commit_local_cases(impl):
    op = "preview_commit"
    cases = [pc_case(f"{op}/random_B8_W{w}_{i}", 8, w) for w in (1, 4, 16) for i in range(3)]
    assert_conforms(run_cases(impl, _spec(op), cases, "local"))


# --- tree_verify ------------------------------------------------------------------------------


def test_tree_verify_rows_permuted(impl, cupy):
    spec = registry.ops().get("tree_verify")
    if spec is None:
        pytest.skip("tree_verify has no conformance/cases module yet")
    case = next(c for c in spec.generate() if c.id.endswith("B3_mixed_temperatures"))
    kw = case.kwargs()
    perm = np.array([2, 0, 1])
    kp = {n: (v[perm] if isinstance(v, np.ndarray) and n != "target_bigram" else v) for n, v in kw.items()}
    a = {n: cupy.asnumpy(v) for n, v in impl.tree_verify(**kw).items()}
    p = {n: cupy.asnumpy(v) for n, v in impl.tree_verify(**kp).items()}
    for n in a:
        np.testing.assert_array_equal(p[n], a[n][perm], err_msg=n)
