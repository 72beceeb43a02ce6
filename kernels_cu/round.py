"""proposal_round (CONTRACTS C10) and speculative_step composed from the CUDA backend's Op methods,
no new kernels.

``CudaRound`` is ``CudaBackend`` plus a ``proposal_round`` method that runs the reference round's
composition (reference.proposal_round.run: catch-up through feature_capture and context_kv per
layer and request, masked_block, then proposal_head or candidate_topk + candidate_selector) over
the backend's own Op methods. The composition stays on the host between Ops (NumPy in, CuPy out
of each kernel, brought back here); it shows that the kernels compose into a conforming round,
not a fused production path.

``speculative_step`` adds the backend's speculative_accept and preview_commit kernels after the
round; the target verify in between is the toy target of the step's inputs, run on the host
(reference.toy_target: the target is the engine's own model, not a drafter kernel).

    dflash-conformance run --impl kernels_cu.round:CudaRound --ops proposal_round,speculative_step
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from conformance import registry
from conformance.rounds import ComposedRounds
from kernels_cu.backend import CudaBackend

BF16 = np.dtype(ml_dtypes.bfloat16)


def _host(x, fmt: str | None) -> np.ndarray:
    from conformance.runner import to_numpy

    a = to_numpy(x)
    if fmt == "bf16" and a.dtype == np.uint16:
        a = a.view(BF16)  # the backend returns BF16 as uint16 bit patterns
    return a


def _device_in(v):
    """NumPy inputs of the backend's Ops: BF16 as uint16 bit patterns (the CuPy convention)."""
    if isinstance(v, np.ndarray) and v.dtype == BF16:
        return v.view(np.uint16)
    return v


class _HostOps:
    """The backend's Op methods with NumPy in and out (BF16 as ml_dtypes.bfloat16 on the host)."""

    def __init__(self, backend):
        self.backend = backend

    def __getattr__(self, op):
        method = getattr(self.backend, op)
        spec = registry.get(op)

        def call(**kw):
            raw = method(**{k: _device_in(np.asarray(v)) if isinstance(v, np.ndarray) or hasattr(v, "dtype") else v
                            for k, v in kw.items()})
            return {o.name: _host(raw[o.name], o.fmt) for o in spec.outputs if o.name in raw}

        return call


class CudaRound(ComposedRounds, CudaBackend):
    """CudaBackend with proposal_round and speculative_step composed from its kernels."""

    name = "kernels_cu (proposal_round composed from the Op kernels)"

    def _round_ops(self):
        return _HostOps(self)

    def _round_inputs(self, kw: dict) -> dict:
        """The harness's arguments on the host, BF16 as ml_dtypes.bfloat16 (uint16 bit patterns viewed)."""
        kw = {k: (v.get() if hasattr(v, "get") and not isinstance(v, (dict, list)) else v) for k, v in kw.items()}
        return {k: (np.asarray(v).view(BF16) if isinstance(v, np.ndarray) and v.dtype == np.uint16 else v)
                for k, v in kw.items()}
