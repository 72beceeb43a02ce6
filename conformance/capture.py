"""Captured runs (CONTRACTS C10): an engine writes what it computed, the suite judges it.

File format (one safetensors file per Op call or per round; a folder of them per run):

    in.<name>     an input of the Op, under its C9 name (docs/ops.md), in its storage dtype
                  (BF16 as BF16; a round's checkpoint tensors as in.ckpt.<tensor name>)
    out.<name>    an output, under its C9 name (every declared output of the Op)
    mask.<name>   optional uint8: the elements of out.<name> that are specified (default: all)
    header metadata (strings):
      op          the Op name (``proposal_round`` for a whole round, ``speculative_step`` for a
                  whole step: round, target verify, accept and commit)
      params      JSON object: the Op's params (docs/ops.md), e.g. {"eps": 1e-6, ...}
      capture     the format version, "1"
      round       optional: the id of the round this call belongs to (any string); the calls of
                  one round and the round's own file share it
      seq         optional: the call's position in its round (an integer as text), for ordering

File names are free; ``write`` uses ``<round>-<seq>-<op>.safetensors``.

``write(folder, op, inputs, outputs, params, round=, seq=)`` writes one file; arrays may be NumPy
arrays (ml_dtypes.bfloat16 for BF16), torch tensors (any device; bfloat16 and float16 by their
bit pattern, via ``.detach().cpu()``), or anything with ``__dlpack__`` or ``__array__``.
``Recorder(folder, round=)`` is a callable ``record(op, inputs, outputs)`` that numbers the calls.

``check(folder)`` judges every file: the Op's reference and float32 baseline are run on the
captured inputs (bounds derived as for a golden vector, C2 v2), and the captured outputs are judged
with the same classes (PASS / ACCEPTABLE / FAIL / ERROR). For a round that does not pass, the
calls of the same round are judged in order and the first Op whose output leaves its envelope is
named: each call is recomputed from its own captured inputs, which are the previous calls'
captured outputs, so the chain is bisected at the captured intermediates that are present.
``dflash-conformance check-capture DIR`` prints this and exits 1 on any FAIL or ERROR.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from conformance import registry, vectors
from conformance.compare import Result
from conformance.registry import Case
from conformance.vectors import InputError

VERSION = "1"
_SAFE = re.compile(r"[^A-Za-z0-9_.+-]")
ROUND_LEVEL = ("proposal_round", "speculative_step")  # files that a round's Op calls bisect


def _array(x) -> np.ndarray:
    """A host NumPy array from NumPy, torch (bit patterns for bfloat16/float16), DLPack or lists."""
    from conformance.invoke import to_numpy

    if type(x).__module__.split(".")[0] == "torch" and "torch" not in sys.modules:  # pragma: no cover
        raise TypeError("a torch tensor without torch imported")
    return np.array(to_numpy(x), order="C")  # (ascontiguousarray would make a 0-d array 1-d)


def write(folder, op: str, inputs: Mapping, outputs: Mapping, params: Mapping | None = None, *,
          round: str | None = None, seq: int | None = None, masks: Mapping | None = None,
          name: str | None = None) -> Path:
    """Write one capture file into ``folder`` (created if absent); returns its path."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {f"in.{k}": _array(v) for k, v in inputs.items() if v is not None}
    tensors.update({f"out.{k}": _array(v) for k, v in outputs.items() if "." not in k})
    tensors.update({f"mask.{k}": _array(v).astype(np.uint8) for k, v in (masks or {}).items()})
    meta = {"op": op, "params": vectors.dumps(dict(params or {})), "capture": VERSION}
    if round is not None:
        meta["round"] = str(round)
    if seq is not None:
        meta["seq"] = str(int(seq))
    stem = name or "-".join(p for p in (_SAFE.sub("_", str(round)) if round is not None else None,
                                        f"{seq:04d}" if seq is not None else None, op) if p)
    path = folder / f"{stem}.safetensors"
    path.write_bytes(vectors.encode(tensors, meta))
    return path


class Recorder:
    """``record(op, inputs, outputs)``: every call a file of round ``round``, numbered in order.
    Keyword inputs that are params of the Op go to the header, the rest are tensors."""

    def __init__(self, folder, round: str = "r0"):
        self.folder, self.round, self.seq = Path(folder), str(round), 0

    def __call__(self, op: str, inputs: Mapping, outputs: Mapping, masks: Mapping | None = None) -> Path:
        spec = registry.get(op)
        params = {k: v for k, v in inputs.items() if k in spec.params}
        tensors = {k: v for k, v in inputs.items() if k not in spec.params}
        path = write(self.folder, op, tensors, outputs, params, round=self.round, seq=self.seq, masks=masks)
        self.seq += 1
        return path


# --- judging ------------------------------------------------------------------------------------


@dataclass
class Judged:
    path: Path
    op: str
    result: Result
    detail: str
    round: str | None = None
    seq: int = 0
    first_bad: Judged | None = None  # for a round that did not pass: the first Op call outside its envelope
    calls: list = field(default_factory=list)


def read(path: Path) -> tuple[str, dict, dict, dict, dict, dict]:
    """(op, params, inputs, outputs, masks, metadata) of one capture file (InputError if malformed)."""
    tensors, meta = vectors.decode(Path(path).read_bytes(), str(path))
    if "op" not in meta:
        raise InputError(f"{path}: no 'op' in the header metadata (not a capture file)")
    try:
        params = json.loads(meta.get("params", "{}"))
        if not isinstance(params, dict):
            raise TypeError("params is not a JSON object")
    except (ValueError, TypeError) as exc:
        raise InputError(f"{path}: bad params ({exc})") from None
    groups: dict[str, dict] = {"in": {}, "out": {}, "mask": {}}
    for key, arr in tensors.items():
        kind, _, name = key.partition(".")
        if kind in groups:
            groups[kind][name] = np.array(arr)
    return meta["op"], params, groups["in"], groups["out"], groups["mask"], meta


def _default_masks(op: str, inputs: Mapping, params: Mapping, outputs: Mapping) -> dict:
    """The specified elements of Ops whose outputs hold unspecified parts (C7 live slots, live
    columns), as the golden vectors mask them."""
    from reference.context_kv import live_mask
    from reference.speculative_step import verified_proposals

    if op == "context_kv" and "k_cache" in outputs:
        rows = np.shape(inputs["context"])[0]
        m = live_mask(int(params["start"]) + rows, np.shape(outputs["k_cache"]), params.get("storage", "ring"),
                      inputs.get("page_table"), params.get("page_size"))
        return {"k_cache": m, "v_cache": m}
    if op == "proposal_round" and "tokens" in outputs:
        live = np.asarray(inputs["live"])
        K = np.shape(outputs["tokens"])[1]
        compared = np.arange(K)[None, :] < (live[:, None] - 1)
        kc = np.shape(outputs["k_cache"])
        ring = np.stack([np.stack([live_mask(int(f), kc[2:], "ring") for f in inputs["frontier"]])] * kc[0])
        return {"tokens": compared, "q": compared[..., None], "q_ids": compared[..., None], "k_cache": ring,
                "v_cache": ring}
    if op == "speculative_step" and "proposals" in outputs:
        K = np.shape(outputs["proposals"])[1]
        return {"proposals": np.arange(K)[None, :] < verified_proposals(K, inputs["budget"])[:, None]}
    if op == "masked_block" and "hidden" in outputs:
        K = int(params["num_drafts"])
        cols = np.arange(1, K + 1)[None, :] < np.asarray(inputs["live"])[:, None]
        return {"hidden": np.broadcast_to(cols[..., None], np.shape(outputs["hidden"]))}
    if op in ("draft_attention", "draft_layer"):
        name = "out" if op == "draft_attention" else "x_next"
        if name in outputs:
            w = np.shape(outputs[name])[1]
            rows = np.arange(w)[None, :] < np.asarray(inputs["live"])[:, None]
            shape = np.shape(outputs[name])
            return {name: np.broadcast_to(rows.reshape(rows.shape + (1,) * (len(shape) - 2)), shape)}
    return {}


def judge_file(path: Path, specs: Mapping | None = None) -> Judged:
    """One capture file against the reference recomputed from its captured inputs."""
    from conformance.generate import case_vector
    from conformance.runner import Outcome, judge

    specs = specs if specs is not None else registry.ops()
    try:
        op, params, inputs, outputs, masks, meta = read(path)
    except (InputError, OSError) as exc:
        return Judged(Path(path), "?", Result.ERROR, f"unreadable: {exc}")
    rnd, seq = meta.get("round"), int(meta.get("seq", 0) or 0)
    if op not in specs:
        return Judged(Path(path), op, Result.ERROR, f"unknown Op {op!r}", rnd, seq)
    spec = specs[op]
    masks = {**_default_masks(op, inputs, params, outputs), **{k: v.astype(bool) for k, v in masks.items()}}
    try:
        case = Case(f"{op}/capture_{_SAFE.sub('_', Path(path).stem) or 'x'}", inputs, params, (),
                    {k: v for k, v in masks.items() if k in {o.name for o in spec.outputs}})
        vec = case_vector(spec, case)
    except Exception as exc:  # noqa: BLE001 - inputs the reference cannot run on are the capture's ERROR
        return Judged(Path(path), op, Result.ERROR, f"the reference cannot run on the captured inputs: "
                      f"{type(exc).__name__}: {exc}".splitlines()[0], rnd, seq)
    res = judge(vec, Outcome("ok", {k: v for k, v in outputs.items()}, sorted(outputs)), spec.force,
                spec.independent, spec)
    return Judged(Path(path), op, res.result, res.detail, rnd, seq)


def check(folder, specs: Mapping | None = None) -> list[Judged]:
    """Judge every capture file of ``folder`` (sorted by name); rounds that do not pass get their
    first Op call outside its envelope (``first_bad``)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise InputError(f"check-capture: no directory {folder}")
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise InputError(f"check-capture: no .safetensors files in {folder}")
    judged = [judge_file(p, specs) for p in files]
    rounds = [j for j in judged if j.op in ROUND_LEVEL]
    for r in rounds:
        calls = sorted((j for j in judged if j.op not in ROUND_LEVEL and r.round is not None and j.round == r.round),
                       key=lambda j: j.seq)
        r.calls = calls
        if r.result != Result.PASS:
            r.first_bad = next((c for c in calls if c.result.failed), None)
    return judged


def report(judged: list[Judged]) -> tuple[list[str], bool]:
    """(lines, failed): one line per file, and per failing round the Op to blame."""
    lines, failed = [], False
    for j in judged:
        failed |= j.result.failed
        lines.append(f"{j.result.name:<14} {j.path.name} [{j.op}{'' if j.round is None else ', round ' + j.round}]"
                     + (f": {j.detail}" if j.detail and j.result != Result.PASS else ""))
        if j.op in ROUND_LEVEL and j.result != Result.PASS:
            lines += _blame(j)
    counts = {}
    for j in judged:
        counts[j.result.name] = counts.get(j.result.name, 0) + 1
    lines.append(f"{len(judged)} capture file(s): " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
    return lines, failed


def _blame(j: Judged) -> list[str]:
    """What a round that did not pass says about its captured Op calls."""
    if j.first_bad is not None:
        return [f"  first Op outside its envelope in round {j.round}: {j.first_bad.op} "
                f"(call {j.first_bad.seq}, {j.first_bad.path.name}): {j.first_bad.detail}"]
    if not j.result.failed:  # ACCEPTABLE, and so is every call or better: nothing to blame
        return []
    if not j.calls:
        return [f"  round {j.round}: no per-Op captures of this round to bisect"]
    near = [c for c in j.calls if c.result == Result.ACCEPTABLE]
    if near:  # inside every envelope, yet the round fails: the calls that came closest come first
        return [f"  no captured Op call of round {j.round} leaves its envelope; the first that is only "
                f"ACCEPTABLE: {near[0].op} (call {near[0].seq}, {near[0].path.name}): {near[0].detail}"]
    return [f"  every captured Op call of round {j.round} passes: the fault lies between them "
            "(an Op not captured, or a captured output not passed on)"]


def main(folder) -> int:
    """``dflash-conformance check-capture DIR``: 0 when nothing FAILs or ERRORs, else 1."""
    lines, failed = report(check(folder))
    print("\n".join(lines))
    return 1 if failed else 0
