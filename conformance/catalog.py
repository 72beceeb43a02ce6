"""Implementations (CONTRACTS C9) that each carry one bug from PITFALLS.md.

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
from reference.candidate_selector import candidate_selector
from reference.candidate_topk import _transform, candidate_topk
from reference.context_kv import chunk_rows, paged_rows, ring_slots
from reference.draft_attention import attend, draft_attention
from reference.draft_layer import draft_layer, forward
from reference.feature_capture import feature_capture
from reference.grouped_conv import GROUP, project_delta
from reference.masked_block import CONV_WEIGHTS, LAYER_WEIGHTS, block_tokens, masked_block
from reference.norms import plain_head_rmsnorm, plain_rmsnorm, rope_1d
from reference.precision import inter, represent, work
from reference.preview_commit import preview_commit
from reference.proposal_head import proposal_head
from reference.rng import Purpose, exponential_race, uniform
from reference.speculative_accept import speculative_accept
from reference.target_distribution import add_to_history, argmax_with_gap, filtered_probs, penalized_logits


class Mutant(Float32Baseline):
    """The float32 baseline with a bug in the method named ``op``.

    ``pitfall`` is the PITFALLS.md name that the suite's case ids carry; ``variant``
    tells two mutants of one pitfall apart (empty for the main one). A mutant that
    reimplements its Op keeps the bug in ``BUG`` (keyword switches, off when absent),
    so ``control()`` is the same code with the bug switched off: it must conform, or
    a FAIL could come from the reimplementation rather than from the bug.
    """

    op = ""
    pitfall = ""
    variant = ""
    BUG: ClassVar[dict | None] = None  # None: the mutant calls the reference on manipulated inputs
    # what the suite must say on a case naming the pitfall: "fail"; or "precision" for a spec
    # deviation whose error is the size of a legitimate rounding (C2 v2): ACCEPTABLE(precision)
    # there, never PASS, so that --strict fails it
    expect = "fail"

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

    def _baseline(self, fn, **kwargs) -> dict[str, np.ndarray]:
        """``fn`` run as the baseline runs the reference: its precision policy, storage dtypes."""
        spec = registry.get(self.op)
        with precision.baseline(spec.bf16_intermediates):
            return storage_outputs(spec, fn(**kwargs))


# --- draft attention and the layers built on it ------------------------------------------------


class WindowLeS(Mutant):
    """Local window tested as |p_k - p_q| <= S: one key more on each side than < S."""

    op, pitfall = "draft_attention", "window_le_S"

    def draft_attention(self, window, **kw):
        w = int(window)
        return self._baseline(draft_attention, window=w + 1 if w > 0 else 0, **kw)


class WindowLeSLayer(Mutant):
    """The same window bug inside a draft layer."""

    op, pitfall, variant = "draft_layer", "window_le_S", "draft_layer"

    def draft_layer(self, window, **kw):
        w = int(window)
        return self._baseline(draft_layer, window=w + 1 if w > 0 else 0, **kw)


class WindowLeSBlock(Mutant):
    """The same window bug in every local layer of the masked block."""

    op, pitfall, variant = "masked_block", "window_le_S", "masked_block"

    def masked_block(self, windows, **kw):
        return self._baseline(masked_block, windows=[int(w) + 1 if int(w) > 0 else 0 for w in windows], **kw)


def _causal(columns: int, run, live) -> np.ndarray:
    # Query column i of a causal kernel sees block rows j <= i: exactly the non-causal
    # Op with the live extent cut to i + 1, read at column i. Context keys all precede
    # the block, so causality removes none of them.
    live = np.asarray(live)
    return np.stack([run(np.minimum(live, i + 1).astype(live.dtype))[:, i] for i in range(columns)], axis=1)


class CausalDraftAttention(Mutant):
    """Block rows masked causally (a config that omits is_causal resolved to causal)."""

    op, pitfall = "draft_attention", "causal_draft_attention"

    def draft_attention(self, q, live, **kw):
        return {"out": _causal(q.shape[1], lambda lv: self._baseline(draft_attention, q=q, live=lv, **kw)["out"], live)}


class CausalDraftLayer(Mutant):
    """draft_layer whose attention is causal over the block rows."""

    op, pitfall, variant = "draft_layer", "causal_draft_attention", "draft_layer"

    def draft_layer(self, x, live, **kw):
        return {"x_next": _causal(x.shape[1], lambda lv: self._baseline(draft_layer, x=x, live=lv, **kw)["x_next"],
                                  live)}


# --- target features and context K/V ------------------------------------------------------------


class BoundaryIndex(Mutant):
    """Target layer id l read one entry late (block l + 1): hidden-state boundaries
    (embedding at 0) mixed up with block ids."""

    op, pitfall = "feature_capture", "boundary_index"

    def feature_capture(self, block_outputs, target_layer_ids, **kw):
        # the engine's list ends with the last block: an id past it reads that block
        last = block_outputs.shape[0] - 1
        ids = [min(int(i) + 1, last) for i in target_layer_ids]
        return self._baseline(feature_capture, block_outputs=block_outputs, target_layer_ids=ids, **kw)


class LastBlockFinalNorm(Mutant):
    """The last block's output taken from Hugging Face hidden_states[-1], which holds
    norm(block output). The target's final norm weight is not an input of the Op, so a
    unit weight stands in for it (the bug is the normalization, not the weight)."""

    op, pitfall = "feature_capture", "last_block_final_norm"

    def feature_capture(self, block_outputs, eps, **kw):
        r = np.asarray(block_outputs, np.float64).copy()
        r[-1] = plain_rmsnorm(r[-1], np.ones(r.shape[-1]), 1e-6)
        return self._baseline(feature_capture, block_outputs=numerics.storage(r, "bf16"), eps=eps, **kw)


def _fp32_rope(x, positions, theta):
    """RoPE with angles formed in FP32 from FP32 positions (exact only below 2^24)."""
    d = x.shape[-1]
    inv = np.float32(theta) ** (-np.arange(d // 2, dtype=np.float32) * np.float32(2.0 / d))
    ang = (np.asarray(positions).astype(np.float32)[..., None] * inv)[..., None, :]
    cos, sin = np.cos(ang.astype(np.float64)).astype(x.dtype), np.sin(ang.astype(np.float64)).astype(x.dtype)
    lo, hi = x[..., : d // 2], x[..., d // 2:]
    return np.concatenate([lo * cos - hi * sin, hi * cos + lo * sin], axis=-1)


def _context_kv(context, k_cache, v_cache, wk, wv, k_norm, start, eps, theta, head_dim, storage, page_size=None,
                page_table=None, *, k_raw_bf16=False, v_via_bf16=True, ring_shift=0, fp32_positions=False):
    """context_kv written out with its representation and slot choices as switches."""
    c = work(context)
    start, rows = int(start), c.shape[0]
    positions = start + np.arange(rows, dtype=np.int64)
    k_raw = (c @ work(wk).T).reshape(rows, -1, int(head_dim))
    if k_raw_bf16:  # the projection GEMM writes its output in the model dtype before the norm
        k_raw = represent(k_raw, "bf16")
    rope = _fp32_rope if fp32_positions else rope_1d
    k = represent(rope(plain_head_rmsnorm(k_raw, k_norm, eps, int(head_dim)), positions, theta), "bf16")
    v_raw = (c @ work(wv).T).reshape(k.shape)
    v = represent(represent(v_raw, "bf16") if v_via_bf16 else v_raw, "fp16")
    k_out, v_out = work(k_cache).copy(), work(v_cache).copy()
    if storage == "ring":
        keep = chunk_rows(rows, k_out.shape[0])
        slots = ring_slots(positions[keep] + ring_shift, k_out.shape[0])
        k_out[slots], v_out[slots] = k[keep], v[keep]
    else:
        page, row = paged_rows(positions, page_table, int(page_size))
        k_out[page, row], v_out[page, row] = k, v
    return {"k_cache": k_out, "v_cache": v_out, "frontier": np.asarray(start + rows, dtype=np.int64)}


class RingSlot(Mutant):
    """Ring slot (p + 1) mod C: the write lands one slot past where readers look."""

    op, pitfall = "context_kv", "ring_slot"

    BUG: ClassVar[dict] = {"ring_shift": 1}

    def context_kv(self, **kw):
        return self._baseline(_context_kv, **self.bug, **kw)


class KBf16BeforeNorm(Mutant):
    """Raw context K rounded to BF16 between projection and head norm. C1 forbids it, but the
    head norm is scale-invariant, so the error is one BF16 rounding of the normalized K: the
    size of the legitimate rounding of the norm's output before RoPE (C2 v2). The suite flags
    it ACCEPTABLE(precision) at its cases, which --strict fails; no envelope can FAIL it
    without failing that legitimate engine."""

    op, pitfall = "context_kv", "k_bf16_before_norm"
    expect = "precision"

    BUG: ClassVar[dict] = {"k_raw_bf16": True}

    def context_kv(self, **kw):
        return self._baseline(_context_kv, **self.bug, **kw)


class Fp32Positions(Mutant):
    """RoPE angles from FP32 positions (the HF/vLLM habit): positions above 2^24 lose bits."""

    op, pitfall = "context_kv", "positions_2p31"

    BUG: ClassVar[dict] = {"fp32_positions": True}

    def context_kv(self, **kw):
        return self._baseline(_context_kv, **self.bug, **kw)


class Fp32Positions2p32(Fp32Positions):
    op, pitfall, variant = "context_kv", "positions_2p32", "fp32_positions"


def _truncate_bf16(x) -> np.ndarray:
    """Round to BF16 by dropping the low 16 bits of the FP32 value (toward zero)."""
    bits = np.asarray(x, np.float32).view(np.uint32) & np.uint32(0xFFFF0000)
    return numerics.storage(bits.view(np.float32).astype(np.float64), "bf16")


class Bf16TruncationAttention(Mutant):
    """The attention output stored BF16 by truncation instead of round-to-nearest-even."""

    op, pitfall = "draft_attention", "bf16_truncation"

    def draft_attention(self, q, k, v, k_cache, v_cache, frontier, live, window):
        with precision.baseline(registry.get(self.op).bf16_intermediates):
            out = attend(q, k, v, k_cache, v_cache, frontier, live, int(window))
        return {"out": _truncate_bf16(out)}


class Bf16TruncationFeatures(Mutant):
    """The context features stored BF16 by truncation."""

    op, pitfall, variant = "feature_capture", "bf16_truncation", "feature_capture"

    def feature_capture(self, block_outputs, fc_weight, hidden_norm, target_layer_ids, eps):
        with precision.baseline(registry.get(self.op).bf16_intermediates):
            r = work(block_outputs)
            s = np.concatenate([r[int(i)] for i in target_layer_ids], axis=-1)
            out = plain_rmsnorm(inter(precision.matmul(s, work(fc_weight).T), "projected"), hidden_norm, eps)
        return {"context": _truncate_bf16(out)}


class VFp16WithoutBf16(Mutant):
    """Context V rounded straight to FP16, skipping the BF16 step of FP16_RNE(BF16(v))."""

    op, pitfall = "context_kv", "v_fp16_without_bf16"

    BUG: ClassVar[dict] = {"v_via_bf16": False}

    def context_kv(self, **kw):
        return self._baseline(_context_kv, **self.bug, **kw)


# --- DFlash2 grouped convolution ----------------------------------------------------------------


def _conv(x, base_side, delta_side, *, wrap=False, per_channel=False, separate=False):
    """x [B,W,H]; base_side [2 taps, H]; delta_side [B,W,2 taps,G], float64, with the bugs as switches."""
    b, w, h = x.shape
    g = h // GROUP
    xg = x.reshape(b, w, g, GROUP)
    if per_channel:  # delta tiled across channels (c -> c mod G) instead of repeated within each group
        d = delta_side[..., np.arange(h) % g].reshape(b, w, 2, g, GROUP)
    else:
        d = np.broadcast_to(delta_side[..., None], (b, w, 2, g, GROUP))
    bs = base_side.reshape(1, 1, 2, g, GROUP)
    # torch.roll-style shift: column 0 reads column W-1 instead of nothing
    prev = np.roll(xg, 1, axis=1) if wrap else np.concatenate([np.zeros_like(xg[:, :1]), xg[:, :-1]], axis=1)
    if separate:  # every product and sum stored in BF16, as eager model-dtype code does
        r = numerics.to_bf16
        tap0 = r(r(bs[:, :, 0] * xg) + r(d[:, :, 0] * xg))
        tap1 = r(r(bs[:, :, 1] * prev) + r(d[:, :, 1] * prev))
        out = tap0 + tap1
    else:
        out = (bs[:, :, 0] + d[:, :, 0]) * xg + (bs[:, :, 1] + d[:, :, 1]) * prev
    return out.reshape(b, w, h)


class _ConvMutant(Mutant):
    op = "grouped_conv"

    def grouped_conv(self, x, z, base, proj):
        x, z, base = (np.asarray(a, np.float64) for a in (x, z, base))
        delta = project_delta(x, proj)
        finish_delta = numerics.to_bf16(delta[:, :, 1])
        out = {
            "prepared": _conv(x, base[0], delta[:, :, 0], **self.bug),
            "finish_delta": finish_delta,
            "finished": _conv(z, base[1], finish_delta, **self.bug),
        }
        return storage_outputs(registry.get(self.op), out)


class ConvCol0Tap(_ConvMutant):
    """Column 0 reads a preceding tap (the last column, by wrap-around)."""

    pitfall = "conv_col0_tap"
    BUG: ClassVar[dict] = {"wrap": True}


class ConvDeltaPerChannel(_ConvMutant):
    """The dynamic delta indexed per channel instead of shared by each group of 16."""

    pitfall = "conv_delta_per_channel"
    BUG: ClassVar[dict] = {"per_channel": True}


class ConvSeparateRounding(_ConvMutant):
    """(base*x) + (delta*x) with each product rounded to BF16, not (base + delta)*x."""

    pitfall = "conv_separate_rounding"
    BUG: ClassVar[dict] = {"separate": True}


# --- DFlash2 candidates and selector ------------------------------------------------------------


class TopkTiesToHighest(Mutant):
    """Top-k ties broken toward the higher head row."""

    op, pitfall = "candidate_topk", "topk_unstable"

    def candidate_topk(self, head, shortlist=None, **kw):
        # the reference's stable order on the rows reversed is "ties to the highest row" on the originals
        gid = np.arange(head.shape[0], dtype=np.int32) if shortlist is None else np.asarray(shortlist)
        return self._baseline(candidate_topk, head=head[::-1], shortlist=gid[::-1].copy(), **kw)


class TopkSoftcapBeforeSelection(Mutant):
    """Multiplier and softcap applied in BF16 before the top-k: saturated scores tie and
    the ties then go by row, not by the raw logits."""

    op, pitfall, variant = "candidate_topk", "topk_unstable", "softcap_before_selection"

    BUG: ClassVar[dict] = {"select_on_bf16_transform": True}

    def candidate_topk(self, hidden, head, vocab_size, top_k, output_multiplier=0.0, softcap=0.0, shortlist=None):
        with precision.baseline():
            z = work(hidden) @ work(head).T
            gid = np.arange(head.shape[0]) if shortlist is None else np.asarray(shortlist, np.int64)
            if self.bug.get("select_on_bf16_transform"):  # ranked by the scores as the model dtype holds them
                z_sel = numerics.to_bf16(_transform(z, output_multiplier, softcap))
            else:
                z_sel = z
            key = np.where((gid >= 0) & (gid < vocab_size), -z_sel, np.inf)
            rows = np.argsort(key, axis=-1, kind="stable")[..., :top_k]
            scores = _transform(np.take_along_axis(z, rows, axis=-1), output_multiplier, softcap)
        return {"scores": numerics.storage(scores, "fp32"), "ids": gid[rows].astype(np.int32)}


class SelectorRngBatchRow(Mutant):
    """The proposal draw keyed by the batch row as well as the request's seed."""

    op, pitfall = "candidate_selector", "rng_batch_row"

    def candidate_selector(self, seed, **kw):
        rows = np.arange(seed.shape[0], dtype=np.uint64)
        return self._baseline(candidate_selector, seed=seed ^ rows, **kw)


class SelectorPredecessorRow(Mutant):
    """The walk continues from the argmax of the previous step, not from the rank it sampled."""

    op, pitfall = "candidate_selector", "selector_predecessor_row"

    def candidate_selector(self, temperature, ids, **kw):
        # Build the argmax chain step by step: a greedy run whose predecessors are forced
        # to the chain so far reports, at step i, the argmax from the chain's row.
        greedy = np.zeros_like(temperature)
        chain = np.zeros(ids.shape[:2], dtype=np.int32)
        for i in range(ids.shape[1]):
            chain[:, i] = self._baseline(candidate_selector, temperature=greedy, ids=ids, forced_path=chain,
                                         **kw)["path"][:, i]
        return self._baseline(candidate_selector, temperature=temperature, ids=ids, forced_path=chain, **kw)


# --- verification, preview and the draft block --------------------------------------------------


def _accept_scan(logits, proposals, live_proposals, frontier, seed, prompt_mask, output_counts, vocab_size,
                 q=None, q_ids=None, *, bug=None, **sampling):
    """speculative_accept's scan written out (C3, C5, C6) with one bug switched in by name."""
    B, W, Vr = np.shape(logits)
    tokens = np.full((B, W), -1, dtype=np.int32)
    accepted = np.zeros(B, dtype=np.int32)
    for b in range(B):
        P, F, s = int(live_proposals[b]), int(frontier[b]), np.uint64(seed[b])
        prm = {k: v[b] for k, v in sampling.items()}
        greedy = work(prm["temperature"]) <= 0
        counts = np.array(output_counts[b], copy=True)

        def z_of(i, counts=counts, b=b, prm=prm):
            return penalized_logits(logits[b, i], prompt_mask[b], counts, vocab_size, prm["repetition_penalty"],
                                    prm["frequency_penalty"], prm["presence_penalty"])

        def p_of(z, prm=prm):
            return filtered_probs(z, prm["temperature"], prm["top_k"], prm["top_p"], prm["min_p"])

        out = []
        for i in range(P):
            z, d = z_of(i, counts), int(proposals[b, i])
            if greedy:
                top = argmax_with_gap(z)[0]
                if top != d:
                    out.append(top)
                    break
            else:
                p = p_of(z)
                qv = np.zeros(Vr, dtype=p.dtype)
                if q is None:
                    qv[d] = 1
                else:
                    np.add.at(qv, np.asarray(q_ids[b, i], dtype=np.int64), work(q[b, i]))
                u = work(uniform(s, F + 1 + i, Purpose.ACCEPT))
                ok = u * p[d] < qv[d] if bug == "accept_p_q_swapped" else u * qv[d] < p[d]
                if not ok:
                    r = p - qv
                    if bug == "residual_no_clamp":
                        # the zero-mass test on the unclamped sum(p - q), which is ~0 for normalized p and q
                        weights = p if abs(float(r.sum())) < 1e-6 else np.maximum(r, 0)
                    else:
                        weights = np.maximum(r, 0) if np.maximum(r, 0).sum() > 0 else p
                    out.append(exponential_race(np.asarray(weights, np.float64), s, F + 1 + i, Purpose.CORRECTION)[0])
                    break
            out.append(d)
            if bug != "history_not_updated":
                counts = add_to_history(counts, [d])
        else:
            # P - 1 is -1 (the last row, K) when P = 0, as Python indexing has it
            z = z_of(P - 1 if bug == "bonus_from_wrong_row" else P, counts)
            out.append(argmax_with_gap(z)[0] if greedy else exponential_race(
                np.asarray(p_of(z), np.float64), s, F + 1 + P, Purpose.BONUS)[0])
        accepted[b] = len(out) - 1
        tokens[b, : len(out)] = out
    return {"accepted": accepted, "tokens": tokens, "num_out": accepted + 1}


class _AcceptMutant(Mutant):
    op = "speculative_accept"

    def __init__(self, bug: dict | None = None):
        super().__init__({"bug": self.pitfall} if bug is None else bug)

    def speculative_accept(self, **kw):
        return self._baseline(_accept_scan, **self.bug, **kw)


class AcceptPQSwapped(_AcceptMutant):
    """Accept iff U p(d) < q(d): p and q swapped in the test."""

    pitfall = "accept_p_q_swapped"


class HistoryNotUpdated(_AcceptMutant):
    """Accepted proposals never join the output history during the scan (penalties see stale counts)."""

    pitfall = "history_not_updated"


class BonusFromWrongRow(_AcceptMutant):
    """The bonus drawn from p_(P-1) instead of p_P."""

    pitfall = "bonus_from_wrong_row"


class ResidualNoClamp(_AcceptMutant):
    """C6's zero-mass test applied to sum(p - q) (always ~0): the correction comes from p."""

    pitfall = "residual_no_clamp"


class AcceptRngBatchRow(Mutant):
    """Accept, correction and bonus draws keyed by the batch row as well as the seed."""

    op, pitfall, variant = "speculative_accept", "rng_batch_row", "speculative_accept"

    def speculative_accept(self, seed, **kw):
        rows = np.arange(seed.shape[0], dtype=np.uint64)
        return self._baseline(speculative_accept, seed=seed ^ rows, **kw)


class PreviewCutBeforeEos(Mutant):
    """The preview ends before the first EOS or stop token instead of after it."""

    op, pitfall = "preview_commit", "preview_cut_before_eos"

    def preview_commit(self, tokens, num_out, budget, cancel, eos_ids, stop_ids, **kw):
        # cutting at j - 1 is the reference's cut with the budget lowered to j - 1
        ends = np.isin(tokens, np.concatenate([np.ravel(eos_ids), np.ravel(stop_ids)]))
        ends &= np.arange(tokens.shape[1]) < np.asarray(num_out)[:, None]
        j = np.where(ends.any(axis=1), np.argmax(ends, axis=1) + 1, tokens.shape[1] + 1)
        cut = np.minimum(np.asarray(budget), j - 1).astype(budget.dtype)
        return self._baseline(preview_commit, tokens=tokens, num_out=num_out, budget=cut, cancel=cancel,
                              eos_ids=eos_ids, stop_ids=stop_ids, **kw)


class MaskTokenStripped(Mutant):
    """Published tokens equal to mask_token_id dropped from the output (and from n)."""

    op, pitfall = "preview_commit", "mask_token_stripped"

    def preview_commit(self, mask_token_id, **kw):
        out = self._baseline(preview_commit, mask_token_id=mask_token_id, **kw)
        published = np.full_like(out["published"], -1)
        n = out["n"].copy()
        for b, row in enumerate(out["published"]):
            kept = [int(t) for t in row[: n[b]] if t != mask_token_id]
            published[b, : len(kept)], n[b] = kept, len(kept)
        return {**out, "published": published, "n": n}


class AnchorAsMask(Mutant):
    """The anchor column embedded as MASK instead of the committed token."""

    op, pitfall = "masked_block", "anchor_as_mask"

    def masked_block(self, anchor, mask_token_id, **kw):
        return self._baseline(masked_block, anchor=np.full_like(anchor, mask_token_id),
                              mask_token_id=mask_token_id, **kw)


def _masked_block(anchor, embed, frontier, live, context_k, context_v, final_norm, mask_token_id, windows, eps, theta,
                  head_dim, variant, num_drafts, *, live_only=False, **weights):
    """masked_block written out; ``live_only``: DFlash2 attends over the live (verifiable) columns only."""
    names = LAYER_WEIGHTS + (CONV_WEIGHTS if variant == "dflash2" else ())
    x = work(embed)[block_tokens(anchor, mask_token_id, int(num_drafts))]
    attn_live = np.asarray(live) if variant == "dflash" or live_only else np.full(x.shape[0], x.shape[1])
    for layer, window in enumerate(windows):
        x = inter(forward(x, context_k[layer], context_v[layer], frontier, attn_live, eps=eps, theta=theta,
                          head_dim=head_dim, window=int(window), variant=variant,
                          **{n: weights[n][layer] for n in names}), "x")
    return {"hidden": represent(plain_rmsnorm(x, final_norm, eps)[:, 1:], "bf16")}


class Dflash2AllColumns(Mutant):
    """DFlash2 computing only the verifiable columns near a request's tail (verify_size =
    min(block_size, ...)): the block's attention sees live rows only, as DFlash's does."""

    op, pitfall = "masked_block", "dflash2_all_columns"

    BUG: ClassVar[dict] = {"live_only": True}

    def masked_block(self, **kw):
        return self._baseline(_masked_block, **self.bug, **kw)


class NextTokenShift(Mutant):
    """Proposals read autoregressively: column i's token from the hidden one column
    earlier (column 0, having no anchor hidden here, from the last column)."""

    op, pitfall = "proposal_head", "next_token_shift"

    def proposal_head(self, hidden, **kw):
        return self._baseline(proposal_head, hidden=np.roll(hidden, 1, axis=1), **kw)


class Bf16Logits(Mutant):
    """Head logits stored BF16 before the argmax (a GEMM writing the model dtype): logits one BF16
    ulp apart tie, and the lowest row wins."""

    op, pitfall = "proposal_head", "bf16_logits"

    def proposal_head(self, hidden, head, vocab_size, shortlist=None):
        logits = numerics.to_bf16(precision.matmul(work(hidden), work(head).T).astype(np.float64))
        ids = np.arange(head.shape[0]) if shortlist is None else np.asarray(shortlist, np.int64)
        eligible = (ids >= 0) & (ids < int(vocab_size))
        best = np.argmax(np.where(eligible, logits, -np.inf), axis=-1)
        return {"tokens": ids[best].astype(np.int32)}


MUTANTS = [
    WindowLeS(),
    WindowLeSLayer(),
    WindowLeSBlock(),
    CausalDraftAttention(),
    CausalDraftLayer(),
    BoundaryIndex(),
    LastBlockFinalNorm(),
    RingSlot(),
    KBf16BeforeNorm(),
    Fp32Positions(),
    Fp32Positions2p32(),
    Bf16TruncationAttention(),
    Bf16TruncationFeatures(),
    VFp16WithoutBf16(),
    ConvCol0Tap(),
    ConvDeltaPerChannel(),
    ConvSeparateRounding(),
    TopkTiesToHighest(),
    TopkSoftcapBeforeSelection(),
    SelectorRngBatchRow(),
    SelectorPredecessorRow(),
    AcceptRngBatchRow(),
    AcceptPQSwapped(),
    HistoryNotUpdated(),
    BonusFromWrongRow(),
    ResidualNoClamp(),
    PreviewCutBeforeEos(),
    MaskTokenStripped(),
    AnchorAsMask(),
    Dflash2AllColumns(),
    NextTokenShift(),
    Bf16Logits(),
]
