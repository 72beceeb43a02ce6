"""Run-level symptoms: case flags over-represented among an Op's failing cases.

A case's flags name what it exercises (a window edge, a ring wrap, a tie, a NaN score). When the
failing cases of an Op carry a flag much more often than its passing ones, that flag is what the
bug is about. The evidence is the two counts; a flag carried by every case of the Op, or by too few
to tell, says nothing and is left out.
"""

from __future__ import annotations

from collections import defaultdict

from conformance.compare import Result

MIN_FLAGGED = 2  # failing cases carrying the flag, at least
MIN_LIFT = 0.5  # fail rate with the flag minus the rate without it, at least


def flag_symptoms(results) -> dict[str, list[dict]]:
    """Op -> symptoms, strongest first: {"flag", "failing_with", "with", "failing_without", "without"}."""
    by_op = defaultdict(list)
    for r in results:
        if r.result in (Result.PASS, Result.ACCEPTABLE, Result.FAIL):
            by_op[r.op].append(r)
    out = {}
    for op, rs in by_op.items():
        fails = [r for r in rs if r.result == Result.FAIL]
        if not fails or len(fails) == len(rs):
            continue
        found = []
        for flag in sorted({f for r in fails for f in r.flags}):
            w = [r for r in rs if flag in r.flags]
            wo = [r for r in rs if flag not in r.flags]
            fw = sum(r.result == Result.FAIL for r in w)
            fwo = sum(r.result == Result.FAIL for r in wo)
            if not wo or fw < MIN_FLAGGED:
                continue
            lift = fw / len(w) - fwo / len(wo)
            if lift >= MIN_LIFT:
                found.append({"flag": flag, "failing_with": fw, "with": len(w), "failing_without": fwo,
                              "without": len(wo), "lift": round(lift, 3)})
        found.sort(key=lambda s: (-s["lift"], s["flag"]))
        if found:
            out[op] = found
    return out


def hypothesis(s: dict) -> dict:
    return {"kind": "symptom", "text": f"the failing cases are those flagged `{s['flag']}`",
            "evidence": f"{s['failing_with']} of {s['with']} cases flagged `{s['flag']}` FAIL, against "
                        f"{s['failing_without']} of {s['without']} without it (run-level)",
            "confidence": round(0.6 * s["lift"], 3)}
