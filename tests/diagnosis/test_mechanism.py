"""Family readings (conformance/diagnosis/mechanism.py): a structural signature that is on its own a
family's mechanism names that family, with every variant of the family removed from the catalog; a
signature that is not (a 2 % scale, a shrink that moves elements both ways, a width that is not the
norm's) names none."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from conformance import mutants
from conformance.compare import Result
from conformance.controls.engine import Engine
from conformance.diagnose import Diagnoser, family, hypotheses, summary
from conformance.diagnosis import mechanism
from conformance.runner import run_suite
from reference import numerics

VECTORS = Path(__file__).parents[2] / "vectors"
# the engine and rule tests below diagnose the first FAILs of a run only (the diagnosis's cost, not its verdict:
# a run is in case order, so these are the same cases every time; docs/reports/diagnosis.md measures every FAIL)
DIAGNOSED = 12


# --- the rules, on hand-made signatures ------------------------------------------------------------


def _vec(op, **expected):
    return SimpleNamespace(op=op, expected={k: np.asarray(v) for k, v in expected.items()})


def _read(op, sig, impl=None, **expected):
    shape = {"text": "t", "evidence": "e", "confidence": 0.8, **sig}
    hs = mechanism.readings(_vec(op, **expected), impl or {}, [shape])
    return hs[0]["family"] if hs[0].get("kind") == "family" else None


def test_an_edge_moved_by_one_is_the_window_on_attention_ops_only():
    sig = {"signature": "input off by one", "field": "window", "step": 1}
    assert _read("draft_layer", sig) == "window"
    assert _read("target_distribution", sig) is None
    front = {"signature": "input off by one", "field": "frontier", "step": -1}
    assert _read("draft_attention", front) == "window"  # the ring read one slot off
    assert _read("speculative_accept", front) == "rng"  # the uniforms' position counter
    assert _read("masked_block", front) is None  # positions, the anchor and the ring all move there


def test_a_scale_is_a_family_only_where_it_is_the_mechanism():
    x = np.array([[1.0, 2.0, -4.0, 8.0]])
    # 1/8 on a 64-wide norm output: sqrt(64); the same factor on a 100-wide one is not sqrt(100)
    assert _read("feature_capture", {"signature": "constant scale", "output": "h", "factor": 0.125},
                 h=np.zeros((2, 64))) == "norm"
    assert _read("feature_capture", {"signature": "constant scale", "output": "h", "factor": 0.125},
                 h=np.zeros((2, 100))) is None
    # every differing element shrunk toward zero by < 2^-7: truncation; a 2 % growth: no family
    shrunk = {"out": x * (1 - 2.0 ** -9)}
    assert _read("draft_attention", {"signature": "constant scale", "output": "out", "factor": 1 - 2.0 ** -9},
                 shrunk, out=x) == "rounding"
    assert _read("draft_attention", {"signature": "constant scale", "output": "out", "factor": 1.02},
                 {"out": x * 1.02}, out=x) is None
    # the same average shrink with elements moved both ways is not a rounding toward zero
    mixed = {"out": x * np.array([1 - 2.0 ** -6, 1 + 2.0 ** -7, 1 - 2.0 ** -6, 1 + 2.0 ** -7])}
    assert _read("draft_attention", {"signature": "constant scale", "output": "out", "factor": 1 - 2.0 ** -9},
                 mixed, out=x) is None
    # a shrink of 2^-7 or more is a scale, not a rounding
    assert _read("draft_attention", {"signature": "constant scale", "output": "out", "factor": 0.99},
                 {"out": x * 0.99}, out=x) is None


def test_a_column_rotation_is_the_next_token_shift_a_shuffle_is_not():
    rot = {"signature": "permutation", "output": "tokens", "axis": 1, "rotation": 1}
    assert _read("proposal_head", rot) == "next_token_shift"
    assert _read("proposal_head", {**rot, "rotation": None}) is None
    assert _read("proposal_head", {**rot, "axis": 0}) is None  # batch rows exchanged


def test_each_family_is_read_once_before_its_signature():
    shapes = [{"signature": "input off by one", "field": "window", "step": s, "text": "t", "evidence": "e",
               "confidence": 0.85} for s in (1, -1)]
    hs = mechanism.readings(_vec("draft_attention"), {}, shapes)
    assert len(hs) == 3 and hs[0]["kind"] == "family" and hs[0]["family"] == "window"
    assert hs[1] is shapes[0] and hs[2] is shapes[1]


# --- engines with a family's bug, diagnosed by a catalog without that family ----------------------


class RepeatHeads(Engine):
    """GQA as x.repeat(1, G) maps it: query head h reads KV head h % Hk (the spec: h // G)."""

    def draft_attention(self, q, k, v, k_cache, v_cache, frontier, live, window):
        hq, hk = np.shape(q)[2], np.shape(k)[2]
        out = None
        for j in range(hk):
            one = {n: np.repeat(np.asarray(a)[:, :, j:j + 1], hk, axis=2)
                   for n, a in (("k", k), ("v", v), ("k_cache", k_cache), ("v_cache", v_cache))}
            o = self._attend(q, frontier=frontier, live=live, window=window, **one)
            out = np.zeros_like(o) if out is None else out
            heads = [h for h in range(hq) if h % hk == j]
            out[:, :, heads] = o[:, :, heads]
        return {"out": numerics.storage(out, "bf16")}


class CausalBlock(Engine):
    """A causal mask over the block: query column i attends to block keys j <= i only."""

    def draft_attention(self, q, k, v, k_cache, v_cache, frontier, live, window):
        live = np.asarray(live)
        w = np.shape(q)[1]
        cols = [self._attend(q, k, v, k_cache, v_cache, frontier, np.minimum(live, i + 1).astype(live.dtype),
                             window)[:, i] for i in range(w)]
        return {"out": numerics.storage(np.stack(cols, axis=1), "bf16")}


class TruncatedStore(Engine):
    """The attention output stored to BF16 by dropping the low 16 bits (toward zero)."""

    def draft_attention(self, **kw):
        bits = np.asarray(self._attend(**kw), np.float32).view(np.uint32) & np.uint32(0xFFFF0000)
        return {"out": bits.view(np.float32).astype(np.float64)}


class RolledProposals(Engine):
    """proposal_head's tokens rolled one column (torch.roll(tokens, 1, dims=1))."""

    def proposal_head(self, **kw):
        t = super().proposal_head(**kw)["tokens"]
        return {"tokens": np.roll(t, 1, axis=1)}


class CausalLayer(Engine):
    """draft_layer with a causal mask over the block: row i computed as if only the first i + 1 were live."""

    def draft_layer(self, x, live, **kw):
        live = np.asarray(live)
        rows = [super(CausalLayer, self).draft_layer(x, live=np.minimum(live, i + 1).astype(live.dtype), **kw)
                ["x_next"][:, i] for i in range(np.shape(x)[1])]
        return {"x_next": np.stack(rows, axis=1)}


class StackedCapture(Engine):
    """Target features gathered by popping a stack of the captured blocks: the last id's block first."""

    def feature_capture(self, target_layer_ids, **kw):
        return super().feature_capture(target_layer_ids=list(target_layer_ids)[::-1], **kw)


class DefaultTheta(Engine):
    """context_kv's RoPE with the library default base (10000, or 1e6 where the case uses 10000), not the
    configured one: a rotation the catalog has no variant of."""

    def context_kv(self, theta, **kw):
        return super().context_kv(theta=1e6 if float(theta) == 1e4 else 1e4, **kw)


class SwappedCodebooks(Engine):
    """The selector's predecessor and successor tables loaded under each other's names."""

    def candidate_selector(self, w_pred, w_succ, **kw):
        return super().candidate_selector(w_pred=w_succ, w_succ=w_pred, **kw)


class LastMaxHead(Engine):
    """proposal_head's argmax taking the last maximum (ties to the highest row; the spec: the lowest)."""

    def proposal_head(self, hidden, head, vocab_size, shortlist=None):
        rows = np.shape(head)[0]
        ids = np.arange(rows, dtype=np.int32) if shortlist is None else np.asarray(shortlist)
        return super().proposal_head(hidden=hidden, head=np.ascontiguousarray(np.asarray(head)[::-1]),
                                     vocab_size=vocab_size, shortlist=np.ascontiguousarray(ids[::-1]))


class FullAttention(Engine):
    """A sliding-window layer attended in full: the window argument never reaches the kernel."""

    def draft_attention(self, window, **kw):
        return super().draft_attention(window=0, **kw)


class GemmaNorm(Engine):
    """The context norm scaled by (1 + w), Gemma's convention, on a checkpoint that stores w."""

    def feature_capture(self, hidden_norm, **kw):
        w = np.asarray(hidden_norm)
        return super().feature_capture(hidden_norm=(w.astype(np.float64) + 1).astype(w.dtype), **kw)


class RolledConv(Engine):
    """The conv's preceding tap taken with a wrapping shift (np.roll of the columns by one): column 0 reads the
    last column instead of nothing."""

    def _conv(self, x, base_side, delta_side):
        b, w, h = np.shape(x)
        xg = np.asarray(x, np.float32).reshape(b, w, h // 16, 16)
        coef = np.asarray(base_side, np.float32).reshape(1, 1, 2, h // 16, 16) \
            + np.asarray(delta_side, np.float32)[..., None]
        return (coef[:, :, 0] * xg + coef[:, :, 1] * np.roll(xg, 1, axis=1)).reshape(b, w, h)


class LinearRingRead(Engine):
    """The ring read without mod C: the live interval [F - C, F) taken from slot 0 onward, so position p is
    read from slot p - (F - C) instead of p mod C."""

    def draft_attention(self, k_cache, v_cache, frontier, **kw):
        cap = np.shape(k_cache)[1]
        lo = [max(0, int(f) - cap) for f in np.asarray(frontier).reshape(-1)]
        kc, vc = (np.stack([np.roll(np.asarray(c)[i], lo[i], axis=0) for i in range(len(lo))])
                  for c in (k_cache, v_cache))
        return super().draft_attention(k_cache=kc, v_cache=vc, frontier=frontier, **kw)


class RowKeyedSampler(Engine):
    """speculative_accept with the batch row xor-ed into each request's seed (the row enters the key)."""

    def speculative_accept(self, seed, **kw):
        s = np.asarray(seed, np.uint64)
        return super().speculative_accept(seed=s ^ np.arange(s.size, dtype=np.uint64), **kw)


class MaskedAnchor(Engine):
    """masked_block's first column embedded from the mask token, not the committed anchor."""

    def masked_block(self, anchor, mask_token_id, **kw):
        return super().masked_block(anchor=np.full_like(np.asarray(anchor), mask_token_id),
                                    mask_token_id=mask_token_id, **kw)


class WholeBlock(Engine):
    """draft_attention over every block key: the live extent never reaches the mask."""

    def draft_attention(self, q, live, **kw):
        return super().draft_attention(q=q, live=np.full_like(np.asarray(live), np.shape(q)[1]), **kw)


class WeightFirstNorm(Engine):
    """The context norm normalizing the weighted features: (w x) / rms(w x) instead of w (x / rms(x))."""

    def feature_capture(self, block_outputs, fc_weight, hidden_norm, target_layer_ids, eps):
        r = np.asarray(block_outputs, np.float32)
        s = np.concatenate([r[int(i)] for i in target_layer_ids], axis=-1)
        y = numerics.storage(s @ np.asarray(fc_weight, np.float32).T, "bf16").astype(np.float32)
        y = y * np.asarray(hidden_norm, np.float32)
        out = y / np.sqrt(np.mean(y * y, axis=-1, keepdims=True) + np.float32(eps))
        return {"context": numerics.storage(out.astype(np.float64), "bf16")}


class InclusiveVocab(Engine):
    """candidate_topk's public-vocabulary test written gid <= vocab_size: the first padding id eligible."""

    def candidate_topk(self, vocab_size, **kw):
        return super().candidate_topk(vocab_size=int(vocab_size) + 1, **kw)


class RowsAsIds(Engine):
    """proposal_head on an indexed head returning the winning row number, not shortlist[row]."""

    def proposal_head(self, hidden, head, vocab_size, shortlist=None):
        out = super().proposal_head(hidden=hidden, head=head, vocab_size=vocab_size, shortlist=shortlist)
        if shortlist is None:
            return out
        first = {}
        for r, g in enumerate(np.asarray(shortlist).tolist()):
            first.setdefault(int(g), r)
        return {"tokens": np.vectorize(lambda t: first[int(t)], otypes=[np.int32])(out["tokens"])}


class SharedLengthRows(Engine):
    """draft_attention's block expanded into decode rows that share the block's last position: every row's
    window counted from there (row i of W sees S - (W - 1 - i) keys back from itself, at least one)."""

    def draft_attention(self, q, window, **kw):
        w = np.shape(q)[1]
        if int(window) <= 0:
            return super().draft_attention(q=q, window=window, **kw)
        cols = [super(SharedLengthRows, self).draft_attention(q=q, window=max(1, int(window) - (w - 1 - i)), **kw)
                ["out"][:, i] for i in range(w)]
        return {"out": np.stack(cols, axis=1)}


class NoMinP(Engine):
    """target_distribution without its min-p filter (the parameter accepted and dropped)."""

    def target_distribution(self, min_p, **kw):
        return super().target_distribution(min_p=np.zeros_like(np.asarray(min_p)), **kw)


class LeftOnlyStaircase(Engine):
    """A local layer's window written as a causal sliding window's: only keys more than S - 1 before the query
    are cut (p_q - p_k < S); keys after it, the block's later rows, all stay."""

    def draft_attention(self, **kw):
        from conformance.controls import engine as E
        from reference.draft_attention import key_positions

        def left_only(frontier, live, capacity, width, window):
            pos, present = key_positions(frontier, live, capacity, width)
            pq = np.asarray(frontier, np.int64)[:, None] + np.arange(width)
            mask = np.broadcast_to(present[:, None, :], (pos.shape[0], width, pos.shape[1]))
            return mask & (pq[:, :, None] - pos[:, None, :] < window) if window > 0 else mask

        plain, E.allowed = E.allowed, left_only
        try:
            return super().draft_attention(**kw)
        finally:
            E.allowed = plain


class Bf16RankedTopk(Engine):
    """candidate_topk ranking the scores as the model dtype holds them: the multiplier and softcap applied to
    the FP32 logits, rounded to BF16, then sorted (ties in BF16 go by row); the scores are the FP32 ones."""

    def candidate_topk(self, hidden, head, vocab_size, top_k, output_multiplier=0.0, softcap=0.0, shortlist=None):
        z = (np.asarray(hidden, np.float32) @ np.asarray(head, np.float32).T).astype(np.float32)
        u = z * np.float32(output_multiplier) if output_multiplier > 0 else z
        if softcap > 0:
            u = np.float32(softcap) * np.tanh(u / np.float32(softcap))
        gid = np.arange(np.shape(head)[0]) if shortlist is None else np.asarray(shortlist, np.int64)
        ranked = numerics.storage(u.astype(np.float64), "bf16")
        rows = np.argsort(np.where((gid >= 0) & (gid < int(vocab_size)), -ranked, np.inf), axis=-1,
                          kind="stable")[..., :int(top_k)]
        return {"scores": np.take_along_axis(u, rows, axis=-1).astype(np.float32), "ids": gid[rows].astype(np.int32)}


class AscendingCandidates(Engine):
    """The selector given its candidates in ascending score order (a top-k that returns them smallest
    first) and its path mapped back to the descending ranks."""

    def candidate_selector(self, scores, ids, **kw):
        k = np.shape(ids)[-1]
        out = super().candidate_selector(scores=np.ascontiguousarray(np.asarray(scores)[..., ::-1]),
                                         ids=np.ascontiguousarray(np.asarray(ids)[..., ::-1]), **kw)
        return {**out, "path": (k - 1 - out["path"]).astype(np.int32),
                "q": np.ascontiguousarray(out["q"][..., ::-1])}


class ChannelTiledConv(Engine):
    """The conv's dynamic delta indexed by channel c mod G (a broadcast over the wrong axis) instead of being
    shared by each group of 16 channels."""

    def _conv(self, x, base_side, delta_side):
        b, w, h = np.shape(x)
        g = h // 16
        d = np.asarray(delta_side, np.float32)[..., np.arange(h) % g]  # [B, W, 2, H]
        coef = np.asarray(base_side, np.float32)[None, None] + d
        x = np.asarray(x, np.float32)
        prev = np.concatenate([np.zeros_like(x[:, :1]), x[:, :-1]], axis=1)
        return (coef[:, :, 0] * x + coef[:, :, 1] * prev).astype(np.float32)


def _first_or_read_alike(r, fam: str, matches=False) -> bool:
    """The first family hypothesis of ``r`` is ``fam``, or ``fam`` is read too at the same confidence (a case
    two mechanisms explain alike), or (``matches``) the first is a catalogued mutant's match."""
    named = [h for h in hypotheses(r) if h.get("family")]
    return not named or named[0]["family"] == fam or (matches and named[0]["kind"] == "match") or any(
        h["family"] == fam and h.get("reading") and h["confidence"] == named[0]["confidence"] for h in named)


@pytest.mark.parametrize("impl,op,fam", [
    (RepeatHeads(), "draft_attention", "gqa_head_mapping"),
    (CausalBlock(), "draft_attention", "window"),
    (CausalLayer(), "draft_layer", "window"),
    (TruncatedStore(), "draft_attention", "rounding"),
    (RolledProposals(), "proposal_head", "next_token_shift"),
    (StackedCapture(), "feature_capture", "capture"),
    (DefaultTheta(), "context_kv", "rope"),
    (SwappedCodebooks(), "candidate_selector", "selector_first"),
    (LastMaxHead(), "proposal_head", "ties"),
    (FullAttention(), "draft_attention", "window"),
    (GemmaNorm(), "feature_capture", "norm"),
    (RolledConv(), "grouped_conv", "conv"),
    (LinearRingRead(), "draft_attention", "window"),
    (RowKeyedSampler(), "speculative_accept", "rng"),
    (MaskedAnchor(), "masked_block", "anchor_as_mask"),
    (WholeBlock(), "draft_attention", "extent"),
    (NoMinP(), "target_distribution", "filters"),
    (WeightFirstNorm(), "feature_capture", "norm"),
    (InclusiveVocab(), "candidate_topk", "vocab_pad"),
    (RowsAsIds(), "proposal_head", "shortlist_remap"),
    (SharedLengthRows(), "draft_attention", "window"),
    (LeftOnlyStaircase(), "draft_attention", "window"),
    (Bf16RankedTopk(), "candidate_topk", "ties"),
    (AscendingCandidates(), "candidate_selector", "ties"),
    (ChannelTiledConv(), "grouped_conv", "conv"),
], ids=["repeat_heads", "causal_block", "causal_layer", "truncated_store", "rolled_proposals", "stacked_capture",
        "default_theta", "swapped_codebooks", "last_max_head", "full_attention", "gemma_norm", "rolled_conv",
        "linear_ring_read", "row_keyed_sampler", "masked_anchor", "whole_block", "no_min_p",
        "weight_first_norm", "inclusive_vocab", "rows_as_ids",
        "shared_length_rows", "left_only_staircase", "bf16_ranked_topk", "ascending_candidates",
        "channel_tiled_conv"])
def test_a_family_bug_is_named_with_the_whole_family_removed(impl, op, fam):
    """No variant of the family is in the catalog: only the reading can name it. Every FAIL whose first
    hypothesis names a family names this one, or reads this family as well at the same confidence (a case
    that two mechanisms explain alike: a race whose draws any uniforms decide the same way), and the
    reading names it on most FAILs (the rest: a case too small for the signature to single the mechanism
    out)."""
    catalog = [m for m in mutants.MUTANTS if family(m) != fam]
    results = run_suite(impl, VECTORS, ops_pattern=op, diagnose=Diagnoser(max_cases=DIAGNOSED, catalog=catalog))
    summary(results)
    failing = [r for r in results if r.result == Result.FAIL][:DIAGNOSED]
    assert failing
    for r in failing:
        assert _first_or_read_alike(r, fam), (r.case, [h.get("family") for h in hypotheses(r)])
    firsts = [hypotheses(r)[0] for r in failing if hypotheses(r)]
    read = [h for h in firsts if h.get("family") == fam and h.get("reading")]
    assert len(read) * 2 > len(failing), (len(read), len(failing))
    assert all(math.isfinite(h["confidence"]) and h["evidence"] for h in read)


def test_a_mangled_seed_is_the_rng_a_moved_slot_the_ring_writer():
    seed = {"signature": "input transformed", "field": "seed", "transform": "its 32-bit words swapped"}
    assert _read("speculative_accept", seed) == "rng"
    assert _read("speculative_accept", {**seed, "field": "frontier"}) is None
    assert _read("context_kv", {"signature": "slots moved"}) == "window"
    assert _read("context_kv", {"signature": "shift by one", "output": "k_cache", "axis": 0}) == "window"
    assert _read("context_kv", {"signature": "shift by one", "output": "k_cache", "axis": 2}) is None  # heads
    assert _read("draft_attention", {"signature": "slots moved"}) is None


def test_interleaved_rope_in_a_layer_is_read_with_the_rope_family_removed():
    """The catalog's interleaved-RoPE draft_layer mutant, diagnosed without any rope variant: the pair-layout
    reading names it on most FAILs, and nothing else is named first."""
    m = next(x for x in mutants.MUTANTS if x.key == "rope_interleaved-draft_layer")
    catalog = [x for x in mutants.MUTANTS if family(x) != "rope"]
    results = run_suite(m, VECTORS, ops_pattern="draft_layer", diagnose=Diagnoser(max_cases=10**9, catalog=catalog))
    summary(results)
    failing = [r for r in results if r.result == Result.FAIL]
    firsts = [hypotheses(r)[0] for r in failing if hypotheses(r)]
    assert all(h.get("family") == "rope" for h in firsts if h.get("family")), [h.get("family") for h in firsts]
    assert sum(h.get("reading") == "pair layout" for h in firsts) * 2 > len(failing)


def test_a_rerun_reading_unwritten_slots_does_not_widen_the_allowance():
    """With frontier + 1 the reference reads a ring slot never written (values far larger than the case's):
    its magnitude scale must not become the allowance, or any bug would conform to it. Here the
    interleaved-RoPE layer, on a case whose frontier + 1 rerun differs from the reference by hundreds."""
    from conformance import registry
    from conformance.diagnosis import structure
    from conformance.diagnosis.match import fresh
    from conformance.vectors import case_path, parse_vector

    case = "draft_layer/dflash_full_F1_W2"
    vec = parse_vector(case_path(VECTORS, case).read_bytes(), case)
    spec = registry.get(vec.op)
    m = next(x for x in mutants.MUTANTS if x.key == "rope_interleaved-draft_layer")
    impl = m.draft_layer(**fresh(vec))
    moved = dict(spec.reference(**{**fresh(vec), "frontier": np.asarray(fresh(vec)["frontier"]) + 1}))
    assert np.nanmax(np.abs(np.asarray(moved["x_next"], float) - np.asarray(vec.expected["x_next"], float))) > 100
    assert not [s for s in structure._offset_signatures(vec, spec, impl) if s["field"] == "frontier"]
    assert [s["signature"] for s in structure._pair_layout_signature(vec, spec, impl)] == ["pair layout"]


def test_the_new_readings_name_their_family_only_on_their_ops():
    assert _read("feature_capture", {"signature": "input transformed", "field": "target_layer_ids",
                                     "transform": "in reverse order"}) == "capture"
    swap = {"signature": "inputs exchanged", "fields": ("w_succ", "w_pred")}
    assert _read("candidate_selector", swap) == "selector_first"
    assert _read("candidate_selector", {**swap, "fields": ("w_hidden", "w_pred")}) is None
    assert _read("context_kv", {"signature": "rotation"}) == "rope"
    assert _read("draft_layer", {"signature": "pair layout"}) == "rope"
    windows = {"signature": "input off by one", "field": "windows", "step": 1}
    assert _read("masked_block", windows) == "window"


def test_a_counter_built_another_way_is_read_as_the_rng():
    """The Philox counter's words reordered (purpose and index first): the reference rerun with that counter
    is the only way the diagnosis can reproduce it, and the reference's own builder is restored after."""
    from conformance import registry
    from conformance.diagnosis import structure
    from conformance.diagnosis.match import fresh
    from conformance.runner import load_selection, read_entry
    from reference import rng

    plain = rng.counter_of
    m = next(x for x in mutants.MUTANTS if x.key == "rng_counter-words_swapped")
    spec = registry.get("speculative_accept")
    _, entries = load_selection(VECTORS)
    read = failing = 0
    for e in entries:
        if not e["case"].startswith("speculative_accept/"):
            continue
        vec = read_entry(VECTORS, e)
        impl = m.speculative_accept(**fresh(vec))
        if structure._conforms(vec, spec, impl, lambda vec=vec: fresh(vec)) != Result.FAIL:
            continue
        failing += 1
        sigs = structure._counter_signatures(vec, spec, impl)
        read += any(s["transform"].startswith("its words in the order") for s in sigs)
        assert rng.counter_of is plain
    assert failing and read * 2 > failing, (read, failing)
    assert _read("speculative_accept", {"signature": "counter transformed", "transform": "x"}) == "rng"


@pytest.mark.parametrize("key,fam,rule", [("accept_p_q_swapped", "accept_test", "_accept_distance"),
                                          ("residual_no_clamp", "residual", "_correction_weights"),
                                          ("bonus_from_wrong_row", "bonus_from_wrong_row", "_bonus_row"),
                                          ("selector_predecessor_row", "selector_first", "_walked"),
                                          ("preview_cut_before_eos", "preview_cut_before_eos", "preview_length"),
                                          ("sibling_residual", "residual", "_after_rejection"),
                                          ("left_only_window", "window", "_in_window"),
                                          ("bf16_tie", "ties", "_ranked"),
                                          ("filter_boundary-top_p_drops_crossing", "filters", "_top_p_count")])
def test_a_scan_rule_written_another_way_is_read_with_its_family_removed(key, fam, rule):
    """speculative_accept's accept comparison (p and q exchanged), its correction distribution (p, not the
    residual) or its bonus row (P - 1), candidate_selector's walk (from each step's argmax), tree_verify's
    siblings (no residual update between them), the attention's window (left side only), the top-k's ranked
    values (BF16 scores), top-p's boundary (the crossing token dropped), diagnosed without any variant of
    the family: the rule reading names it on most FAILs, no other family is named first but by a match or
    by a reading of the same confidence (a case on which the bug conforms to another family's mutant or
    reading cannot tell the two apart), and the reference's own rule is back in place afterwards."""
    import importlib

    m = next(x for x in mutants.MUTANTS if x.key == key)
    sa = importlib.import_module(f"reference.{m.op}")
    plain = getattr(sa, rule)
    catalog = [x for x in mutants.MUTANTS if family(x) != fam]
    results = run_suite(m, VECTORS, ops_pattern=m.op, diagnose=Diagnoser(max_cases=DIAGNOSED, catalog=catalog))
    summary(results)
    failing = [r for r in results if r.result == Result.FAIL][:DIAGNOSED]
    assert failing and all(_first_or_read_alike(r, fam, matches=True) for r in failing), \
        [[h.get("family") for h in hypotheses(r)][:3] for r in failing]
    firsts = [hypotheses(r)[0] for r in failing if hypotheses(r)]
    assert sum(h.get("reading") == "rule changed" for h in firsts) * 2 > len(failing)
    assert getattr(sa, rule) is plain
