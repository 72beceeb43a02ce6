"""feature_capture: a case on paper, the concat GEMM against a per-block sum, and the pitfall cases
(boundary index, final-normed last block) against buggy variants under the harness's bound."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.cases import feature_capture as cases
from reference import numerics, precision
from reference.feature_capture import feature_capture
from reference.norms import plain_rmsnorm
from tests.casetools import check_generator


def bound_and_ref(case):
    """The harness's max-ULP allowance (C2): 2x the float32 baseline's max ULP error + 1."""
    ref = feature_capture(**case.kwargs())["context"]
    with precision.baseline(cases.SPEC.bf16_intermediates):
        base = feature_capture(**case.kwargs())["context"]
    return 2 * numerics.ulp_error(base, ref, "bf16").max() + 1, ref


def test_on_paper_ids_in_recorded_order():
    # Three blocks, one row, Ht = 2: r^0 = (1, 1), r^1 = (2, 0), r^2 = (0, 4). ids [2, 0]:
    # s = (r^2, r^0) = (0, 4, 1, 1). fc = [[1, 0, 0, 0], [0, 0, 1, 0]] picks (s_0, s_2) = (0, 1):
    # mean square 1/2 -> c = (0, 1) / sqrt(1/2) = (0, sqrt 2) with unit weight, eps 0.
    blocks = np.array([[[1.0, 1.0]], [[2.0, 0.0]], [[0.0, 4.0]]])
    fc = np.array([[1.0, 0, 0, 0], [0, 0, 1.0, 0]])
    out = feature_capture(blocks, fc, np.ones(2), target_layer_ids=[2, 0], eps=0.0)["context"]
    np.testing.assert_array_equal(out, numerics.to_bf16([[0.0, np.sqrt(2.0)]]))
    # ids [0, 2] concatenates the other way round: fc now picks (1, 0) -> (sqrt 2, 0)
    out = feature_capture(blocks, fc, np.ones(2), target_layer_ids=[0, 2], eps=0.0)["context"]
    np.testing.assert_array_equal(out, numerics.to_bf16([[np.sqrt(2.0), 0.0]]))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(1, 5), st.integers(1, 4), st.integers(0, 2**32 - 1))
def test_concat_gemm_equals_sum_of_per_block_gemms(blocks, rows, n, seed):
    # W s = sum_k W[:, k Ht:(k+1) Ht] r^{id_k}: an independent formulation of the concat order
    rng = np.random.default_rng(seed)
    ht, h = 4, 8
    r = rng.standard_normal((blocks, rows, ht))
    ids = list(rng.integers(0, blocks, n))
    fc, w = rng.standard_normal((h, n * ht)), rng.uniform(0.5, 1.5, h)
    projected = sum(r[i] @ fc[:, k * ht:(k + 1) * ht].T for k, i in enumerate(ids))
    want = numerics.to_bf16(plain_rmsnorm(projected, w, 1e-6))
    got = feature_capture(r, fc, w, target_layer_ids=ids, eps=1e-6)["context"]
    # float64 sums in two orders differ by ~1e-15 relative; a BF16 rounding of the result can then
    # flip only at a rounding boundary, so at most 1 ULP anywhere
    assert numerics.ulp_distance(got, want, "bf16").max() <= 1


def _case(cid):
    return next(c for c in cases.generate() if c.id == cid)


@pytest.mark.parametrize("cid", [c.id for c in cases.generate() if "boundary_index" in c.flags])
def test_boundary_index_exceeds_bound(cid):
    case = _case(cid)
    bound, ref = bound_and_ref(case)
    shifted = [i + 1 for i in case.params["target_layer_ids"]]  # hidden-state boundary l+1 read as block l
    bug = feature_capture(**{**case.kwargs(), "target_layer_ids": shifted})["context"]
    assert numerics.ulp_error(bug, ref, "bf16").max() > 100 * bound


@pytest.mark.parametrize("cid", [c.id for c in cases.generate() if "last_block_final_norm" in c.flags])
def test_final_normed_last_block_exceeds_bound(cid):
    case = _case(cid)
    bound, ref = bound_and_ref(case)
    r = np.asarray(case.inputs["block_outputs"], np.float64).copy()
    assert r.shape[0] - 1 in case.params["target_layer_ids"]
    r[-1] = plain_rmsnorm(r[-1], np.ones(r.shape[-1]), 1e-6)  # what HF hidden_states[-1] holds
    bug = feature_capture(**{**case.kwargs(), "block_outputs": numerics.storage(r, "bf16")})["context"]
    assert numerics.ulp_error(bug, ref, "bf16").max() > 100 * bound


def test_generator_deterministic_ids_unique_and_coverage():
    a = check_generator(cases.generate, ("boundary_index", "last_block_final_norm"))
    lists = [c.params["target_layer_ids"] for c in a]
    assert any(ids != sorted(ids) for ids in lists)
    assert any(0 in ids for ids in lists)
    assert cases.DFLASH_IDS in lists and cases.DFLASH2_IDS in lists
