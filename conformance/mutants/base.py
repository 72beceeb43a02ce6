"""The mutant base class and the helpers several Ops' mutants share.

Every mutant is the float32 baseline with one Op method overridden: it computes the
Op the way a production implementation with that bug would, in the baseline's
precision, so that the only thing separating it from a conforming implementation
is the bug. Where the bug is exactly "the right computation on the wrong inputs"
(a window one wider, the anchor replaced by MASK, a seed mixed with the batch row)
the mutant calls the reference on those inputs; otherwise it reimplements the Op
from the reference's building blocks with the bug written in. Nothing global is
patched, so a mutant cannot leak into the baseline it is compared with.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from conformance import registry
from conformance.baseline import Float32Baseline, storage_outputs
from reference import numerics, precision


class Mutant(Float32Baseline):
    """The float32 baseline with a bug in the method named ``op``.

    ``pitfall`` is the docs/pitfalls.md name that the suite's case ids carry; ``variant``
    tells two mutants of one pitfall apart (empty for the main one). A mutant that
    reimplements its Op keeps the bug in ``BUG`` (keyword switches, off when absent),
    so ``control()`` is the same code with the bug switched off: it must conform, or
    a FAIL could come from the reimplementation rather than from the bug.
    """

    op = ""
    pitfall = ""
    variant = ""
    # the mechanism's family (docs/pitfalls.md, "Families"): mutants that share a mechanism and differ
    # in its details (an off-by-one either way, another word of the same key) carry one family key, so
    # an engine whose bug is a variant the catalog lacks can still be told which family it looks like
    family = ""
    BUG: ClassVar[dict | None] = None  # None: the mutant calls the reference on manipulated inputs
    # what the suite must say on a case naming the pitfall: "fail"; or "precision" for a spec
    # deviation whose error is the size of a legitimate rounding (C2 v2): ACCEPTABLE(precision)
    # there, never PASS, so that --strict fails it
    expect = "fail"
    # further case flags this mutant answers for (a case flagged with one of them must FAIL it)
    also: ClassVar[tuple] = ()

    def __init__(self, bug: dict | None = None):
        super().__init__()
        self.bug = self.BUG if bug is None else bug

    def control(self) -> Mutant | None:
        return None if self.bug is None else type(self)(bug={})

    @property
    def key(self) -> str:
        return f"{self.pitfall}-{self.variant}" if self.variant else self.pitfall

    @property
    def name(self) -> str:
        return f"mutant {self.key} ({self.op})"

    @property
    def row(self) -> str:
        """The pitfall catalog's row that this mutant's pitfall stands for (``ROWS``)."""
        return ROWS.get(self.pitfall, "")

    def _baseline(self, fn, **kwargs) -> dict[str, np.ndarray]:
        """``fn`` run as the baseline runs the reference: its precision policy, storage dtypes."""
        spec = registry.get(self.op)
        with precision.baseline(spec.bf16_intermediates):
            return storage_outputs(spec, fn(**kwargs))


def _causal(columns: int, run, live) -> np.ndarray:
    # Query column i of a causal kernel sees block rows j <= i: exactly the non-causal
    # Op with the live extent cut to i + 1, read at column i. Context keys all precede
    # the block, so causality removes none of them.
    live = np.asarray(live)
    return np.stack([run(np.minimum(live, i + 1).astype(live.dtype))[:, i] for i in range(columns)], axis=1)


def _split_of_interleaved(d: int) -> np.ndarray:
    """perm with x[perm] in split-half order for interleaved pairs: (2i, 2i+1) -> (i, i + D/2)."""
    return np.concatenate([np.arange(0, d, 2), np.arange(1, d, 2)])


def _truncate_bf16(x) -> np.ndarray:
    """Round to BF16 by dropping the low 16 bits of the FP32 value (toward zero)."""
    bits = np.asarray(x, np.float32).view(np.uint32) & np.uint32(0xFFFF0000)
    return numerics.storage(bits.view(np.float32).astype(np.float64), "bf16")


M32 = 0xFFFFFFFF


def _swap_words(seed) -> np.ndarray:
    """The seed with its 32-bit words swapped: key (seed >> 32, seed & 0xffffffff) read the wrong way."""
    s = np.asarray(seed, dtype=np.uint64)
    return ((s & np.uint64(M32)) << np.uint64(32)) | (s >> np.uint64(32))


def _int32(x) -> np.ndarray:
    """Positions held in a signed 32-bit integer (wrap at 2^31)."""
    x = np.asarray(x, dtype=np.int64)
    return ((x + 2**31) % 2**32 - 2**31).astype(np.int64)


def _unwrapped_ring(cache, frontier) -> np.ndarray:
    """A ring [B, C, ...] re-laid so that reading slot p mod C gives what a reader without mod C
    gets: position p from slot p - max(0, F - C) (the live interval read as if it started at slot 0)."""
    cache = np.asarray(cache)
    out = cache.copy()
    cap = cache.shape[1]
    for b, f in enumerate(np.asarray(frontier, dtype=np.int64)):
        lo = max(0, int(f) - cap)
        p = np.arange(lo, int(f))
        out[b, p % cap] = cache[b, p - lo]
    return out


def _gqa_perm(hq: int, hk: int) -> np.ndarray:
    """Query heads reordered so that the spec's blocked map (h // (Hq/Hk)) becomes the interleaved one
    (h % Hk): new head h' = (h % Hk) * g + h // Hk holds old head h."""
    g = hq // hk
    h = np.arange(hq)
    return (h % hk) * g + h // hk


def _reorder_heads(w, perm, d, axis):
    """Rows (axis -2) or columns (axis -1) of a [.., Hq*D, ..] weight regrouped by head: new head perm[h] = old h."""
    w = np.asarray(w)
    n = len(perm)
    idx = np.empty(n * d, dtype=np.int64)
    for h in range(n):
        idx[perm[h] * d:(perm[h] + 1) * d] = np.arange(h * d, (h + 1) * d)
    return np.take(w, idx, axis=axis)


def _rope_dims(w, perm, d):
    """Per-head rows of a [.., heads*D, H] projection permuted within each head (dim perm)."""
    w = np.asarray(w)
    n = w.shape[-2] // d
    idx = np.concatenate([h * d + perm for h in range(n)])
    return np.take(w, idx, axis=-2)


class _ArgsMutant(Mutant):
    """A mutant that runs the reference on manipulated keyword arguments: ``change(kw) -> kw``."""

    fn = None

    def change(self, kw):
        return kw

    def __getattr__(self, op):
        if op == type(self).op:
            def method(**kw):
                return self._baseline(type(self).fn, **self.change(dict(kw)))

            method.__name__ = op
            return method
        return super().__getattr__(op)


def _layer_rope_interleaved(kw, lead=False):
    d = int(kw["head_dim"])
    perm = _split_of_interleaved(d)
    kw = dict(kw)
    for w in ("wq", "wk"):
        kw[w] = _rope_dims(kw[w], perm, d)
    for n in ("q_norm", "k_norm"):
        kw[n] = np.take(np.asarray(kw[n]), perm, axis=-1)
    ck = "context_k" if lead else "k_cache"
    kw[ck] = np.take(np.asarray(kw[ck]), perm, axis=-1)
    return kw


def _layer_gqa(kw, hk_axis=-2):
    d = int(kw["head_dim"])
    hq = np.shape(kw["wq"])[-2] // d
    hk = np.shape(kw["wk"])[-2] // d
    perm = _gqa_perm(hq, hk)
    return {**kw, "wq": _reorder_heads(kw["wq"], perm, d, -2), "wo": _reorder_heads(kw["wo"], perm, d, -1)}


# The pitfall catalog's row each pitfall stands for (docs/pitfalls.md; "v1" its first table,
# "v2" its table of more bugs that shipped, "flag" a case flag of the suite with its own bug).
ROWS = {
    "boundary_index": "v1: target features read at hidden-state boundary l instead of block id l (vLLM PR #40727)",
    "last_block_final_norm": "v1: the last captured block taken after the final norm (HF hidden_states[-1])",
    "anchor_as_mask": "v1: anchor slot filled with MASK instead of the committed token (hipfire PR #483)",
    "causal_draft_attention": "v1: sliding layers silently causal when a config omits is_causal (z-lab model.py); "
                              "v2: causal mode chosen for a non-causal windowed layer (vllm-ascend PR #15151)",
    "dflash2_all_columns": "v1: DFlash2 computing only the verifiable columns near a request's tail (z-lab)",
    "next_token_shift": "v1: proposals read autoregressively (column i from the hidden one column earlier)",
    "topk_unstable": "v1: unsorted top-k and first-maximum argmax (ties not broken by rank; z-lab topk(sorted=False))",
    "bf16_tie": "v1: softcap and multiplier applied before selection in bf16 (creates ties that reorder the top-k)",
    "conv_col0_tap": "v1/v2: conv indexed in the wrong memory order (column 0 reads a preceding tap)",
    "conv_delta_per_channel": "v2: conv indexed in the wrong memory order: delta per channel, not per group "
                              "(ninfer-windows PR #4)",
    "k_bf16_before_norm": "v1: K rounded to bf16 before its head norm (z-lab caches in model dtype)",
    "v_fp16_without_bf16": "v1: V stored straight to FP16 instead of FP16_RNE(BF16(v))",
    "penalties_missing": "v1: no penalties in the target distribution (z-lab); v2: repetition penalty ignored in "
                         "verification (sglang #28180)",
    "min_p_missing": "v1: no min-p in the target distribution (z-lab model.py)",
    "vocab_padding": "v1: no public-vocabulary mask; v2: padded vocabulary rows sampleable (Mference PR #30, "
                     "lmdeploy PR #3661)",
    "rng_batch_row": "v1: random draws depend on batch composition (z-lab multinomial/rand_like)",
    "mask_token_stripped": "v1: output tokens equal to mask_token_id stripped (z-lab PR #76)",
    "preview_cut_before_eos": "v1/C6: preview cut before the first EOS/stop token instead of after it",
    "accept_p_q_swapped": "v1/C3: accept test with p and q swapped",
    "history_not_updated": "v1/C5: accepted proposals never join the output history during the scan",
    "bonus_from_wrong_row": "v1/C6: the bonus drawn from p_(P-1) instead of p_P",
    "residual_no_clamp": "v1/C6: the zero-mass test applied to the unclamped residual sum(p - q)",
    "residual_sum_zero": "C6: a zero-mass residual normalized by its sum (0/0): NaN weights, id 0",
    "window_le_S": "v2: window inclusivity off by one, a window of S covering S+1 keys (vLLM #3385)",
    "mask_boundary": "v2: window inclusivity off by one the other way (the key at distance S-1 dropped)",
    "ring_slot": "v1/C7: ring slot (p + 1) mod C",
    "ring_wrap": "C7: the context ring read or written without mod C",
    "chunk_longer_than_S": "C7: a chunk longer than the ring keeps its first C rows, not its last",
    "tail_extent": "v1/C6: rows or proposals past the live extent used (live / live_proposals ignored)",
    "fp16_overflow": "C1: FP16 overflow of V saturated, or 0 * inf = NaN read from a masked key",
    "fp16_subnormal": "C1: FP16 subnormals of V flushed to zero",
    "positions_2p31": "C3/C1: positions held in int32 or FP32 past 2^31",
    "positions_2p32": "C3: the position's high 32-bit word dropped (counter or RoPE)",
    "bf16_truncation": "C1: BF16 stored by truncation instead of round-to-nearest-even",
    "bf16_logits": "C4: head logits stored BF16 before the argmax (near ties collapse)",
    "selector_predecessor_row": "v2: predecessor ids decoded wrongly (ninfer-windows PR #4, 0% acceptance)",
    "selector_branches_swapped": "v2: selector score with branches swapped (ninfer-windows PR #4)",
    "left_only_window": "v2: left-only staircase, window applied on one side only in non-causal mode (vLLM PR #53979)",
    "decode_rows_shared_length": "v2: non-causal block expanded into decode rows sharing one sequence length "
                                 "(sglang PR #35209)",
    "window_dropped": "v2: sliding window silently dropped, full attention (ik_llama.cpp PR #2021; lucebox PR #140; "
                      "sglang PR #34524)",
    "gqa_head_mapping": "GQA head mapping interleaved (h % Hk) instead of blocked (h // (Hq/Hk))",
    "rope_interleaved": "RoPE layout interleaved (GPT-J pairs) instead of split halves (rotate_half)",
    "rope_bf16_table": "v2: RoPE tables built in BF16, positions above 256 not exact (candle PR #3520; sglang "
                       "PR #33117, #29729)",
    "capture_before_layer": "v2: capture taken before each layer, id = num_layers never captured (vLLM #46973)",
    "exact_tie": "C4: ties broken toward the higher index (or the accept test's tie rule)",
    "shortlist_remap": "C4: an indexed head's row number returned instead of its global id",
    "nan_scores": "v2: FP16 overflow to NaN, then top-k over NaN returns ids 0..15 (vLLM #55250)",
    "rng_key": "C3: the seed's key words swapped",
    "engine_wide_seed": "v2: one engine-wide seed instead of per-request seeds (TensorRT-LLM PR #17599)",
    "draft_temperature_ignored": "v2: draft temperature ignored while the target samples (z-lab #74 / PR #77)",
    "coin_le_ratio": "v2: uniform of exactly 0 accepts a token the target gives probability 0, coin <= p/q "
                     "(sglang #35771; vllm-ascend PR #13766)",
    "greedy_ties_last_wins": "v2: greedy ties broken last-wins in the verifier (lattice #280)",
    "same_draw_reused": "v2: the same Philox draw reused for the accept test and the residual sample "
                        "(vllm-ascend PR #16370)",
    "rng_purpose_shared": "v2: draft noise drawn from the verifier's counter range (local-inference-lab/vllm #205)",
    "rng_advanced_p0": "v2: RNG advanced for requests with zero proposals (vllm-ascend #13608)",
    "filters_only_on_bonus": "v2: min-p (and logit bias) applied only to the bonus token, not to verified tokens "
                             "(vLLM #42744)",
    "penalties_last_token_only": "v2: only the last accepted token fed to the penalties each step (sglang PR #33643)",
    "temperature_after_filters": "v2: temperature applied after the filters (sglang-jax PR #1563)",
    "min_p_on_logits": "v2: min-p formula applied to logits (Camelid PR #534)",
    "sibling_residual": "C6: recursive rejection over a node's children without the residual update between "
                        "siblings (each sibling tested against p itself)",
    # the families' further variants (catalog v3): the same mechanisms with other details
    "rmsnorm_formula": "norm family: RMSNorm formula slips (eps outside the sqrt or on the sum, sum for mean, "
                       "weight before the normalization, (1 + w) for w)",
    "rng_seed_low_word": "rng family: the seed held in 32 bits, the key's high word lost",
    "rng_counter": "rng family: a Philox counter field wrong (word order, purpose code, index base, position)",
    "filter_order": "filters family: penalties after the temperature, or top-p before top-k",
    "filter_boundary": "filters family: a top-p or min-p boundary rule strict where C5's is not, the crossing "
                       "token dropped, or top-p as a threshold on value that keeps every token tied with the "
                       "prefix's last (FlashInfer's top_p_renorm_probs)",
    "top_k_keeps_ties": "filters family: top-k as a threshold on value, every token tied with the k-th kept "
                        "(FlashInfer's top_k_renorm_probs)",
    "ring_read_slot": "window family: the context ring read one slot off (p + 1 or p - 1 mod C)",
    "conv_tap_layout": "conv family: the conv's taps exchanged, shifted the other way, or its delta read "
                       "group-major",
    "capture_layer_order": "capture family: captured features concatenated sorted or reversed, not in the "
                           "recorded id order",
    "capture_index_base": "capture family: layer ids read one-based (id 0 wraps to the last block)",
    "vocab_pad_boundary": "vocab_pad family: the public-vocabulary bound off by one either way",
    "selector_first_step": "selector_first family: the walk's first step without the anchor as predecessor, "
                           "without its pair term, or with its branches swapped",
    "store_rounding": "rounding family: a BF16 store rounded half away from zero, or through FP16 first",
    "nan_order": "nan_order family: NaN ranked as -inf, as +inf, between the numbers and -inf, or above "
                 "every number (torch.sort, torch.topk)",
}
