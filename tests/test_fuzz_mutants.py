"""fuzz alone (no golden vectors) catches a sample of the catalog's mutants within 200 examples on
their Op, with a fixed seed; the shrunk example names the parameter that triggers the bug, is saved
as a vector flagged `fuzz` that `run --vectors DIR` replays (FAIL for the mutant, PASS for the
baseline). The whole catalog is covered by tools/fuzz_report.py (docs/reports/fuzz.md)."""

from __future__ import annotations

import pytest

pytest.importorskip("hypothesis")

from conformance import fuzz, mutants, registry
from conformance.baseline import Float32Baseline
from conformance.compare import Result
from conformance.runner import run_suite

SEED = 0
# mutant key -> a parameter (or parameter=value) the shrunk example must name
SAMPLE = {
    "window_le_S": "window",
    "conv_delta_per_channel": None,
    "k_bf16_before_norm": None,  # a precision-only deviation: ACCEPTABLE(precision), caught with --strict
    "positions_2p32": "frontier",
    "rng_key-speculative_accept": None,
    "penalties_last_token_only": "design=repeats",
    "topk_unstable": "kind=all_equal",
    "preview_cut_before_eos": "place",
    "gqa_head_mapping": "hq",
}


@pytest.fixture(scope="module")
def specs():
    return registry.ops()


def _mutant(key):
    return next(m for m in mutants.MUTANTS if m.key == key)


@pytest.mark.parametrize("key", sorted(SAMPLE))
def test_fuzz_alone_catches_the_mutant(key, specs, tmp_path):
    m = _mutant(key)
    failing = ("FAIL", "ERROR") + (("ACCEPTABLE",) if m.expect == "precision" else ())
    run = fuzz.fuzz_op(m.op, fuzz.judge_with(m, specs), max_examples=200, seed=SEED,
                       is_failure=lambda r: r.result.name in failing)
    assert run.found is not None, f"{m.name}: not caught in 200 examples ({dict(run.counts)})"
    f = run.found
    assert 1 <= f.examples_to_first <= 200
    want = SAMPLE[key]
    if want:
        name, _, value = want.partition("=")
        assert name in f.trigger, f"{m.name}: shrunk example does not name {name}: {f.trigger}"
        if value:
            assert str(f.trigger[name]) == value
    path = fuzz.save(f, tmp_path, specs)
    assert path.is_file() and (tmp_path / "manifest.json").is_file()
    replay = run_suite(m, tmp_path)
    assert [r.result.name for r in replay] == [f.result.result.name] and replay[0].flags == (fuzz.FLAG,)
    assert run_suite(Float32Baseline(), tmp_path)[0].result in (Result.PASS, Result.ACCEPTABLE)
