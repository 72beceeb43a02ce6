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


def _rope_interleaved(x, positions, theta):
    """GPT-J RoPE: pairs (2i, 2i+1) rotated by angle i, instead of the spec's split halves (i, i + D/2)."""
    x = work(x)
    d = x.shape[-1]
    perm = _split_of_interleaved(d)
    y = rope_1d(x[..., perm], positions, theta)
    out = np.empty_like(y)
    out[..., perm] = y
    return out


def _split_of_interleaved(d: int) -> np.ndarray:
    """perm with x[perm] in split-half order for interleaved pairs: (2i, 2i+1) -> (i, i + D/2)."""
    return np.concatenate([np.arange(0, d, 2), np.arange(1, d, 2)])


def _context_kv(context, k_cache, v_cache, wk, wv, k_norm, start, eps, theta, head_dim, storage, page_size=None,
                page_table=None, *, k_raw_bf16=False, v_via_bf16=True, ring_shift=0, fp32_positions=False,
                rope_interleaved=False, bf16_positions=False, no_wrap=False, first_rows=False, v_saturate=False,
                v_ftz=False):
    """context_kv written out with its representation and slot choices as switches."""
    c = work(context)
    start, rows = int(start), c.shape[0]
    positions = start + np.arange(rows, dtype=np.int64)
    k_raw = (c @ work(wk).T).reshape(rows, -1, int(head_dim))
    if k_raw_bf16:  # the projection GEMM writes its output in the model dtype before the norm
        k_raw = represent(k_raw, "bf16")
    rope = _fp32_rope if fp32_positions else (_rope_interleaved if rope_interleaved else rope_1d)
    rope_pos = numerics.to_bf16(positions.astype(np.float64)) if bf16_positions else positions
    k = represent(rope(plain_head_rmsnorm(k_raw, k_norm, eps, int(head_dim)), rope_pos, theta), "bf16")
    v_raw = (c @ work(wv).T).reshape(k.shape)
    v = represent(represent(v_raw, "bf16") if v_via_bf16 else v_raw, "fp16")
    if v_saturate:  # a saturating FP16 cast: overflow to +-65504 instead of +-inf
        v = np.clip(v, -65504.0, 65504.0)
    if v_ftz:  # FP16 subnormals flushed to zero
        v = np.where(np.abs(v) < 2.0**-14, np.copysign(0.0, v), v)
    k_out, v_out = work(k_cache).copy(), work(v_cache).copy()
    if storage == "ring":
        cap = k_out.shape[0]
        keep = np.arange(min(rows, cap)) if first_rows else chunk_rows(rows, cap)
        slots = ring_slots(positions[keep] + ring_shift, cap)
        if no_wrap:  # written linearly from the chunk's first slot: rows past the ring's end are lost
            lin = positions[keep][0] % cap + np.arange(len(keep)) if len(keep) else np.zeros(0, np.int64)
            keep, slots = keep[lin < cap], slots[lin < cap]
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
    also = ("exact_tie",)

    def candidate_topk(self, head, shortlist=None, **kw):
        # the reference's stable order on the rows reversed is "ties to the highest row" on the originals
        gid = np.arange(head.shape[0], dtype=np.int32) if shortlist is None else np.asarray(shortlist)
        return self._baseline(candidate_topk, head=head[::-1], shortlist=gid[::-1].copy(), **kw)


class TopkSoftcapBeforeSelection(Mutant):
    """Multiplier and softcap applied in BF16 before the top-k: saturated scores tie and
    the ties then go by row, not by the raw logits."""

    op, pitfall = "candidate_topk", "bf16_tie"

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


def _argmax_last(z) -> int:
    """argmax with ties to the highest id (the last-wins bug)."""
    z = np.asarray(z)
    return int(np.flatnonzero(z == z.max())[-1])


def _accept_scan(logits, proposals, live_proposals, frontier, seed, prompt_mask, output_counts, vocab_size,
                 q=None, q_ids=None, *, bug=None, **sampling):
    """speculative_accept's scan written out (C3, C5, C6) with one bug switched in by name."""
    B, W, Vr = np.shape(logits)
    K = W - 1
    tokens = np.full((B, W), -1, dtype=np.int32)
    accepted = np.zeros(B, dtype=np.int32)
    mask32 = 0xFFFFFFFF if bug == "positions_2p32" else -1  # the counter's high position word dropped

    def pos(x):
        return int(x) & mask32 if mask32 > 0 else int(x)

    for b in range(B):
        P, F, s = int(live_proposals[b]), int(frontier[b]), np.uint64(seed[b])
        if bug == "tail_extent":  # every proposal slot scanned, live_proposals ignored
            P = K
        prm = {k: v[b] for k, v in sampling.items()}
        greedy = work(prm["temperature"]) <= 0
        counts0 = np.array(output_counts[b], copy=True)
        counts = counts0

        def z_of(i, counts, b=b, prm=prm):
            return penalized_logits(logits[b, i], prompt_mask[b], counts, vocab_size, prm["repetition_penalty"],
                                    prm["frequency_penalty"], prm["presence_penalty"])

        def p_of(z, prm=prm, verified=False):
            if verified and bug == "filters_only_on_bonus":  # top-k/top-p/min-p only for the bonus token
                return filtered_probs(z, prm["temperature"], 0, 1.0, 0.0)
            return filtered_probs(z, prm["temperature"], prm["top_k"], prm["top_p"], prm["min_p"])

        def top_of(z):
            return _argmax_last(z) if bug == "greedy_ties_last_wins" else argmax_with_gap(z)[0]

        out = []
        for i in range(P):
            z, d = z_of(i, counts), int(proposals[b, i])
            if greedy:
                top = top_of(z)
                if top != d:
                    out.append(top)
                    break
            else:
                p = p_of(z, verified=True)
                qv = np.zeros(Vr, dtype=p.dtype)
                if q is None:
                    qv[d] = 1
                else:
                    np.add.at(qv, np.asarray(q_ids[b, i], dtype=np.int64), work(q[b, i]))
                purpose = Purpose.DFLASH2_PROPOSAL if bug == "rng_purpose_shared" else Purpose.ACCEPT
                u = work(uniform(s, pos(F + 1 + i), purpose))
                if bug == "accept_p_q_swapped":
                    ok = u * p[d] < qv[d]
                elif bug == "coin_le_ratio":  # coin <= p/q: equality (and u q = 0 = p) accepts
                    ok = u * qv[d] <= p[d]
                else:
                    ok = u * qv[d] < p[d]
                if not ok:
                    r = p - qv
                    if bug == "residual_no_clamp":
                        # the zero-mass test on the unclamped sum(p - q), which is ~0 for normalized p and q
                        weights = p if abs(float(r.sum())) < 1e-6 else np.maximum(r, 0)
                    else:
                        weights = np.maximum(r, 0) if np.maximum(r, 0).sum() > 0 else p
                    if bug == "residual_sum_zero" and np.maximum(r, 0).sum() <= 0:
                        out.append(0)  # r / sum(r) = 0/0: NaN weights, and the sampler returns id 0
                        break
                    cpurpose = Purpose.ACCEPT if bug == "same_draw_reused" else Purpose.CORRECTION
                    out.append(exponential_race(np.asarray(weights, np.float64), s, pos(F + 1 + i), cpurpose)[0])
                    break
            out.append(d)
            if bug == "penalties_last_token_only":  # the penalties see only the last accepted token
                counts = add_to_history(counts0, [d])
            elif bug != "history_not_updated":
                counts = add_to_history(counts, [d])
        else:
            # P - 1 is -1 (the last row, K) when P = 0, as Python indexing has it
            z = z_of(P - 1 if bug == "bonus_from_wrong_row" else P, counts)
            at = F + 1 + P + (1 if bug == "rng_advanced_p0" and P == 0 else 0)
            out.append(top_of(z) if greedy else exponential_race(
                np.asarray(p_of(z), np.float64), s, pos(at), Purpose.BONUS)[0])
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



# --- catalog v2 and one mutant per case flag (issue 10) ------------------------------------------

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


# draft attention

def _attend_with(q, k, v, k_cache, v_cache, frontier, live, window: int, kind: str) -> np.ndarray:
    """reference.draft_attention.attend with one of the shipped mask bugs."""
    from reference import precision as Pm
    from reference.draft_attention import key_positions

    q, k, v = work(q), work(k), work(v)
    b, w, hq, d = q.shape
    hk = k.shape[2]
    keys = np.repeat(np.concatenate([work(k_cache), k], axis=1), hq // hk, axis=2)
    vals = np.repeat(np.concatenate([work(v_cache), v], axis=1), hq // hk, axis=2)
    pos, present = key_positions(frontier, live, k_cache.shape[1], w)
    pq = np.asarray(frontier, dtype=np.int64)[:, None] + np.arange(w, dtype=np.int64)
    if kind == "int32":  # positions held in int32: past 2^31 they wrap negative (a context key then is "absent")
        cap = k_cache.shape[1]
        pos, pq = _int32(pos), _int32(pq)
        present = present & np.concatenate([pos[:, :cap] >= 0, np.ones_like(present[:, cap:])], axis=1)
    mask = np.broadcast_to(present[:, None, :], (b, w, pos.shape[1])).copy()
    if window > 0:
        dist = pos[:, None, :] - pq[:, :, None]
        if kind == "left_only":  # the window bounds keys before the query only
            mask &= dist > -window
        elif kind == "shared_length":  # every row windowed from the block's last position
            last = (np.asarray(frontier, dtype=np.int64) + w - 1)[:, None, None]
            mask &= (pos[:, None, :] > last - window) & (np.abs(dist) < window)
        else:
            mask &= np.abs(dist) < window
    mask = mask[:, None]
    s = Pm.einsum("bihd,bkhd->bhik", q, keys) * q.dtype.type(1.0 / np.sqrt(d))
    s = np.where(mask, s, -np.inf)
    m = np.max(s, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    p = np.where(mask, Pm.exp(s - m), 0)
    row_sum = np.sum(p, axis=-1)
    p = inter(p, "probs")
    pv = Pm.einsum("bhik,bkhd->bihd", p, np.where(np.isfinite(vals), vals, 0))
    denom = np.transpose(row_sum, (0, 2, 1))[..., None]
    return np.divide(pv, denom, out=np.zeros_like(pv), where=denom > 0)


class _MaskMutant(Mutant):
    op = "draft_attention"
    kind = ""

    def draft_attention(self, q, k, v, k_cache, v_cache, frontier, live, window):
        with precision.baseline(registry.get(self.op).bf16_intermediates):
            out = _attend_with(q, k, v, k_cache, v_cache, frontier, live, int(window), self.kind)
        return {"out": numerics.storage(out, "bf16")}


class LeftOnlyWindow(_MaskMutant):
    """Non-causal layer windowed on one side only (keys before the query), the left-only staircase."""

    pitfall, kind = "left_only_window", "left_only"


class DecodeRowsSharedLength(_MaskMutant):
    """The block expanded into decode rows sharing one sequence length: every row's window starts
    from the block's last position (narrow by up to block - 1 keys)."""

    pitfall, kind = "decode_rows_shared_length", "shared_length"


class WindowDropped(_ArgsMutant):
    """The sliding window silently dropped: a local layer attends like a full one."""

    op, pitfall, fn = "draft_attention", "window_dropped", draft_attention

    def change(self, kw):
        return {**kw, "window": 0}


class WindowNarrow(_ArgsMutant):
    """Window bound one key short (|p_k - p_q| < S - 1): the key at distance S - 1 dropped."""

    op, pitfall, fn = "draft_attention", "mask_boundary", draft_attention

    def change(self, kw):
        w = int(kw["window"])
        return {**kw, "window": w - 1 if w > 1 else w}


class RingReadUnwrapped(_ArgsMutant):
    """The context ring read without mod C: position p from slot p - max(0, F - C)."""

    op, pitfall, fn = "draft_attention", "ring_wrap", draft_attention

    def change(self, kw):
        return {**kw, "k_cache": _unwrapped_ring(kw["k_cache"], kw["frontier"]),
                "v_cache": _unwrapped_ring(kw["v_cache"], kw["frontier"])}


class LiveIgnored(_ArgsMutant):
    """Block rows past the live extent attended (live taken as W)."""

    op, pitfall, fn = "draft_attention", "tail_extent", draft_attention

    def change(self, kw):
        return {**kw, "live": np.full_like(kw["live"], np.shape(kw["q"])[1])}


class Int32Positions(_MaskMutant):
    """Positions held in int32: past 2^31 they wrap negative (context keys vanish, distances jump)."""

    pitfall, kind = "positions_2p31", "int32"
    also = ("positions_2p32",)


class VInfTimesZero(Mutant):
    """Masked keys multiplied by their zero weight: an FP16-overflowed V outside the window gives 0 * inf = NaN."""

    op, pitfall = "draft_attention", "fp16_overflow"

    def draft_attention(self, v_cache, **kw):
        out = np.asarray(self._baseline(draft_attention, v_cache=v_cache, **kw)["out"], np.float64)
        bad = ~np.isfinite(np.asarray(v_cache, np.float64)).reshape(v_cache.shape[0], -1).all(axis=1)
        out[bad] = np.nan
        return {"out": numerics.storage(out, "bf16")}


class GqaInterleaved(_ArgsMutant):
    """GQA head mapping interleaved (KV head h % Hk) instead of blocked (h // (Hq/Hk))."""

    op, pitfall, fn = "draft_attention", "gqa_head_mapping", draft_attention

    def change(self, kw):
        self._perm = _gqa_perm(np.shape(kw["q"])[2], np.shape(kw["k"])[2])
        q = np.asarray(kw["q"])
        q2 = np.empty_like(q)
        q2[:, :, self._perm] = q
        return {**kw, "q": q2}

    def draft_attention(self, **kw):
        out = self._baseline(draft_attention, **self.change(dict(kw)))["out"]
        return {"out": out[:, :, self._perm]}


# draft layer and masked block: the same bugs one level up

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


class LayerWindowNarrow(_ArgsMutant):
    op, pitfall, variant, fn = "draft_layer", "mask_boundary", "draft_layer", draft_layer

    def change(self, kw):
        w = int(kw["window"])
        return {**kw, "window": w - 1 if w > 1 else w}


class LayerRingReadUnwrapped(_ArgsMutant):
    op, pitfall, variant, fn = "draft_layer", "ring_wrap", "draft_layer", draft_layer

    def change(self, kw):
        return {**kw, "k_cache": _unwrapped_ring(kw["k_cache"], kw["frontier"]),
                "v_cache": _unwrapped_ring(kw["v_cache"], kw["frontier"])}


class LayerLiveIgnored(_ArgsMutant):
    op, pitfall, variant, fn = "draft_layer", "tail_extent", "draft_layer", draft_layer

    def change(self, kw):
        return {**kw, "live": np.full_like(kw["live"], np.shape(kw["x"])[1])}


class LayerInt32Positions(_ArgsMutant):
    op, pitfall, variant, fn = "draft_layer", "positions_2p31", "draft_layer", draft_layer
    also = ("positions_2p32",)

    def change(self, kw):
        return {**kw, "frontier": _int32(kw["frontier"])}


class LayerRopeInterleaved(_ArgsMutant):
    """GPT-J (interleaved pairs) RoPE on the block's Q and K instead of split halves."""

    op, pitfall, variant, fn = "draft_layer", "rope_interleaved", "draft_layer", draft_layer

    def change(self, kw):
        return _layer_rope_interleaved(kw)


class LayerGqaInterleaved(_ArgsMutant):
    op, pitfall, variant, fn = "draft_layer", "gqa_head_mapping", "draft_layer", draft_layer

    def change(self, kw):
        return _layer_gqa(kw)


class BlockWindowNarrow(_ArgsMutant):
    op, pitfall, variant, fn = "masked_block", "mask_boundary", "masked_block", masked_block

    def change(self, kw):
        return {**kw, "windows": [int(w) - 1 if int(w) > 1 else int(w) for w in kw["windows"]]}


class BlockRingReadUnwrapped(_ArgsMutant):
    op, pitfall, variant, fn = "masked_block", "ring_wrap", "masked_block", masked_block

    def change(self, kw):
        return {**kw, "context_k": np.stack([_unwrapped_ring(c, kw["frontier"]) for c in kw["context_k"]]),
                "context_v": np.stack([_unwrapped_ring(c, kw["frontier"]) for c in kw["context_v"]])}


class BlockLiveIgnored(_ArgsMutant):
    """DFlash's block attends every column, not just the live P + 1."""

    op, pitfall, variant, fn = "masked_block", "tail_extent", "masked_block", masked_block

    def change(self, kw):
        return {**kw, "live": np.full_like(kw["live"], int(kw["num_drafts"]) + 1)}


class BlockInt32Positions(_ArgsMutant):
    op, pitfall, variant, fn = "masked_block", "positions_2p32", "masked_block", masked_block
    also = ("positions_2p31",)

    def change(self, kw):
        return {**kw, "frontier": _int32(kw["frontier"])}


class BlockRopeInterleaved(_ArgsMutant):
    op, pitfall, variant, fn = "masked_block", "rope_interleaved", "masked_block", masked_block

    def change(self, kw):
        return _layer_rope_interleaved(kw, lead=True)


class BlockGqaInterleaved(_ArgsMutant):
    op, pitfall, variant, fn = "masked_block", "gqa_head_mapping", "masked_block", masked_block

    def change(self, kw):
        return _layer_gqa(kw)


# context K/V

class _KvMutant(Mutant):
    op = "context_kv"

    def context_kv(self, **kw):
        return self._baseline(_context_kv, **self.bug, **kw)


class RingWriteNoWrap(_KvMutant):
    """A chunk written linearly from its first slot: rows past the ring's end are lost, not wrapped."""

    pitfall = "ring_wrap"
    BUG: ClassVar[dict] = {"no_wrap": True}


class ChunkFirstRows(_KvMutant):
    """A chunk longer than the ring keeps its first C rows instead of its last C."""

    pitfall = "chunk_longer_than_S"
    BUG: ClassVar[dict] = {"first_rows": True}


class VSaturating(_KvMutant):
    """Context V cast to FP16 with saturation: overflow gives +-65504, not +-inf (C1)."""

    pitfall = "fp16_overflow"
    BUG: ClassVar[dict] = {"v_saturate": True}


class VFtz(_KvMutant):
    """FP16 subnormals of V flushed to zero (C1 keeps them)."""

    pitfall = "fp16_subnormal"
    BUG: ClassVar[dict] = {"v_ftz": True}


class KvRopeInterleaved(_KvMutant):
    """Context K rotated GPT-J style (interleaved pairs) instead of split halves."""

    pitfall = "rope_interleaved"
    BUG: ClassVar[dict] = {"rope_interleaved": True}


class KvRopeBf16Positions(_KvMutant):
    """RoPE table built in BF16: positions above 256 are not exact (candle #3520, sglang #33117)."""

    pitfall = "rope_bf16_table"
    BUG: ClassVar[dict] = {"bf16_positions": True}


# target features

class CaptureBeforeLayer(Mutant):
    """Capture taken at each block's input: id l reads block l - 1's output (id 0 reads the
    embedding, which is not an input here: zeros), so the last block is never captured."""

    op, pitfall = "feature_capture", "capture_before_layer"

    def feature_capture(self, block_outputs, target_layer_ids, **kw):
        r = np.concatenate([np.zeros_like(block_outputs[:1]), block_outputs[:-1]], axis=0)
        return self._baseline(feature_capture, block_outputs=r, target_layer_ids=target_layer_ids, **kw)


# proposal head and candidates

class HeadTiesToHighest(Mutant):
    """Argmax ties to the highest row (last maximum) instead of the lowest (C4)."""

    op, pitfall = "proposal_head", "exact_tie"

    def proposal_head(self, head, shortlist=None, **kw):
        gid = np.arange(head.shape[0], dtype=np.int32) if shortlist is None else np.asarray(shortlist)
        return self._baseline(proposal_head, head=head[::-1], shortlist=gid[::-1].copy(), **kw)


class HeadShortlistNoRemap(Mutant):
    """An indexed head's row number returned as the token (no shortlist remap)."""

    op, pitfall = "proposal_head", "shortlist_remap"

    def proposal_head(self, head, vocab_size, shortlist=None, **kw):
        out = self._baseline(proposal_head, head=head, vocab_size=vocab_size, shortlist=shortlist, **kw)
        if shortlist is None:
            return out
        row = {}
        for r, g in enumerate(np.asarray(shortlist).tolist()):
            row.setdefault(int(g), r)
        return {"tokens": np.vectorize(lambda t: row[int(t)], otypes=[np.int32])(out["tokens"])}


class HeadVocabPadding(_ArgsMutant):
    """Padded vocabulary rows eligible (vocab_size ignored)."""

    op, pitfall, fn = "proposal_head", "vocab_padding", proposal_head

    def change(self, kw):
        return {**kw, "vocab_size": 2**31 - 1}


class TopkShortlistNoRemap(Mutant):
    op, pitfall = "candidate_topk", "shortlist_remap"

    def candidate_topk(self, shortlist=None, **kw):
        out = self._baseline(candidate_topk, shortlist=shortlist, **kw)
        if shortlist is None:
            return out
        row = {}
        for r, g in enumerate(np.asarray(shortlist).tolist()):
            row.setdefault(int(g), r)
        return {**out, "ids": np.vectorize(lambda t: row[int(t)], otypes=[np.int32])(out["ids"])}


class TopkVocabPadding(_ArgsMutant):
    op, pitfall, fn = "candidate_topk", "vocab_padding", candidate_topk

    def change(self, kw):
        return {**kw, "vocab_size": 2**31 - 1}


class TopkNanFirst(Mutant):
    """Top-k over NaN scores returns rows 0..k-1 (comparisons with NaN are false; vLLM #55250)."""

    op, pitfall = "candidate_topk", "nan_scores"

    def candidate_topk(self, hidden, head, vocab_size, top_k, output_multiplier=0.0, softcap=0.0, shortlist=None):
        out = self._baseline(candidate_topk, hidden=hidden, head=head, vocab_size=vocab_size, top_k=top_k,
                             output_multiplier=output_multiplier, softcap=softcap, shortlist=shortlist)
        with np.errstate(invalid="ignore"):
            z = np.asarray(hidden, np.float64) @ np.asarray(head, np.float64).T
        gid = np.arange(head.shape[0]) if shortlist is None else np.asarray(shortlist, np.int64)
        rows = np.flatnonzero((gid >= 0) & (gid < vocab_size))[:top_k]
        hit = np.isnan(z).any(axis=-1)
        ids, scores = out["ids"].copy(), np.asarray(out["scores"]).copy()
        with np.errstate(invalid="ignore", over="ignore"):
            ids[hit] = gid[rows]
            scores[hit] = numerics.storage(_transform(z[hit][:, rows], output_multiplier, softcap), "fp32")
        return {"scores": scores, "ids": ids}


# selector

class SelectorRngKey(_ArgsMutant):
    """Philox key words swapped: key = (seed >> 32, seed & 0xffffffff)."""

    op, pitfall, fn = "candidate_selector", "rng_key", candidate_selector

    def change(self, kw):
        return {**kw, "seed": _swap_words(kw["seed"])}


class SelectorEngineSeed(_ArgsMutant):
    """One engine-wide seed (the first request's) instead of per-request seeds."""

    op, pitfall, fn = "candidate_selector", "engine_wide_seed", candidate_selector

    def change(self, kw):
        return {**kw, "seed": np.full_like(kw["seed"], np.asarray(kw["seed"])[0])}


class SelectorTemperatureIgnored(_ArgsMutant):
    """The draft temperature ignored: sampled rows draw at temperature 1."""

    op, pitfall, fn = "candidate_selector", "draft_temperature_ignored", candidate_selector

    def change(self, kw):
        t = np.asarray(kw["temperature"])
        return {**kw, "temperature": np.where(t > 0, np.ones_like(t), t)}


class SelectorBranchesSwapped(_ArgsMutant):
    """Predecessor and successor codebooks swapped in the energy (ninfer-windows PR #4)."""

    op, pitfall, fn = "candidate_selector", "selector_branches_swapped", candidate_selector

    def change(self, kw):
        return {**kw, "w_pred": kw["w_succ"], "w_succ": kw["w_pred"]}


class SelectorPositions32(Mutant):
    """The draw's position counter keeps its low 32 bits only (the high word dropped)."""

    op, pitfall = "candidate_selector", "positions_2p32"

    def candidate_selector(self, frontier, ids, hidden, scores, anchor, **kw):
        f = np.asarray(frontier, dtype=np.int64)
        k = ids.shape[1]
        pred = np.asarray(anchor).copy()
        out = {"path": np.zeros(ids.shape[:2], np.int32), "tokens": np.zeros(ids.shape[:2], np.int32),
               "q": np.zeros(ids.shape, np.float32), "g": None}
        for i in range(k):
            # step i alone, from the token the walk took at step i - 1, drawn at (F + i) mod 2^32
            o = self._baseline(candidate_selector, frontier=(f + i) & M32, ids=ids[:, i:i + 1].copy(),
                               hidden=hidden[:, i:i + 1].copy(), scores=scores[:, i:i + 1].copy(),
                               anchor=pred.astype(np.asarray(anchor).dtype), **kw)
            for key in ("path", "tokens", "q"):
                out[key][:, i] = o[key][:, 0]
            pred = o["tokens"][:, 0]
        out["g"] = self._baseline(candidate_selector, frontier=f, ids=ids, hidden=hidden, scores=scores,
                                  anchor=anchor, **kw)["g"]
        return out


class SelectorTiesToHighest(Mutant):
    """Greedy step: the highest rank among the maxima instead of the lowest (C4)."""

    op, pitfall = "candidate_selector", "exact_tie"

    def candidate_selector(self, scores, ids, **kw):
        k = ids.shape[-1]
        out = self._baseline(candidate_selector, scores=scores[..., ::-1].copy(), ids=ids[..., ::-1].copy(), **kw)
        return {**out, "path": (k - 1 - out["path"]).astype(np.int32), "q": out["q"][..., ::-1].copy()}


# verification

class AcceptRngKey(_ArgsMutant):
    op, pitfall, fn = "speculative_accept", "rng_key", speculative_accept

    def change(self, kw):
        return {**kw, "seed": _swap_words(kw["seed"])}


class AcceptEngineSeed(_ArgsMutant):
    op, pitfall, fn = "speculative_accept", "engine_wide_seed", speculative_accept

    def change(self, kw):
        return {**kw, "seed": np.full_like(kw["seed"], np.asarray(kw["seed"])[0])}


class AcceptVocabPadding(_ArgsMutant):
    op, pitfall, fn = "speculative_accept", "vocab_padding", speculative_accept

    def change(self, kw):
        return {**kw, "vocab_size": np.shape(kw["logits"])[-1]}


class AcceptTailExtent(_AcceptMutant):
    """live_proposals ignored: every proposal slot is verified."""

    pitfall = "tail_extent"


class AcceptPositions32(_AcceptMutant):
    """The accept/correction/bonus counter keeps the position's low 32 bits only."""

    pitfall = "positions_2p32"


class ResidualSumZeroNan(_AcceptMutant):
    """A zero-mass residual normalized by its sum (0/0): NaN weights, the sampler returns id 0."""

    pitfall = "residual_sum_zero"


class CoinLeRatio(_AcceptMutant):
    """Accept iff coin <= p/q: a token with p(d) = 0 = U q(d), or U q(d) = p(d), is accepted."""

    pitfall = "coin_le_ratio"
    also = ("exact_tie",)


class GreedyTiesLastWins(_AcceptMutant):
    """The verifier's greedy argmax breaks ties last-wins."""

    pitfall = "greedy_ties_last_wins"
    also = ("exact_tie",)


class SameDrawReused(_AcceptMutant):
    """The correction race reuses the accept test's Philox stream (purpose ACCEPT)."""

    pitfall = "same_draw_reused"


class RngPurposeShared(_AcceptMutant):
    """The verifier's accept uniform drawn from the draft's counter range (purpose DFLASH2_PROPOSAL)."""

    pitfall = "rng_purpose_shared"


class RngAdvancedP0(_AcceptMutant):
    """A request with zero proposals still advances its position: its bonus is drawn at F + 2."""

    pitfall = "rng_advanced_p0"


class FiltersOnlyOnBonus(_AcceptMutant):
    """top-k/top-p/min-p applied only to the bonus token, not to the verified ones."""

    pitfall = "filters_only_on_bonus"


class PenaltiesLastTokenOnly(_AcceptMutant):
    """Only the last accepted token fed to the penalties at each step."""

    pitfall = "penalties_last_token_only"


class TreeRngKey(_ArgsMutant):
    op, pitfall, fn = "tree_verify", "rng_key", None

    def change(self, kw):
        return {**kw, "seed": _swap_words(kw["seed"])}


class TreeRngBatchRow(_ArgsMutant):
    op, pitfall, fn = "tree_verify", "rng_batch_row", None

    def change(self, kw):
        return {**kw, "seed": np.asarray(kw["seed"], np.uint64) ^ np.arange(len(kw["seed"]), dtype=np.uint64)}


class TreePositions32(_ArgsMutant):
    op, pitfall, fn = "tree_verify", "positions_2p32", None

    def change(self, kw):
        return {**kw, "frontier": np.asarray(kw["frontier"], np.int64) & M32}


# target distribution

def _target_rows(fn_row, logits, prompt_mask, output_counts, vocab_size, **prm):
    rows = [fn_row(logits[n], prompt_mask[n], output_counts[n], vocab_size, **{k: v[n] for k, v in prm.items()})
            for n in range(np.shape(logits)[0])]
    return {"probs": represent(np.stack(rows), "fp32")}


def _temperature_after_filters(logits, prompt_mask, output_counts, vocab_size, temperature, top_p, min_p,
                               repetition_penalty, frequency_penalty, presence_penalty, top_k):
    z = penalized_logits(logits, prompt_mask, output_counts, vocab_size, repetition_penalty, frequency_penalty,
                         presence_penalty)
    if work(temperature) <= 0:
        return filtered_probs(z, temperature, top_k, top_p, min_p)
    keep = filtered_probs(z, 1.0, top_k, top_p, min_p) > 0
    zt = np.where(keep, z / work(temperature), -np.inf)
    e = np.exp(zt - zt[keep].max())
    return e / e.sum()


def _min_p_on_logits(logits, prompt_mask, output_counts, vocab_size, temperature, top_p, min_p,
                     repetition_penalty, frequency_penalty, presence_penalty, top_k):
    z = penalized_logits(logits, prompt_mask, output_counts, vocab_size, repetition_penalty, frequency_penalty,
                         presence_penalty)
    if work(temperature) <= 0 or work(min_p) <= 0:
        return filtered_probs(z, temperature, top_k, top_p, min_p)
    keep = filtered_probs(z, temperature, top_k, top_p, 0.0) > 0
    zt = z / work(temperature)
    keep &= zt >= work(min_p) * zt[keep].max()  # the min-p rule applied to logits, not probabilities
    if not keep.any():
        keep[np.argmax(np.where(np.isfinite(zt), zt, -np.inf))] = True
    zk = np.where(keep, zt, -np.inf)
    e = np.exp(zk - zk[keep].max())
    return e / e.sum()


class _TargetMutant(Mutant):
    op = "target_distribution"
    target_row = None  # the buggy C5 row function (``row`` is the PITFALLS row every mutant names)

    def target_distribution(self, **kw):
        row = type(self).target_row
        return self._baseline(lambda **a: _target_rows(row, **a), **kw)


class TemperatureAfterFilters(_TargetMutant):
    """top-k/top-p/min-p chosen on the unscaled logits, temperature applied after (sglang-jax #1563)."""

    pitfall = "temperature_after_filters"
    target_row = staticmethod(_temperature_after_filters)


class MinPOnLogits(_TargetMutant):
    """min-p applied to logits (z < min_p * max z) instead of probabilities (Camelid #534)."""

    pitfall = "min_p_on_logits"
    target_row = staticmethod(_min_p_on_logits)


class PenaltiesMissing(_ArgsMutant):
    """No repetition, frequency or presence penalty."""

    op, pitfall, fn = "target_distribution", "penalties_missing", None

    def change(self, kw):
        one = np.ones_like(kw["repetition_penalty"])
        return {**kw, "repetition_penalty": one, "frequency_penalty": 0 * one, "presence_penalty": 0 * one}


class MinPMissing(_ArgsMutant):
    op, pitfall, fn = "target_distribution", "min_p_missing", None

    def change(self, kw):
        return {**kw, "min_p": np.zeros_like(kw["min_p"])}


class TargetVocabPadding(_ArgsMutant):
    op, pitfall, fn = "target_distribution", "vocab_padding", None

    def change(self, kw):
        return {**kw, "vocab_size": np.shape(kw["logits"])[-1]}


class TargetTiesToHighest(Mutant):
    """Greedy argmax and top-k ties broken toward the higher id."""

    op, pitfall = "target_distribution", "exact_tie"

    def target_distribution(self, logits, prompt_mask, output_counts, vocab_size, **kw):
        v = int(vocab_size)

        def flip(a):
            a = np.array(a, copy=True)
            a[:, :v] = a[:, :v][:, ::-1]
            return a

        out = self._baseline(_target_fn(), logits=flip(logits), prompt_mask=flip(prompt_mask),
                             output_counts=flip(output_counts), vocab_size=vocab_size, **kw)
        return {"probs": flip(out["probs"])}


def _tree_verify_residual(anchor, ids, energies, temperature, seed, frontier, target_bigram, tree_nodes, *,
                          sibling_residual=True):
    """reference.tree_verify with the recursive rejection's residual update between siblings as a
    switch: off, every sibling is tested against the same p (the residual never shrinks)."""
    from reference import tree_verify as tv

    after = tv._after_rejection if sibling_residual else (lambda r, g: r)
    out = dict(tv.tree_verify(anchor, ids, energies, temperature, seed, frontier, target_bigram, tree_nodes))
    if sibling_residual:
        return out
    ids = np.asarray(ids)
    B, K = ids.shape[:2]
    W = K + 1
    tokens = np.full((B, W), -1, dtype=np.int32)
    accepted = np.zeros(B, dtype=np.int32)
    for b in range(B):
        s, F, T = np.uint64(seed[b]), int(frontier[b]), float(temperature[b])
        nodes, _ = tv.build_tree(ids[b], energies[b], temperature[b], s, F, int(tree_nodes))
        node, prev, depth = -1, int(anchor[b]), 0
        while True:
            kids = [n for n, nd in enumerate(nodes) if nd[2] == node]
            z = work(target_bigram[prev])
            pos = F + 1 + depth
            if T <= 0:
                top = tv.argmax_with_gap(z)[0]
                tokens[b, depth] = top
                hit = [n for n in kids if ids[b, nodes[n][0], nodes[n][1]] == top]
                if not hit:
                    break
                node, prev, depth = hit[0], top, depth + 1
                continue
            p = tv._softmax(z / z.dtype.type(T))
            r, chosen = p, None
            for j, n in enumerate(kids):
                d_i, c_rank, parent, main = nodes[n]
                c = int(ids[b, d_i, c_rank])
                g = np.zeros_like(p)
                if main:
                    prev_rank = nodes[parent][1] if parent >= 0 else 0
                    np.add.at(g, np.asarray(ids[b, d_i], dtype=np.int64), tv._q(energies[b, d_i, prev_rank], T))
                else:
                    g[c] = 1
                u = work(tv.uniform(s, pos, tv.Purpose.ACCEPT, j))
                if float(r[c] - u * g[c]) > 0:
                    chosen = (n, c)
                    break
                r = after(r, g)
            if chosen is not None:
                tokens[b, depth] = chosen[1]
                node, prev, depth = chosen[0], chosen[1], depth + 1
                continue
            purpose, weights = (tv.Purpose.CORRECTION, r) if kids else (tv.Purpose.BONUS, p)
            tokens[b, depth] = tv.exponential_race(np.asarray(weights, np.float64), s, pos, purpose)[0]
            break
        accepted[b] = depth
    out.update(tokens=tokens, accepted=accepted, num_out=accepted + 1)
    return out


class TreeSiblingResidual(Mutant):
    """Recursive rejection without the residual update between siblings: each sibling of a
    rejected node is tested against p itself instead of max(r - g, 0) normalized (C6)."""

    op, pitfall = "tree_verify", "sibling_residual"

    BUG: ClassVar[dict] = {"sibling_residual": False}

    def tree_verify(self, **kw):
        return self._baseline(_tree_verify_residual, **self.bug, **kw)


def _target_fn():
    from reference.target_distribution import target_distribution

    return target_distribution


def _tree_fn():
    from reference.tree_verify import tree_verify

    return tree_verify


for _cls in (PenaltiesMissing, MinPMissing, TargetVocabPadding):
    _cls.fn = staticmethod(_target_fn())
for _cls in (TreeRngKey, TreeRngBatchRow, TreePositions32):
    _cls.fn = staticmethod(_tree_fn())

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
    # catalog v2 and one mutant per case flag (issue 10)
    LeftOnlyWindow(),
    DecodeRowsSharedLength(),
    WindowDropped(),
    WindowNarrow(),
    RingReadUnwrapped(),
    LiveIgnored(),
    Int32Positions(),
    VInfTimesZero(),
    GqaInterleaved(),
    LayerWindowNarrow(),
    LayerRingReadUnwrapped(),
    LayerLiveIgnored(),
    LayerInt32Positions(),
    LayerRopeInterleaved(),
    LayerGqaInterleaved(),
    BlockWindowNarrow(),
    BlockRingReadUnwrapped(),
    BlockLiveIgnored(),
    BlockInt32Positions(),
    BlockRopeInterleaved(),
    BlockGqaInterleaved(),
    RingWriteNoWrap(),
    ChunkFirstRows(),
    VSaturating(),
    VFtz(),
    KvRopeInterleaved(),
    KvRopeBf16Positions(),
    CaptureBeforeLayer(),
    HeadTiesToHighest(),
    HeadShortlistNoRemap(),
    HeadVocabPadding(),
    TopkShortlistNoRemap(),
    TopkVocabPadding(),
    TopkNanFirst(),
    SelectorRngKey(),
    SelectorEngineSeed(),
    SelectorTemperatureIgnored(),
    SelectorBranchesSwapped(),
    SelectorPositions32(),
    SelectorTiesToHighest(),
    AcceptRngKey(),
    AcceptEngineSeed(),
    AcceptVocabPadding(),
    AcceptTailExtent(),
    AcceptPositions32(),
    ResidualSumZeroNan(),
    CoinLeRatio(),
    GreedyTiesLastWins(),
    SameDrawReused(),
    RngPurposeShared(),
    RngAdvancedP0(),
    FiltersOnlyOnBonus(),
    PenaltiesLastTokenOnly(),
    TreeRngKey(),
    TreeRngBatchRow(),
    TreePositions32(),
    TreeSiblingResidual(),
    TemperatureAfterFilters(),
    MinPOnLogits(),
    PenaltiesMissing(),
    MinPMissing(),
    TargetVocabPadding(),
    TargetTiesToHighest(),
]

_seen: set = set()
for _m in MUTANTS:  # one key per mutant: a pitfall shared by several Ops takes the Op as its variant
    if _m.key in _seen:
        _m.variant = _m.op
    if _m.key in _seen:
        raise ValueError(f"two mutants with the key {_m.key}")
    _seen.add(_m.key)


def flags_of(mutant) -> tuple:
    """The case flags a mutant answers for: its pitfall and ``also``."""
    return (mutant.pitfall, *mutant.also)


def for_op(op: str) -> list:
    return [m for m in MUTANTS if m.op == op]


def for_flag(op: str, flag: str) -> list:
    """The mutants of ``op`` that a case of ``op`` flagged ``flag`` must FAIL."""
    return [m for m in MUTANTS if m.op == op and flag in flags_of(m)]


def decisions_differ(case, flags=None) -> bool:
    """At generation: does every mutant named by ``flags`` (default: the case's flags) change an exact or
    decision output of ``case``? Judged against the float64 reference; the case generator's own
    clearness test makes such a change a FAIL, which tests/mutants/test_bites.py then checks."""
    spec = registry.get(case.op)
    kinds = {o.name for o in spec.outputs if o.cls != registry.REPRESENTED}
    ref = spec.reference(**case.kwargs())
    for f in case.flags if flags is None else flags:
        for m in for_flag(case.op, f):
            out = getattr(m, case.op)(**case.kwargs())
            if not any(not np.array_equal(np.asarray(out[n]), np.asarray(ref[n])) for n in kinds):
                return False
    return True


# The PITFALLS.md row each pitfall stands for (shared/design/PITFALLS.md; "v1" the first table,
# "v2" the catalog of more bugs that shipped, "flag" a case flag of the suite with its own bug).
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
    "conv_separate_rounding": "v1: conv computed as base*x + delta*x rounded separately (z-lab model.py)",
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
}


def _row(self) -> str:
    return ROWS.get(self.pitfall, "")


Mutant.row = property(_row)
