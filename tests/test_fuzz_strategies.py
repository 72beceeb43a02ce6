"""dflash-conformance fuzz: every Op has a strategy; its examples are valid cases (the
reference does not raise, every case id is valid), the float32 baseline conforms on them, the same
seed gives the same examples, and an example stays well under the per-example time budget.

Fixed seed, 30 examples per Op: a few seconds in all."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("hypothesis")

from conformance import fuzz, registry
from conformance.baseline import Float32Baseline

SEED = 13
N = 30


@pytest.fixture(scope="module")
def specs():
    return registry.ops()


def test_every_op_has_a_strategy(specs):
    assert sorted(fuzz.STRATEGIES) == sorted(specs)


@pytest.mark.parametrize("op", sorted(fuzz.STRATEGIES))
def test_baseline_conforms_on_fuzzed_cases(op, specs):
    judge = fuzz.judge_with(Float32Baseline(), specs)
    seen = []

    def timed(case):
        t = time.perf_counter()
        res = judge(case)
        seen.append((case.id, time.perf_counter() - t))
        assert case.flags[0] == fuzz.FLAG
        return res

    run = fuzz.fuzz_op(op, timed, max_examples=N, seed=SEED, shrink=False)
    assert run.found is None, f"{op}: the float32 baseline {run.found.result.result.name}s on {run.found.case.id}: " \
                              f"{run.found.result.detail}"
    assert run.examples >= N * 2 // 3, f"{op}: only {run.examples} of {N} draws gave a case ({run.rejected} rejected)"
    assert not run.counts.get("ERROR")
    assert run.generator_errors == 0, run.note
    slow = [(c, s) for c, s in seen if s > 0.5]
    assert not slow, f"{op}: examples over 0.5 s on the float64 reference: {slow[:3]}"


def _ids(op, seed, n=12):
    ids = []

    def judge(case):
        ids.append(case.id)
        return type("R", (), {"result": type("N", (), {"name": "PASS"})()})()

    fuzz.fuzz_op(op, judge, max_examples=n, seed=seed, shrink=False)
    return ids


@pytest.mark.parametrize("op", ["draft_attention", "speculative_accept", "candidate_selector"])
def test_the_same_seed_gives_the_same_examples(op):
    assert _ids(op, 5) == _ids(op, 5)
    assert _ids(op, 5) != _ids(op, 6)


def test_case_ids_name_the_parameters():
    cid = fuzz.case_id("draft_attention", {"window": 8, "frontier": [2**32], "salt": 3})
    assert cid.startswith("draft_attention/fuzz__window8_frontier4294967296_")
    registry.Case(cid, {})  # a valid case id


def test_trigger_names_only_what_differs_from_the_simplest_example():
    base = fuzz.minimal("draft_attention")
    p = dict(base, hq=base["hk"] * 4, salt=77)
    assert fuzz.trigger_of("draft_attention", p) == {"hq": base["hk"] * 4}
