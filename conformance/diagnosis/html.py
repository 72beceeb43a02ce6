"""The one-file HTML report of a run (``dflash-conformance run --html FILE``).

The verdict and the per-Op table; then every FAIL with its diagnosis (the note, the ranked
hypotheses with their evidence and confidence) and, for the first FAILs whose error grid the
diagnosis kept (``Diagnoser.pictures``), a picture per output that differs: |error| / allowance
over the element grid with the vector's mask drawn on it, embedded as base64 PNG. The number of
pictures is capped, and the report says how many FAILs have none. Needs matplotlib (the
``[report]`` extra).
"""

from __future__ import annotations

import html
from pathlib import Path

from conformance import report
from conformance.compare import Result
from conformance.diagnose import finalize, hypotheses
from conformance.diagnosis import picture

STYLE = """body{font-family:sans-serif;margin:1.5em;max-width:1200px}table{border-collapse:collapse}
td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}th{background:#eee}td.l{text-align:left}
.FAIL{color:#b00}.ERROR{color:#b60}.PASS{color:#070}.ACCEPTABLE{color:#05a}h3{margin-bottom:.2em}
.case{border-top:1px solid #ddd;margin-top:1em;padding-top:.5em}code{background:#f4f4f4}"""


def _e(s) -> str:
    return html.escape(str(s))


def html_text(results, implementation: str, complete: bool = True, strict: bool = False,
              title: str = "dflash-conformance run") -> str:
    finalize(results)
    out = [f"<!doctype html><html><head><meta charset='utf-8'><title>{_e(title)}</title><style>{STYLE}</style>"
           "</head><body>", f"<h1>{_e(title)}</h1>", f"<p>implementation: <code>{_e(implementation)}</code></p>",
           f"<p>verdict: <b>{_e(report.verdict(results, strict, complete))}</b>"
           f"{'' if complete else ' (incomplete run)'}</p>"]
    cols = report.COLUMNS
    out.append("<table><tr><th>Op</th>" + "".join(f"<th>{c.name}</th>" for c in cols) + "</tr>")
    for op, rs in report.by_op(results).items():
        out.append(f"<tr><td class='l'>{_e(op)}</td>" + "".join(
            f"<td class='{c.name}'>{sum(r.result == c for r in rs) or ''}</td>" for c in cols) + "</tr>")
    out.append("<tr><th>total</th>" + "".join(f"<th>{sum(r.result == c for r in results)}</th>" for c in cols)
               + "</tr></table>")
    fails = [r for r in results if r.result == Result.FAIL]
    drawn = sum(bool(getattr(getattr(r, "diagnosis", None), "grids", None)) for r in fails)
    if fails:
        out.append(f"<h2>FAILs ({len(fails)})</h2>")
        if drawn < len(fails):
            out.append(f"<p>Pictures for the first {drawn} FAIL(s) only (at most {_cap()} per run); "
                       f"{len(fails) - drawn} FAIL(s) without a picture"
                       f"{' (diagnosis off)' if not any(getattr(r, 'diagnosis_note', '') for r in fails) else ''}"
                       ".</p>")
    for r in fails:
        out.append(f"<div class='case'><h3 class='FAIL'>{_e(r.case)}</h3><p>{_e(r.detail)}</p>")
        if getattr(r, "diagnosis_note", ""):
            out.append(f"<p><b>diagnosis:</b> {_e(r.diagnosis_note)}</p>")
        hs = hypotheses(r)
        if hs:
            out.append("<ol>" + "".join(f"<li>[{_e(h['kind'])}, confidence {h['confidence']:.2f}] {_e(h['text'])}"
                                        f"<br><small>{_e(h['evidence'])}</small></li>" for h in hs) + "</ol>")
        elif getattr(r, "diagnosis_note", ""):
            out.append("<p>hypotheses: none (no evidence for any)</p>")
        grids = getattr(getattr(r, "diagnosis", None), "grids", None) or {}
        for name, g in grids.items():
            if not (g[0] > 1.0).any():
                continue  # this output is within its allowance everywhere
            data = picture.png_base64(name, g, r.case)
            out.append(f"<p><img alt='|error| / allowance of {_e(name)}' src='data:image/png;base64,{data}'></p>")
        out.append("</div>")
    out.append("</body></html>")
    return "\n".join(out)


def _cap() -> int:
    from conformance.diagnose import MAX_PICTURES

    return MAX_PICTURES


def write_html(path, results, implementation: str, complete: bool = True, strict: bool = False) -> None:
    Path(path).write_text(html_text(results, implementation, complete, strict), encoding="utf-8")
