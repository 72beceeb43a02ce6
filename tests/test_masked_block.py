"""masked_block: the block against draft_layer run by hand layer by layer, the DFlash live extent as
a shorter block, and the pitfall cases (anchor as MASK, DFlash2 prefix only) against buggy variants
under the harness's bound. Also the size and time budget of all six DFlash-path generators."""

from __future__ import annotations

import importlib
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.cases import draft_layer as layer_cases
from conformance.cases import masked_block as cases
from reference import numerics, precision
from reference.draft_layer import draft_layer, forward
from reference.masked_block import CONV_WEIGHTS, LAYER_WEIGHTS, masked_block
from reference.norms import plain_rmsnorm
from tests.casetools import check_generator


def beyond_bounds(case, bug) -> tuple[float, float]:
    """How many times the harness's allowances (C2) ``bug`` exceeds: (max ULP error over 2x the
    float32 baseline's + 1, normwise error over 2x the baseline's + the BF16 unit roundoff)."""
    ref = masked_block(**case.kwargs())["hidden"]
    with precision.baseline(cases.SPEC.bf16_intermediates):
        base = masked_block(**case.kwargs())["hidden"]
    m = case.masks["hidden"]
    ulp = numerics.ulp_error(bug, ref, "bf16")[m].max() / (2 * numerics.ulp_error(base, ref, "bf16")[m].max() + 1)
    norm = numerics.normwise_error(bug[m], ref[m]) / (2 * numerics.normwise_error(base[m], ref[m]) + 2.0**-8)
    return ulp, norm


def small_block(seed, variant, windows, b, k):
    rng = np.random.default_rng(seed)
    layers, h, hk, d, cap, vocab = len(windows), 32, 1, 4, 12, 10
    frontier = rng.integers(0, 12, b)
    live = rng.integers(1, k + 2, b) if variant == "dflash" else np.full(b, k + 1)
    kw = dict(
        anchor=rng.integers(1, vocab, b), embed=rng.standard_normal((vocab, h)), frontier=frontier, live=live,
        context_k=rng.standard_normal((layers, b, cap, hk, d)), context_v=rng.standard_normal((layers, b, cap, hk, d)),
        final_norm=rng.uniform(0.5, 1.5, h),
        **layer_cases.layer_weights(rng, h=h, hq=2, hk=hk, d=d, inter=40, variant=variant, lead=(layers,)),
    )
    return {**kw, "mask_token_id": 0, "windows": windows, "eps": 1e-6, "theta": 1e4, "head_dim": d,
            "variant": variant, "num_drafts": k}


def by_hand(kw, layer_fn):
    """Embeddings of [anchor, MASK x K], then layer_fn per layer with that layer's slices."""
    b, k = len(kw["anchor"]), kw["num_drafts"]
    x = np.stack([np.stack([kw["embed"][a]] + [kw["embed"][kw["mask_token_id"]]] * k) for a in kw["anchor"]])
    live = kw["live"] if kw["variant"] == "dflash" else np.full(b, k + 1)
    names = LAYER_WEIGHTS + (CONV_WEIGHTS if kw["variant"] == "dflash2" else ())
    for layer, window in enumerate(kw["windows"]):
        x = layer_fn(x=x, k_cache=kw["context_k"][layer], v_cache=kw["context_v"][layer], frontier=kw["frontier"],
                     live=live, eps=kw["eps"], theta=kw["theta"], head_dim=kw["head_dim"], window=window,
                     variant=kw["variant"], **{n: kw[n][layer] for n in names})
    return x


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from(["dflash", "dflash2"]),
       st.lists(st.integers(0, 6), min_size=1, max_size=3), st.integers(1, 2), st.integers(1, 5))
def test_block_equals_draft_layer_by_hand(seed, variant, windows, b, k):
    kw = small_block(seed, variant, windows, b, k)
    got = masked_block(**kw)["hidden"]
    x = by_hand(kw, forward)
    want = numerics.to_bf16(plain_rmsnorm(x, kw["final_norm"], kw["eps"])[:, 1:])
    np.testing.assert_array_equal(got, want)  # same float64 operations in the same order
    # the baseline rounds the residual stream at layer boundaries exactly as the draft_layer Op's
    # represented x_next, so the chain of Ops reproduces it bit for bit
    with precision.baseline({"x"}):
        got = masked_block(**kw)["hidden"]
        x = by_hand(kw, lambda **a: draft_layer(**a)["x_next"])
        want = numerics.to_bf16(plain_rmsnorm(x, kw["final_norm"], kw["eps"])[:, 1:])
    np.testing.assert_array_equal(got, want)


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**32 - 1), st.lists(st.integers(0, 6), min_size=1, max_size=2), st.integers(2, 6))
def test_dflash_live_extent_equals_the_shorter_block(seed, windows, k):
    # DFlash with W = K+1 and live = P+1 computes the compared columns exactly as a block with K = P:
    # the columns >= live take part in nothing. Different array lengths can reorder float64 sums
    # (~1e-16 relative), so a BF16 result may sit across a rounding boundary: <= 1 ULP.
    kw = small_block(seed, "dflash", windows, 1, k)
    p = int(kw["live"][0]) - 1
    if p == 0:
        return
    long = masked_block(**kw)["hidden"][:, :p]
    short = masked_block(**{**kw, "num_drafts": p})["hidden"]
    assert numerics.ulp_distance(long, short, "bf16").max() <= 1


def _case(cid):
    return next(c for c in cases.generate() if c.id == cid)


@pytest.mark.parametrize("cid", [c.id for c in cases.generate() if "anchor_as_mask" in c.flags])
def test_anchor_filled_with_mask_exceeds_bound(cid):
    case = _case(cid)
    kw = case.kwargs()
    bug = masked_block(**{**kw, "anchor": np.full_like(kw["anchor"], kw["mask_token_id"])})["hidden"]
    ulp, norm = beyond_bounds(case, bug)
    assert ulp > 5 and norm > 5


@pytest.mark.parametrize("cid", [c.id for c in cases.generate() if "dflash2_all_columns" in c.flags])
def test_dflash2_prefix_only_exceeds_bound(cid):
    # z-lab's verify_size = min(block_size, ...): the block is built only live columns wide
    case = _case(cid)
    kw = case.kwargs()
    bug = masked_block(**kw)["hidden"]
    for r, live in enumerate(kw["live"]):
        row = {**kw, "anchor": kw["anchor"][r:r + 1], "frontier": kw["frontier"][r:r + 1],
               "live": kw["live"][r:r + 1], "context_k": kw["context_k"][:, r:r + 1],
               "context_v": kw["context_v"][:, r:r + 1], "num_drafts": int(live) - 1}
        bug[r, :live - 1] = masked_block(**row)["hidden"][0]
    assert (kw["live"] < kw["num_drafts"] + 1).all()
    ulp, norm = beyond_bounds(case, bug)
    assert ulp > 5 and norm > 5


def test_generator_deterministic_ids_unique_and_geometries():
    a = check_generator(cases.generate, ("anchor_as_mask", "dflash2_all_columns"))
    for c in a:
        assert not np.any(c.inputs["anchor"] == c.params["mask_token_id"])
    official = [c for c in a if "official_reduced" in c.id]
    assert {c.params["variant"] for c in official} == {"dflash", "dflash2"}
    assert any(c.params["windows"][0] > 0 and c.params["windows"][-1] == 0 for c in official)
    assert all(c.inputs["wq"].shape[1] == 4 * c.inputs["wk"].shape[1] for c in official)  # Hq/Hk = 32/8


OWN = ("feature_capture", "context_kv", "draft_attention", "draft_layer", "masked_block", "proposal_head")


def test_all_dflash_path_vectors_fit_the_budget():
    # inputs are most of a vector; all six Ops together <= 6 MB, generated in well under 30 s
    start, total = time.perf_counter(), 0
    for op in OWN:
        generated = importlib.import_module(f"conformance.cases.{op}").generate()
        assert 10 <= len(generated) <= 60, op
        total += sum(np.asarray(v).nbytes for c in generated for v in c.inputs.values())
    assert total <= 6 * 2**20
    assert time.perf_counter() - start < 10
