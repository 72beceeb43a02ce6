"""The float64 reference on CuPy against the reference of record (NumPy), on every committed vector
of the portable Ops (the full-geometry path: masked_block and its layer pieces, context_kv,
proposal_head, candidate_topk, grouped_conv).

What may differ: the GPU sums in another order (cuBLAS GEMMs, CuPy reductions) and its libm
differs by ulps, so the float64 values before a represented rounding differ by float64 noise,
at most about n * 2^-53 * sum|terms| for an n-long sum (n <= 2^13 here: under 2^-40 relative
to the magnitude). Hence:

- represented outputs: equal, or one quantum of their format apart (a float64 value within that
  noise of a rounding boundary may round either way; nothing larger can move a rounded value
  by more than one quantum);
- decisions: equal wherever the NumPy margin exceeds that noise, DECISION_NOISE times the
  decision's magnitude (``<name>.scale``, FP32 units: the scale times 2^-24 is an absolute
  magnitude of the compared logits) or, without a scale, DECISION_NOISE absolute. A committed
  exact tie (margin 0, decided by row order) is an exact float64 tie on both backends and must
  give the same decision too: a margin of exactly 0 is compared like any other.
"""

from __future__ import annotations

import numpy as np
import pytest

from conformance import generate, vectors
from conformance.registry import DECISION, REPRESENTED
from reference import backend, numerics
from tests.test_reference_backend import PORTABLE

DECISION_NOISE = 2.0**-40


@pytest.mark.parametrize("spec,case,path", PORTABLE, ids=[c.id for _, c, _ in PORTABLE])
def test_cupy_reference_gives_numpy_decisions_and_outputs(spec, case, path):
    kwargs = case.kwargs()
    ref = backend.call(spec.reference, **kwargs)
    with backend.use("cupy"):
        dev = backend.call(spec.reference, **kwargs)
    assert not any(hasattr(type(v), "__cuda_array_interface__") for v in dev.values())  # NumPy back out
    for o in spec.outputs:
        a, b = np.asarray(ref[o.name]), np.asarray(dev[o.name])
        assert a.shape == b.shape, o.name
        if o.cls == REPRESENTED:
            assert np.array_equal(np.isnan(a), np.isnan(b)), o.name
            fin = ~np.isnan(a)
            steps = numerics.ulp_distance(a[fin], b[fin], o.fmt)
            assert steps.max(initial=0) <= 1, f"{o.name}: {steps.max()} quanta apart"
        elif o.cls == DECISION:
            margin = np.broadcast_to(np.asarray(ref[f"{o.name}.margin"], np.float64), a.shape)
            scale = ref.get(f"{o.name}.scale")
            noise = DECISION_NOISE * (np.broadcast_to(np.asarray(scale, np.float64), a.shape) * 2.0**-24
                                      if scale is not None else 1.0)
            clear = ~(np.abs(margin) <= noise) | (margin == 0)
            assert np.array_equal(a[clear], b[clear]), f"{o.name}: another decision"
        else:
            assert np.array_equal(a, b, equal_nan=True), o.name


def test_cupy_runs_whole_cases_baseline_magnitudes_and_bounds():
    """Whole cases (reference, float32 baseline, magnitudes, teacher forcing, bounds) on CuPy give
    the committed vector's tensors (names, dtypes, shapes); their values are the test above's."""
    for spec, case, path in PORTABLE:
        with backend.use("cupy"):
            tensors, meta = generate.case_tensors(spec, case)
        stored, stored_meta = vectors.decode(path.read_bytes(), str(path))
        assert {k: (v.dtype, v.shape) for k, v in tensors.items()} == \
            {k: (v.dtype, v.shape) for k, v in stored.items()}, case.id
        assert meta.keys() == stored_meta.keys(), case.id
