"""No legitimate variant (conformance/controls/variants.py) FAILs on fuzzed examples.

The default run judges every variant on 5 examples per Op (a smoke test); the full run, 2,000 examples per
Op, is slow-marked and selected with -m slow (tools/fuzz_report.py writes its figures to docs/reports/fuzz.md):

    python -m pytest -q -m slow tests/test_fuzz_controls.py -p no:cacheprovider
"""

from __future__ import annotations

import pytest

pytest.importorskip("hypothesis")

from conformance import fuzz, registry
from conformance.controls.variants import VARIANTS


def _run(op, n):
    specs = registry.ops()
    judges = [(v.key, fuzz.judge_with(v, specs)) for v in VARIANTS]
    bad = []

    def judge(case):
        out = [(k, j(case)) for k, j in judges]
        bad.extend((k, case.id, r.detail) for k, r in out if r.result.name in ("FAIL", "ERROR"))
        return out

    fuzz.fuzz_op(op, judge, max_examples=n, seed=21, shrink=False, is_failure=lambda _: False)
    return bad


@pytest.mark.parametrize("op", sorted(fuzz.STRATEGIES))
def test_variants_smoke(op):
    bad = _run(op, 5)
    assert not bad, "\n".join(f"{k} on {c}: {d}" for k, c, d in bad[:5])


@pytest.mark.slow
@pytest.mark.parametrize("op", sorted(fuzz.STRATEGIES))
def test_variants_2000_examples(op, request):
    if "slow" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("2,000 examples x every variant take long: select them with -m slow")
    bad = _run(op, 2000)
    assert not bad, f"{len(bad)} FAIL/ERROR:\n" + "\n".join(f"{k} on {c}: {d}" for k, c, d in bad[:5])
