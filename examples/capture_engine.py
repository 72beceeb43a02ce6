"""An example engine that writes a capture folder (CONTRACTS C10, conformance.capture).

The engine here is NumPy (the float32 baseline's Op kernels composed into a round), so that it
runs anywhere; a PyTorch engine calls ``conformance.capture.write`` the same way with its tensors
(bfloat16 tensors are stored by their bit pattern). For each round it writes one file per Op call
(feature_capture, context_kv per layer and request, masked_block, the head / selector) and one
file for the whole round, all sharing the round id. ``--bug context_kv`` plants one bug in one
Op's output (context K stored 3% too large), which ``check-capture`` must name first.

    python -m examples.capture_engine /tmp/capture                 # every proposal_round vector
    python -m examples.capture_engine /tmp/capture-bad --bug context_kv
    dflash-conformance check-capture /tmp/capture
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import numpy as np

from conformance import capture, registry
from conformance.baseline import Float32Baseline
from conformance.runner import load_selection, read_entry
from reference import numerics
from reference import proposal_round as pr

ROUND_OPS = ("feature_capture", "context_kv", "masked_block", "proposal_head", "candidate_topk",
             "candidate_selector")


class _Kernels:
    """The engine's Op kernels: the float32 baseline's, one of them optionally buggy."""

    def __init__(self, bug: str | None):
        self.base, self.bug = Float32Baseline(), bug

    def __getattr__(self, op):
        if op not in ROUND_OPS:
            raise AttributeError(op)
        fn = getattr(self.base, op)
        if op == self.bug == "context_kv":
            def buggy(**kw):
                out = dict(fn(**kw))
                out["k_cache"] = numerics.storage(np.asarray(out["k_cache"], np.float64) * 1.03, "bf16")
                return out
            return buggy
        return fn


class CaptureEngine:
    """``proposal_round`` (C10's round method) that also writes every Op call and the round."""

    name = "capture example engine (NumPy)"

    def __init__(self, folder, bug: str | None = None):
        self.folder, self.kernels, self.rounds = Path(folder), _Kernels(bug), 0

    def proposal_round(self, **kw):
        rnd = f"r{self.rounds:03d}"
        self.rounds += 1
        spec = registry.get("proposal_round")
        inputs = {k: copy.deepcopy(v) for k, v in kw.items() if k not in spec.params}
        params = {k: v for k, v in kw.items() if k in spec.params}
        rec = capture.Recorder(self.folder, round=rnd)
        out = pr.run(self.kernels, record=rec, **kw)
        out = {o.name: out[o.name] for o in spec.outputs}
        capture.write(self.folder, "proposal_round", inputs, out, params, round=rnd, seq=rec.seq)
        return out


def run(folder, bug: str | None = None, cases: str = "proposal_round", vectors: Path | None = None) -> int:
    """Run the engine over the selected proposal_round vectors' inputs; returns the rounds run."""
    vectors = vectors or Path(__file__).resolve().parents[1] / "vectors"
    engine = CaptureEngine(folder, bug)
    _, entries = load_selection(vectors, cases)
    for e in entries:
        vec = read_entry(vectors, e)
        engine.proposal_round(**{k: np.array(v) for k, v in vec.inputs.items()}, **copy.deepcopy(vec.params))
    return engine.rounds


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m examples.capture_engine")
    ap.add_argument("folder")
    ap.add_argument("--bug", choices=["context_kv"])
    ap.add_argument("--cases", default="proposal_round", help="case glob over the vectors (default: all rounds)")
    args = ap.parse_args(argv)
    n = run(args.folder, args.bug, args.cases)
    print(f"wrote {n} round(s) of captures to {args.folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
