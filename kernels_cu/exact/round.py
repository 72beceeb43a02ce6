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

from kernels_cu.exact.backend import CudaBackend
from reference.rounds import ComposedRounds

BF16 = np.dtype(ml_dtypes.bfloat16)


def _host(x):
    """An Op output on the host: device arrays copied back, BF16 uint16 bit patterns viewed as
    ml_dtypes.bfloat16 (the backend's convention: uint16 outputs are BF16, FP16 travels as float16)."""
    if hasattr(x, "__cuda_array_interface__"):
        import cupy

        x = cupy.asnumpy(cupy.asarray(x))
    x = np.asarray(x)
    return x.view(BF16) if x.dtype == np.uint16 else x


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

        def call(**kw):
            raw = method(**{k: _device_in(np.asarray(v)) if isinstance(v, np.ndarray) or hasattr(v, "dtype") else v
                            for k, v in kw.items()})
            return {name: _host(v) for name, v in raw.items()}

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
