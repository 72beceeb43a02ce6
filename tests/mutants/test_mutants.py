"""Mutation testing of the suite: every planted pitfall must FAIL on a case named after it.

A mutant that passes every case whose id names its pitfall means the golden vectors
do not guard that pitfall (a weak case or a loose bound), not that the mutant is wrong:
the fix belongs in the Op's case generator, never in a weaker assertion here.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest

from conformance.baseline import Float32Baseline
from conformance.compare import Result
from conformance.mutants import MUTANTS, ROUND_MUTANTS
from conformance.runner import run_suite

VECTORS = Path(__file__).parents[2] / "vectors"


@cache
def _results(impl, op: str):
    return tuple(run_suite(impl, VECTORS, ops_pattern=op))


def _table(results) -> str:
    return "\n".join(f"  {r.result.name:<14} {r.case}: {r.detail}" for r in results)


# every pitfall that the generators name in case ids and that has a realistic one-Op bug
PITFALLS = {
    "window_le_S", "boundary_index", "ring_slot", "k_bf16_before_norm", "v_fp16_without_bf16", "conv_col0_tap",
    "conv_delta_per_channel", "topk_unstable", "rng_batch_row", "accept_p_q_swapped",
    "history_not_updated", "bonus_from_wrong_row", "residual_no_clamp", "preview_cut_before_eos",
    "causal_draft_attention", "anchor_as_mask", "next_token_shift", "last_block_final_norm", "dflash2_all_columns",
    "mask_token_stripped", "selector_predecessor_row", "positions_2p31", "positions_2p32", "bf16_truncation",
    "bf16_logits",
    # the second pitfall table and a mutant for every case flag
    "left_only_window", "decode_rows_shared_length", "window_dropped", "mask_boundary", "ring_wrap", "tail_extent",
    "fp16_overflow", "fp16_subnormal", "chunk_longer_than_S", "gqa_head_mapping", "rope_interleaved",
    "rope_bf16_table", "capture_before_layer", "exact_tie", "shortlist_remap", "vocab_padding", "nan_scores",
    "bf16_tie", "rng_key", "engine_wide_seed", "draft_temperature_ignored", "selector_branches_swapped",
    "residual_sum_zero", "coin_le_ratio", "greedy_ties_last_wins", "same_draw_reused", "rng_purpose_shared",
    "rng_advanced_p0", "filters_only_on_bonus", "penalties_last_token_only", "temperature_after_filters",
    "min_p_on_logits", "penalties_missing", "min_p_missing",
    # catalog v3: the families' further variants
    "rmsnorm_formula", "rng_seed_low_word", "rng_counter", "filter_order", "filter_boundary", "ring_read_slot",
    "conv_tap_layout", "capture_layer_order", "capture_index_base", "vocab_pad_boundary", "selector_first_step",
    "store_rounding", "nan_order",
    # FlashInfer's threshold filters (top-p's is a filter_boundary variant)
    "top_k_keeps_ties",
}


# The catalog's order, as it was when the catalog was one module: diagnosis breaks ties by it and the
# reports list mutants in it, so the per-Op modules must assemble MUTANTS in exactly this order (a new
# mutant goes at the end, here and in conformance/mutants/__init__.py). conv_separate_rounding left the
# catalog when CONTRACTS C2 v3 made its form legitimate (a control now, conformance/controls/variants.py).
ORDER = [
    "window_le_S", "window_le_S-draft_layer", "window_le_S-masked_block", "causal_draft_attention",
    "causal_draft_attention-draft_layer", "boundary_index", "last_block_final_norm", "ring_slot",
    "k_bf16_before_norm", "positions_2p31", "positions_2p32-fp32_positions", "bf16_truncation",
    "bf16_truncation-feature_capture", "v_fp16_without_bf16", "conv_col0_tap", "conv_delta_per_channel",
    "topk_unstable", "bf16_tie", "rng_batch_row", "selector_predecessor_row",
    "rng_batch_row-speculative_accept", "accept_p_q_swapped", "history_not_updated", "bonus_from_wrong_row",
    "residual_no_clamp", "preview_cut_before_eos", "mask_token_stripped", "anchor_as_mask",
    "dflash2_all_columns", "next_token_shift", "bf16_logits", "left_only_window", "decode_rows_shared_length",
    "window_dropped", "mask_boundary", "ring_wrap", "tail_extent", "positions_2p31-draft_attention",
    "fp16_overflow", "gqa_head_mapping", "mask_boundary-draft_layer", "ring_wrap-draft_layer",
    "tail_extent-draft_layer", "positions_2p31-draft_layer", "rope_interleaved-draft_layer",
    "gqa_head_mapping-draft_layer", "mask_boundary-masked_block", "ring_wrap-masked_block",
    "tail_extent-masked_block", "positions_2p32-masked_block", "rope_interleaved-masked_block",
    "gqa_head_mapping-masked_block", "ring_wrap-context_kv", "chunk_longer_than_S", "fp16_overflow-context_kv",
    "fp16_subnormal", "rope_interleaved", "rope_bf16_table", "capture_before_layer", "exact_tie",
    "shortlist_remap", "vocab_padding", "shortlist_remap-candidate_topk", "vocab_padding-candidate_topk",
    "nan_scores", "rng_key", "engine_wide_seed", "draft_temperature_ignored", "selector_branches_swapped",
    "positions_2p32", "exact_tie-candidate_selector", "rng_key-speculative_accept",
    "engine_wide_seed-speculative_accept", "vocab_padding-speculative_accept", "tail_extent-speculative_accept",
    "positions_2p32-speculative_accept", "residual_sum_zero", "coin_le_ratio", "greedy_ties_last_wins",
    "same_draw_reused", "rng_purpose_shared", "rng_advanced_p0", "filters_only_on_bonus",
    "penalties_last_token_only", "rng_key-tree_verify", "rng_batch_row-tree_verify",
    "positions_2p32-tree_verify", "sibling_residual", "temperature_after_filters", "min_p_on_logits",
    "penalties_missing", "min_p_missing", "vocab_padding-target_distribution", "exact_tie-target_distribution",
    # catalog v3: further variants of the families
    "rmsnorm_formula-eps_outside_sqrt", "rmsnorm_formula-eps_on_sum", "rmsnorm_formula-sum_of_squares", "rmsnorm_formula-weight_before",
    "rmsnorm_formula-one_plus_weight", "rng_seed_low_word", "rng_counter-words_swapped", "rng_counter-purpose_from_zero",
    "rng_counter-index_base1", "rng_counter-position_minus1", "filter_order-penalties_after_temperature", "filter_order-top_p_before_top_k",
    "filter_boundary-top_p_strict", "filter_boundary-top_p_drops_crossing", "filter_boundary-min_p_strict", "ring_slot-minus_one",
    "ring_read_slot-plus_one", "ring_read_slot-minus_one", "conv_tap_layout-tap_order", "conv_tap_layout-shift_next",
    "conv_tap_layout-group_major", "capture_layer_order-sorted", "capture_layer_order-reversed", "capture_index_base",
    "vocab_pad_boundary-plus_one", "vocab_pad_boundary-minus_one", "selector_first_step-pred_top1", "selector_first_step-no_pair",
    "selector_first_step-branches_swapped", "store_rounding-half_away", "store_rounding-via_fp16", "nan_order-as_neg_inf",
    "nan_order-as_pos_inf", "nan_order-before_neg_inf", "nan_order-greatest",
    # second forms of families that had one: the same misalignment or cut the other way
    "next_token_shift-forward", "preview_cut_before_eos-one_after",
    # FlashInfer's filters: top-k and top-p as thresholds on value (ties at the boundary all kept)
    "top_k_keeps_ties", "filter_boundary-top_p_keeps_ties",
]
ROUND_ORDER = [
    "context_role_weights", "layer_id_origin", "capture_before_layer", "draft_temperature",
    "first_draft_unverified", "rng_zero_proposal"
]


def test_the_catalog_keeps_its_order():
    assert [m.key for m in MUTANTS] == ORDER
    assert [m.key for m in ROUND_MUTANTS] == ROUND_ORDER


def test_every_pitfall_has_a_mutant_and_keys_are_unique():
    keys = [m.key for m in MUTANTS]
    assert len(keys) == len(set(keys))
    assert all(m.key.split("-")[0] == m.pitfall for m in MUTANTS)
    assert all(m.row for m in MUTANTS), [m.key for m in MUTANTS if not m.row]
    assert PITFALLS - {m.pitfall for m in MUTANTS} == set()


_BASELINE = Float32Baseline()


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.key)
def test_suite_fails_the_mutant_on_its_pitfall_case(mutant):
    # the FAIL must be the bug's: the unmutated baseline fails nothing in the same selection
    clean = _results(_BASELINE, mutant.op)
    assert not [r for r in clean if r.result.failed], f"the float32 baseline fails {mutant.op}:\n{_table(clean)}"
    results = _results(mutant, mutant.op)
    # a case names the bug by its id or by its flags
    named = [r for r in results if mutant.pitfall in r.case or mutant.pitfall in r.flags]
    assert named, f"no {mutant.op} case id or flag names {mutant.pitfall}"
    if mutant.expect == "precision":  # flagged at every named case, never passed (see Mutant.expect)
        passed = [r.case for r in named if r.result == Result.PASS]
        flagged = [r.case for r in named if r.result == Result.ACCEPTABLE and "precision" in r.acceptable_flags]
        assert not passed and flagged, f"{mutant.name} is not flagged on its cases:\n{_table(named)}"
        return
    failing = [r.case for r in named if r.result == Result.FAIL]
    assert failing, f"{mutant.name} passes every case naming its pitfall:\n{_table(named)}"
    print(f"{mutant.key} -> {mutant.op}: FAIL on {', '.join(failing)}")


@pytest.mark.parametrize("mutant", [m for m in MUTANTS if m.control() is not None], ids=lambda m: m.key)
def test_reimplementation_with_the_bug_off_conforms(mutant):
    """A reimplemented mutant FAILs because of its bug: the same code without it passes everything."""
    results = _results(mutant.control(), mutant.op)
    bad = [r for r in results if r.result.failed]
    assert not bad, f"{mutant.name} without its bug still fails:\n{_table(bad)}"
