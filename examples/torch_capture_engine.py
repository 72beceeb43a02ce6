"""A PyTorch engine that writes a capture folder (CONTRACTS C10, conformance.capture).

The round (reference/proposal_round.py ``run``) composed over PyTorch kernels for its six Ops
(feature_capture, context_kv, masked_block, proposal_head, candidate_topk, candidate_selector:
examples/torch_engine/engine.py, an HF/vLLM-style BF16 engine), writing one file per Op call and
one per round exactly as examples/capture_engine.py does. ``--bug context_kv`` / ``--bug
masked_block`` plants one bug in that Op's output (examples.capture_engine.BUGS), which
``check-capture`` must name first.

    python -m examples.torch_capture_engine /tmp/capture-torch                  # every proposal_round vector
    python -m examples.torch_capture_engine /tmp/capture-torch-bad --bug masked_block
    python -m examples.torch_capture_engine /tmp/capture-torch-gpu --device cuda
    dflash-conformance check-capture /tmp/capture-torch
"""

from __future__ import annotations

import sys
from pathlib import Path

from examples import capture_engine
from examples.torch_engine.engine import TorchEngine


def run(folder, bug: str | None = None, cases: str = "proposal_round", device: str = "cpu",
        vectors: Path | None = None) -> int:
    """Run the PyTorch engine on ``device`` over the selected proposal_round vectors; returns the rounds run."""
    return capture_engine.run(folder, bug, cases, vectors, kernels=TorchEngine(device=device))


def main(argv=None) -> int:
    ap = capture_engine.parser("python -m examples.torch_capture_engine")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = ap.parse_args(argv)
    n = run(args.folder, args.bug, args.cases, args.device)
    print(f"wrote {n} round(s) of PyTorch captures ({args.device}) to {args.folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
