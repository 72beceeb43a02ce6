"""Every case bites: for every Op-level case carrying a pitfall flag, every mutant of the
catalog (conformance.mutants) that answers for that flag FAILs on that very case (a precision-only
mutant: ACCEPTABLE(precision), never PASS), and every flag of an Op-level case has a mutant.

No exceptions are listed. A flagged case that a mutant of its flag passes is a case that cannot
catch the bug its flags name: fix the case generator (make it bite) or drop the flag there, never
weaken this test. proposal_round and speculative_step (C10) are judged by their own round mutants (test_round_mutants.py).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest

from conformance import mutants
from conformance.compare import Result
from conformance.runner import load_selection, read_entry, run_suite

VECTORS = Path(__file__).parents[2] / "vectors"
ROUND_OPS = {"proposal_round", "speculative_step"}


@cache
def _flagged() -> dict:
    _, entries = load_selection(VECTORS)
    out = {}
    for e in entries:
        if e["op"] in ROUND_OPS:
            continue
        vec = read_entry(VECTORS, e)
        if vec.flags:
            out[vec.case] = tuple(vec.flags)
    return out


@cache
def _results(key: str) -> dict:
    m = next(m for m in mutants.MUTANTS if m.key == key)
    return {r.case: r for r in run_suite(m, VECTORS, ops_pattern=m.op)}


def test_every_flag_has_a_mutant():
    missing = sorted({(c.split("/")[0], f) for c, flags in _flagged().items() for f in flags
                      if not mutants.for_flag(c.split("/")[0], f)})
    assert not missing, f"case flags without a mutant in conformance.mutants: {missing}"


def _ops():
    return sorted({m.op for m in mutants.MUTANTS})


@pytest.mark.parametrize("op", _ops())
def test_every_flagged_case_fails_its_mutants(op):
    weak = []
    for case, flags in sorted(_flagged().items()):
        if case.split("/")[0] != op:
            continue
        for f in flags:
            for m in mutants.for_flag(op, f):
                r = _results(m.key)[case]
                ok = r.result == Result.FAIL if m.expect == "fail" else (
                    r.result == Result.ACCEPTABLE and "precision" in r.acceptable_flags)
                if not ok:
                    weak.append(f"  {case} [{f}]: mutant {m.key} gives {r.result.name}: {r.detail[:160]}")
    assert not weak, "flagged cases that cannot catch the bug their flag names:\n" + "\n".join(weak)
