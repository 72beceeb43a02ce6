"""The float32 baseline as an implementation (CONTRACTS C2, C9).

The same reference functions run under ``precision.baseline``: float32 inside
each Op, BF16 at the intermediates the Op's registry entry allows. It is what the
bounds are derived from, so it passes every vector (its decision divergences are
acceptable by construction, ``conformance.bounds``); it is the CLI's fallback
when no GPU is present, and a worked example of the implementation interface.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from conformance import registry
from conformance.registry import REPRESENTED, OpSpec
from reference import backend, numerics, precision


def run_baseline(spec: OpSpec, kwargs: Mapping) -> dict[str, np.ndarray]:
    """The reference's full output dict (margins included), computed as the baseline."""
    with precision.baseline(spec.bf16_intermediates):
        return dict(backend.call(spec.reference, **kwargs))


def storage_outputs(spec: OpSpec, out: Mapping) -> dict[str, np.ndarray]:
    """Declared outputs only, represented ones in their format's storage dtype (exact:
    the reference has already rounded them)."""
    return {o.name: numerics.storage(out[o.name], o.fmt) if o.cls == REPRESENTED else np.asarray(out[o.name])
            for o in spec.outputs}


class Float32Baseline:
    """One method per registered Op (or per Op of ``specs``), built on demand."""

    name = "float32 baseline (NumPy)"

    def __init__(self, specs: Mapping[str, OpSpec] | None = None):
        self._specs = specs

    def __getattr__(self, op: str):
        if op.startswith("_"):
            raise AttributeError(op)
        specs = self._specs if self._specs is not None else registry.ops()
        if op not in specs:
            raise AttributeError(f"{type(self).__name__} has no Op {op!r}")
        spec = specs[op]

        def method(**kwargs):
            return storage_outputs(spec, run_baseline(spec, kwargs))

        method.__name__ = op
        return method

    def environment(self) -> dict:
        return {"baseline": "reference under precision.baseline: float32 arithmetic, BF16 at allowed intermediates"}
