"""Calibration, legitimate side (CONTRACTS C2 v2): every legitimate variant gives no FAIL.

A variant that FAILs is a defect of the suite (its bound or its case) or a variant that rounds
where C2 v2 does not allow; the fix goes there, never into a weaker assertion here. The control
of the control: each variant really differs from the float32 baseline somewhere, or it would
test nothing.

    python -m tests.controls.test_controls --torch cuda      # the PyTorch engine on a GPU host
"""

from __future__ import annotations

import argparse
import copy
import sys
from collections import Counter
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from conformance.baseline import Float32Baseline
from conformance.compare import Result
from conformance.controls.engine import TWO24, Engine, fast_exp, rational_tanh
from conformance.controls.variants import VARIANTS
from conformance.runner import load_selection, read_entry, run_suite
from reference import numerics

VECTORS = Path(__file__).parents[2] / "vectors"
DISCRETE = {"speculative_accept", "tree_verify", "preview_commit"}


@cache
def _results(impl) -> tuple:
    return tuple(run_suite(impl, VECTORS))


@cache
def _vectors() -> tuple:
    _, entries = load_selection(VECTORS)
    return tuple(read_entry(VECTORS, e) for e in entries)


def _table(results) -> str:
    return "\n".join(f"  {r.result.name:<14} {r.case}: {r.detail}" for r in results)


def _same(a, b) -> bool:
    """Value-equal (signed zeros equal, NaN equal NaN): a bit pattern of -0 is no numerical choice."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind in "iub" or b.dtype.kind in "iub":
        return np.array_equal(a, b)
    return np.array_equal(a.astype(np.float64), b.astype(np.float64), equal_nan=True)


def _kwargs(vec) -> dict:
    """Fresh keyword arguments for one call (C9: inputs as NumPy, params as decoded)."""
    return {**{k: np.array(v, copy=True) for k, v in vec.inputs.items()}, **copy.deepcopy(dict(vec.params))}


def _differing_cases(impl, limit: int | None = 1) -> list[str]:
    base = Float32Baseline()
    found = []
    for vec in _vectors():
        if vec.op in DISCRETE:
            continue
        mine = getattr(impl, vec.op)(**_kwargs(vec))
        theirs = getattr(base, vec.op)(**_kwargs(vec))
        if not all(_same(mine[k], theirs[k]) for k in vec.outputs):
            found.append(vec.case)
            if limit and len(found) >= limit:
                break
    return found


def test_variants_are_named_reasoned_and_enough():
    keys = [v.key for v in VARIANTS]
    assert len(keys) == len(set(keys)) >= 12
    assert all(v.reason for v in VARIANTS)
    assert all(v.changed() for v in VARIANTS), "a variant without a changed option is the baseline"


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.key)
def test_legitimate_variant_gives_no_fail(variant):
    results = _results(variant)
    assert len(results) == len(_vectors())
    bad = [r for r in results if r.result in (Result.FAIL, Result.ERROR, Result.NOT_IMPLEMENTED)]
    counts = dict(Counter(r.result.name for r in results))
    assert not bad, (f"legitimate variant {variant.key} ({variant.reason}) {counts}; a suite defect or an "
                     f"illegitimate variant:\n{_table(bad)}")


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.key)
def test_variant_differs_from_the_baseline(variant):
    assert _differing_cases(variant), f"{variant.key} is bit-identical to the float32 baseline on every case"


def test_default_engine_is_the_baseline_up_to_blas_order():
    """Engine() makes the baseline's choices: it conforms, and is value-identical to the baseline
    on nearly every case (a few differ where the baseline's einsum and the engine's matmul sum in
    another order), so each variant's difference is its option's."""
    engine = Engine()
    bad = [r for r in _results(engine) if r.result.failed or r.result == Result.NOT_IMPLEMENTED]
    assert not bad, _table(bad)
    judged = [v for v in _vectors() if v.op not in DISCRETE]
    differing = _differing_cases(engine, limit=None)
    assert len(differing) <= len(judged) // 20, differing


def test_fast_exp_within_documented_error():
    """CUDA __expf: 2 + floor(1.173 |x|) ulps (CUDA C Programming Guide, intrinsic functions)."""
    x = np.linspace(-87, 88, 200_001).astype(np.float32)
    ref = np.exp(x.astype(np.float64))
    normal = ref >= 2.0**-126
    err = numerics.ulp_error(fast_exp(x, ftz=False)[normal], ref[normal], "fp32")
    assert np.all(err <= 2 + np.floor(1.173 * np.abs(x[normal]))), float(err.max())
    assert fast_exp(np.float32(-100), ftz=True) == 0 and fast_exp(np.float32(-100), ftz=False) > 0


def test_rational_tanh_within_a_few_ulps():
    x = np.linspace(-12, 12, 200_001).astype(np.float32)
    err = numerics.ulp_error(rational_tanh(x), np.tanh(x.astype(np.float64)), "fp32")
    assert err.max() <= 8, float(err.max())


def test_fp32_angles_only_below_2p24():
    eng = Engine(fp32_angles=True)
    exact = Engine()
    below, at = np.array([TWO24 - 1]), np.array([TWO24, 2**32 + 5])
    assert not np.array_equal(eng._angles(below, 16, 1e7), exact._angles(below, 16, 1e7))
    assert np.array_equal(eng._angles(at, 16, 1e7), exact._angles(at, 16, 1e7))


def test_torch_engine_gives_no_fail():
    pytest.importorskip("torch", reason="torch is not installed: the PyTorch engine runs on a host that has it "
                        "(python -m tests.controls.test_controls --torch cuda)")
    from examples.torch_engine.engine import TorchEngine

    engine = TorchEngine(device="cpu")
    results = run_suite(engine, VECTORS)
    bad = [r for r in results if r.result in (Result.FAIL, Result.ERROR, Result.NOT_IMPLEMENTED)]
    assert not bad, _table(bad)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="run the legitimate controls (and the PyTorch engine) over the vectors")
    ap.add_argument("--torch", metavar="DEVICE", help="run the PyTorch BF16 engine on DEVICE (cpu, cuda)")
    ap.add_argument("--only-torch", action="store_true")
    ap.add_argument("--vectors", type=Path, default=VECTORS)
    ap.add_argument("-v", "--verbose", action="store_true", help="also list every ACCEPTABLE case")
    args = ap.parse_args(argv)
    impls = [] if args.only_torch else list(VARIANTS)
    if args.torch:
        from examples.torch_engine.engine import TorchEngine

        impls.append(TorchEngine(device=args.torch))
    failed = 0
    for impl in impls:
        results = run_suite(impl, args.vectors)
        counts = dict(Counter(r.result.name for r in results))
        print(f"{impl.key}: {counts}")
        for r in results:
            if r.result not in (Result.PASS, Result.ACCEPTABLE):
                failed += 1
            if r.result != Result.PASS and (args.verbose or r.result != Result.ACCEPTABLE):
                env = getattr(r, "envelope_frac", None)
                print(f"  {r.result.name} {r.case} (envelope fraction {env}): {r.detail}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
