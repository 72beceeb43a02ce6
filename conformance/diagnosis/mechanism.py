"""Family readings: structural signatures that are, on their own, a family's mechanism.

A structural signature (``structure``) says what the error looks like and names no pitfall. Some
signatures, on a given Op, can only come from one catalogued mechanism, whatever its details, so
they name that family without any variant of the catalog having to reproduce the bug (an engine's
bug is rarely one of the written variants). Most are reruns of the reference that the
implementation conforms to (within the allowance, ``structure._conforms``), on inputs transformed or
with one rule of the reference written another way, each the common slip of one mechanism:

- ``window``: on the attention Ops, the window (masked_block: each layer's) one larger or smaller,
  or 0 (the window dropped); the ring read one slot off (draft_attention: ``frontier`` +-1) or at
  an offset (each batch row's ring rotated); a causal mask or rows' windows of other sizes (each
  query row the reference at another live extent or window; the window's rule bounding only the keys
  before the query, or every row's window starting from the block's last position); on context_kv,
  cache rows stored in other slots or left unwritten (the ring's writer).
- ``extent``: rows or proposals past the live extent (a row extent; ``live`` at the full width).
- ``rng``: the Philox key from the seed another way (words swapped or lost, the batch row mixed in,
  row 0's seed everywhere), the counter built another way (words reordered, the purpose or index
  base off by one), the draws' position off by one (speculative_accept, tree_verify).
- ``gqa_head_mapping``: query heads reading other KV heads than h // G (draft_attention: any map;
  draft_layer, masked_block: the tiled map h % Hk).
- ``next_token_shift``: proposal_head's tokens moved one column along the proposal axis.
- ``norm``: feature_capture off by sqrt(n)^+-1 (a sum for the mean); a norm weight read as 1 + w or
  w - 1; the context norm's formula another way (the weight before the statistics, eps outside the
  root, the sum of squares).
- ``rounding``: values off the format they must follow; a uniform shrink below 2^-7 with at least
  ``TOWARD_ZERO`` of the differing elements smaller (truncation at a store).
- ``rope``: context_kv's K vectors turned by another rotation (norms kept, positions below 2^24, so
  not a position's value); a layer's RoPE on interleaved pairs.
- ``capture``: the block ids misread (one late or early, reversed, sorted), each id the previous
  block's output, the last block read after a final norm.
- ``conv``: the grouped conv's taps exchanged, shifted the other way, wrapping at column 0, its
  delta read group-major or indexed per channel.
- ``ties``: ids that differ only between exactly tied logits (rows not all tied); the top-k ranking the
  transformed scores rounded to BF16; the selector's candidates walked in reverse rank order.
- ``selector_first``: the codebooks exchanged; the walk continued from each step's argmax.
- ``accept_test``, ``residual``, ``bonus_from_wrong_row``: speculative_accept's accept test with p
  and q exchanged or without q; the correction from p, not the residual; the bonus from row P - 1;
  tree_verify's siblings tested without the residual update between them.
- ``filters``: a sampling parameter (or every penalty) never applied (its neutral value); top-p's
  boundary strict, or dropping the token that crosses it.
- ``vocab_pad``: vocab_size off by one, or the padded rows eligible; ``shortlist_remap``: head rows
  returned for ids; ``anchor_as_mask``: the anchor embedded as the mask token;
  ``preview_cut_before_eos``: the preview's cut at a stop token one token off.

Each reading keeps the signature's confidence and evidence and is placed just before it (the
diagnosis ranks readings before nearest mutants). The readings were chosen from what each mechanism
does to the output; several reproduce a catalogued mutant's own transform, which
docs/reports/diagnosis.md says and counts. tests/diagnosis checks that no legitimate variant and no
bug outside the families is read as one; ``DECISIVE`` lists the (Op, family) pairs whose reading
always fires, where weaker evidence may then not name the family.
"""

from __future__ import annotations

import math

import numpy as np

from conformance.diagnosis.structure import NORM_WEIGHT_FORMS as NORM_FORMS

ATTENTION_OPS = ("draft_attention", "draft_layer", "masked_block")
UNIFORM_OPS = ("speculative_accept", "tree_verify")
NORM_TOLERANCE = 0.01
TRUNCATION = 2.0 ** -7
TOWARD_ZERO = 0.9


# (Op, family) whose reading sees every bug of the family on the Op (the mechanism always leaves its
# signature there): where the reading is silent, the family is not named from weaker evidence either
DECISIVE = {("proposal_head", "next_token_shift"), ("draft_attention", "gqa_head_mapping")}


# a reference rule swapped in a rerun (``structure``'s "rule changed"): the family it belongs to, and why
RULE_FAMILIES = {
    "_accept_distance": ("accept_test", "the accept test compares another pair than U q(d) < p(d)"),
    "_correction_weights": ("residual", "the correction not drawn from the residual max(p - q, 0)"),
    "_bonus_row": ("bonus_from_wrong_row", "the bonus drawn from another logit row than P"),
    "_walked": ("selector_first", "the walk's next predecessor taken from another rank than the chosen one"),
    "preview_length": ("preview_cut_before_eos", "the preview's cut at a stop token one token off"),
    "_in_window": ("window", "the local window's rule written another way than |p_k - p_q| < S"),
    "_ranked": ("ties", "the top-k ranking other values than the raw logits, so that they tie"),
    "_top_p_count": ("filters", "top-p's boundary placed another way than the shortest prefix reaching top_p"),
    "_after_rejection": ("residual", "the rejected draft's mass not removed before the next sibling's test"),
}
# signatures that are their family's mechanism on whatever Op they come from (the ring's on the attention
# Ops): the family, and why (formatted with the signature's fields)
SIGNATURE_FAMILIES = {
    "norm formula": ("norm", "the RMSNorm computed with {formula}"),
    "rows for ids": ("shortlist_remap", "an indexed head's row numbers returned, not shortlist[row]"),
    "input ignored": ("filters", "{fields} never applied"),
    "counter transformed": ("rng", "the Philox counter built with {transform}"),
    "row windows": ("window", "the rows' window edges placed from other positions than their own"),
    "ring rotated": ("window", "the context ring read at an offset (its live interval taken from another slot)"),
    "conv layout": ("conv", "the grouped conv's layout: {layout}"),
    "tied order": ("ties", "exact ties broken another way than toward the lowest row"),
    "ranks mirrored": ("ties", "the candidates walked from the last rank (greedy ties to the higher rank)"),
}


def _family(shape: dict, fam: str, why: str) -> dict:
    return {"kind": "family", "family": fam, "reading": shape["signature"],
            "text": f"a bug of the `{fam}` family (docs/pitfalls.md): {why}",
            "evidence": f"{shape['text']}: {shape['evidence']}", "confidence": shape["confidence"]}


def _toward_zero(x, r) -> float:
    """The fraction of the differing finite elements of x smaller in magnitude than r's."""
    with np.errstate(all="ignore"):
        x, r = np.asarray(x, np.float64), np.asarray(r, np.float64)
        if x.shape != r.shape:
            return 0.0
        ok = np.isfinite(x) & np.isfinite(r) & (x != r)
        return float((np.abs(x[ok]) < np.abs(r[ok])).mean()) if ok.any() else 0.0


def _reading(op: str, vec, impl, s: dict) -> dict | None:
    sig = s.get("signature")
    if sig == "input off by one":
        field, step = s.get("field"), s.get("step")
        if field in ("window", "windows") and op in ATTENTION_OPS:
            return _family(s, "window", f"the window's edge one key {'wider' if step > 0 else 'narrower'}")
        if field == "frontier" and op == "draft_attention":
            return _family(s, "window", "the context ring read one slot off (every key's position moved by "
                                        f"{step:+d})")
        if field == "vocab_size":
            return _family(s, "vocab_pad", f"the public vocabulary's bound off by one ({step:+d})")
        if field == "frontier" and op in UNIFORM_OPS:
            return _family(s, "rng", f"the uniforms drawn at position {step:+d} (C3's position counter)")
        return None
    if op == "context_kv" and (sig == "slots moved" or (sig in ("shift by one", "permutation") and s.get("axis") == 0
                                                       and s.get("output") in ("k_cache", "v_cache"))):
        return _family(s, "window", "the ring's writer stores rows in other slots")
    if sig == "row extent" and s.get("extent") == "causal":
        return _family(s, "window", "a causal mask over the block's keys")
    if sig == "row extent" and s.get("extent") == "beyond live":
        return _family(s, "extent", "rows attend to block keys past the live extent")
    if sig == "off format":
        return _family(s, "rounding", f"the rounding to {s.get('format')} skipped before the store")
    if sig == "head map":
        return _family(s, "gqa_head_mapping", "query heads mapped to KV heads another way than h // G")
    if sig == "input transformed" and s.get("field") == "target_layer_ids":
        return _family(s, "capture", f"the target blocks read {s.get('transform')}")
    if sig == "inputs exchanged" and op == "candidate_selector" and set(s.get("fields", ())) == {"w_pred", "w_succ"}:
        return _family(s, "selector_first", "the predecessor and successor codebooks under each other's names")
    if sig == "rotation":
        return _family(s, "rope", "each key rotated another way than the spec's RoPE, at positions too small for "
                                  "a position's value to be wrong")
    if sig == "pair layout":
        return _family(s, "rope", "RoPE rotating interleaved pairs where the spec rotates split halves")
    if sig == "input transformed" and s.get("field") in ("window", "windows") and op in ATTENTION_OPS:
        return _family(s, "window", "the sliding window ignored: full attention")
    if sig == "input transformed" and str(s.get("field", "")).endswith("norm") and s.get("transform") in NORM_FORMS:
        return _family(s, "norm", f"the RMSNorm weight `{s['field']}` {s['transform']}")
    if sig == "input transformed" and s.get("field") == "vocab_size":
        return _family(s, "vocab_pad", "the padded vocabulary rows eligible")
    if sig == "input transformed" and s.get("field") == "anchor" and op == "masked_block":
        return _family(s, "anchor_as_mask", "the anchor embedded as the mask token")
    if sig == "input transformed" and s.get("field") in ("live", "live_proposals"):
        return _family(s, "extent", "rows or proposals past the live extent used")
    if sig == "rule changed" and s.get("rule") in RULE_FAMILIES:
        return _family(s, *RULE_FAMILIES[s["rule"]])
    if sig in SIGNATURE_FAMILIES and (sig != "ring rotated" or op in ATTENTION_OPS):
        fam, why = SIGNATURE_FAMILIES[sig]
        return _family(s, fam, why.format(**{"layout": "", "formula": "", "transform": "", **s,
                                            "fields": ", ".join(s.get("fields", ()))}))
    if sig == "input transformed" and s.get("field") == "seed":
        return _family(s, "rng", f"the key built from the seed with {s.get('transform')}")
    if op == "proposal_head" and s.get("output") == "tokens" and s.get("axis") == 1 and (
            sig == "shift by one" or (sig == "permutation" and s.get("rotation") is not None)):
        return _family(s, "next_token_shift", "each proposal column holds its neighbour's token")
    if sig == "constant scale" and "factor" in s:
        c = float(s["factor"])
        if op == "feature_capture":
            n = int(np.shape(vec.expected[s["output"]])[-1]) if s.get("output") in vec.expected else 0
            if n > 1 and any(abs(c * f - 1.0) <= NORM_TOLERANCE for f in (math.sqrt(n), 1.0 / math.sqrt(n))):
                return _family(s, "norm", f"the output off by sqrt({n})^{'-1' if c < 1 else '1'}, the normalised "
                                          "width: a sum where the RMS takes the mean")
        out = s.get("output")
        if 1.0 - TRUNCATION < c < 1.0 and out in impl and out in vec.expected \
                and _toward_zero(impl[out], vec.expected[out]) >= TOWARD_ZERO:
            return _family(s, "rounding", f"every element shrunk by {1.0 - c:.2g} (< 2^-7): truncation toward zero "
                                          "at a store")
    return None


def readings(vec, impl, shapes: list[dict]) -> list[dict]:
    """``shapes`` (signatures of the implementation's outputs ``impl``) with each signature that reads as
    a family preceded by that family hypothesis (once a family)."""
    out, named = [], set()
    for s in shapes:
        h = _reading(vec.op, vec, impl, s)
        if h is not None and h["family"] not in named:
            named.add(h["family"])
            out.append(h)
        out.append(s)
    return out
