"""``dflash-conformance dump CASE --impl X --out DIR``: one case, every array on disk.

Writes, as .npy (BF16 arrays as float32, which holds every BF16 value exactly):

    inputs/<name>.npy      what the implementation was given
    expected/<name>.npy    the stored float64 reference (and <name>.margin / <name>.scale for decisions)
    actual/<name>.npy      what the implementation returned
    error/<name>.npy       per element: |actual - expected| in ulp of the output's storage format
                           (its spacing at the expected value; represented outputs), 1 where it
                           differs (exact and decision outputs); masked-out elements 0
    mask/<name>.npy        the compared elements, where the vector has a mask
    picture/<name>.png     for a FAIL, where matplotlib is installed (the [report] extra): |error| /
                           allowance over the output's element grid, the mask drawn on it (as
                           ``run --html`` shows it)
    summary.txt            the case, params, verdict (with the diagnosis of a FAIL, as run prints
                           it), the unit of each error file, and per output its worst error and where
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from conformance import runner
from conformance.registry import REPRESENTED
from reference import numerics


def _host(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    return a.astype(np.float32) if a.dtype == runner.BF16 else a


def _save(path: Path, arr) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, _host(arr), allow_pickle=False)


def error_unit(name: str, o) -> str:
    """The line that says what error/<name>.npy holds."""
    if o.cls == REPRESENTED:
        return (f"error/{name}.npy: per element |actual - expected| in ulp of {o.fmt} (the spacing of the "
                "output's storage format at the expected value); 0 where masked out")
    return f"error/{name}.npy: per element 1 where actual differs from expected, else 0; 0 where masked out"


def dump(handle, vec, out: Path, timeout, spec=None) -> tuple[runner.RunResult, list[str]]:
    from conformance.diagnose import Diagnoser

    outcome = handle.invoke(vec, timeout)
    res = runner.judge(vec, outcome, spec.force if spec else None, spec.independent if spec else (), spec,
                       Diagnoser())
    for name, arr in vec.inputs.items():
        _save(out / "inputs" / f"{name}.npy", arr)
    for name, arr in vec.expected.items():
        _save(out / "expected" / f"{name}.npy", arr)
    for name, arr in vec.masks.items():
        _save(out / "mask" / f"{name}.npy", arr)
    lines = [f"case {vec.case} (Op {vec.op})", f"params {json.dumps(vec.params, default=str)}",
             f"flags {', '.join(vec.flags) or '-'}", f"implementation {getattr(handle, 'name', '?')}",
             f"result {res.result.name}: {res.detail}"]
    if res.diagnosis_note:
        lines.append(f"diagnosis: {res.diagnosis_note}")
    trace = ["traceback:", res.trace.rstrip()] if res.trace else []
    for name, o in vec.outputs.items():
        ref = vec.expected[name]
        got = outcome.arrays.get(name) if outcome.kind == "ok" else None
        if got is None:
            lines.append(f"output {name} ({o.cls}{' ' + o.fmt if o.fmt else ''}): not returned")
            continue
        got = np.asarray(got)
        if o.cls == REPRESENTED and o.fmt == "bf16" and got.dtype == np.uint16:
            got = got.view(runner.BF16)
        _save(out / "actual" / f"{name}.npy", got)
        if got.shape != ref.shape:
            lines.append(f"output {name}: shape {list(got.shape)}, expected {list(ref.shape)}; no error array")
            continue
        mask = vec.masks.get(name)
        mask = np.ones(ref.shape, bool) if mask is None else np.broadcast_to(np.asarray(mask, bool), ref.shape)
        if o.cls == REPRESENTED:
            with np.errstate(all="ignore"):
                err = numerics.ulp_error(np.asarray(got, np.float64), np.asarray(ref, np.float64), o.fmt)
            unit = f"ulp of {o.fmt}"
        else:
            err = (got != ref).astype(np.int8)
            unit = "differs"
        err = np.where(mask, err, 0)
        _save(out / "error" / f"{name}.npy", err)
        lines.append(error_unit(name, o))
        if err.size and np.any(err):
            at = np.unravel_index(int(np.argmax(err)), err.shape)
            lines.append(f"output {name} ({o.cls}{' ' + o.fmt if o.fmt else ''}): worst {float(err[at]):.4g} {unit} "
                         f"at {list(map(int, at))} (got {got[at]!r}, expected {ref[at]!r}); "
                         f"{int(np.count_nonzero(err))} of {int(mask.sum())} compared element(s) nonzero")
        else:
            lines.append(f"output {name} ({o.cls}{' ' + o.fmt if o.fmt else ''}): no error")
    lines += _pictures(res, out)
    (out / "summary.txt").write_text("\n".join(lines + trace) + "\n")
    shown = [line for line in lines if not line.startswith(("params", "result", "diagnosis"))]
    return res, shown + ([f"the traceback is in {out / 'summary.txt'}"] if trace else [])


def _pictures(res, out: Path) -> list[str]:
    """picture/<name>.png for each output of a FAIL that leaves its allowance somewhere."""
    from conformance.diagnosis import picture

    grids = getattr(getattr(res, "diagnosis", None), "grids", None) or {}
    if not grids:
        return []
    if not picture.have_matplotlib():
        return [f"no picture/*.png: {picture.EXTRA}"]
    lines = []
    for name, g in grids.items():
        if not (g[0] > 1.0).any():
            continue
        path = out / "picture" / f"{name}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(picture.png(name, g, res.case))
        lines.append(f"picture/{name}.png: |error| / allowance over the element grid (1 = allowed; hatched: not "
                     "compared)")
    return lines
