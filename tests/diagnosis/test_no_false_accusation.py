"""No false accusation: a legitimate engine never gets a pitfall named.

Every legitimate variant of the control set runs the whole suite with the diagnosis on: no FAIL,
so no diagnosis. Stronger: the diagnosis is asked about each of its ACCEPTABLE cases as if it had
failed (what would it say of a legitimate rounding?), and must name no pitfall, neither as a
match nor as the closest one."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest

from conformance.compare import Result
from conformance.controls.variants import VARIANTS
from conformance.diagnose import Diagnoser
from conformance.runner import load_selection, read_entry, run_suite

VECTORS = Path(__file__).parents[2] / "vectors"
_VECS: dict = {}


def _vec(case):
    if not _VECS:
        _, entries = load_selection(VECTORS)
        _VECS.update({e["case"]: e for e in entries})
    return read_entry(VECTORS, _VECS[case])


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.key)
def test_legitimate_variant_gets_no_pitfall(variant):
    results = run_suite(variant, VECTORS, diagnose=True)
    assert not [r.case for r in results if r.result.failed]
    assert all(not r.diagnosis and not r.diagnosis_note for r in results)
    diagnoser = Diagnoser(max_cases=10**9)
    accused = []
    for r in results:
        if r.result != Result.ACCEPTABLE:
            continue
        vec = _vec(r.case)
        kw = {**{k: np.array(v, copy=True) for k, v in vec.inputs.items()}, **copy.deepcopy(dict(vec.params))}
        out = {k: np.asarray(v) for k, v in getattr(variant, vec.op)(**kw).items()}
        # the analysis itself, without the runner's "only a FAIL is diagnosed"
        found, hyps = diagnoser.analyse(vec, out)
        named = [h for h in hyps if h.get("pitfall") or h.get("family")]
        if found or named:
            accused.append(f"{r.case}: {[x.mutant for x in found]} {[h['text'] for h in named]}")
    assert not accused, "a legitimate rounding named as a pitfall:\n" + "\n".join(accused)
