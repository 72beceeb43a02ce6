"""Structural signatures of a difference, implementation against reference.

Each is a shape of the error an engineer reads first: a permutation of heads, rows, taps or layers
along an axis; a shift by one along an axis; a mirrored order; a constant scale; only the last
element, or only the boundary, of an axis differing; draft_attention's query heads reading other KV
heads than h // G (a head map), or its rows seeing other block extents than live (a row extent);
values off the format they must follow (V not a BF16 value); context_kv's cache rows stored in other
slots; the whole output as the reference's with one input off by one (a position, a window, a start:
where the Op draws uniforms, an RNG counter field), or with one input mishandled the common ways (a
64-bit input's words swapped or one lost, row 0's value in every row, a parameter left neutral, two
weights exchanged, block ids misread); the whole output as the reference's with one of its rules
written another way (the Philox counter's layout, speculative_accept's accept test, correction and
bonus row, the selector's walk, the preview's cut, the context norm's formula, the attention's window,
the top-k's ranked values, tree_verify's residual between siblings, top-p's boundary: the reference's
function swapped for the rerun and restored after); the selector's candidates in reverse rank order;
K vectors turned keeping their norms; ids that differ only between tied logits; the grouped conv's
tap layout. Reruns are judged with the suite's
own comparison, their magnitude scales capped at the vector's (``_tighter``). None of them names a
catalogued pitfall: a signature is what the error looks like, not which bug made it
(``diagnosis.mechanism`` reads those that are on their own a family's mechanism). Each comes with
its evidence; nothing is returned without it.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

import numpy as np

from conformance import compare
from conformance.compare import Result
from conformance.diagnosis.explain import error_map
from conformance.diagnosis.match import fresh
from conformance.mutants.base import _gqa_perm, _reorder_heads, _split_of_interleaved
from conformance.registry import REPRESENTED
from reference import numerics

MAX_AXIS = 64  # permutations are searched along axes up to this size
# integer inputs whose off-by-one is a classic: positions and counters, window bounds, starts
OFFSET_FIELDS = ("frontier", "start", "window", "position", "positions", "windows", "vocab_size")
RNG_INPUTS = ("seed",)
WINDOW_FIELDS = ("window", "windows")  # a sliding window's size (0: none), one per layer for masked_block
OFF_FORMAT = 0.9  # of the differing elements off the values' format: a skipped rounding


def _close(o, bound, x, r, mask, scale) -> np.ndarray:
    return error_map(o, bound, x, r, mask, scale) <= 2.0


def _label(name: str, shape: tuple, axis: int) -> str:
    return f"{name} axis {axis} (of {list(shape)})"


def _axis_signatures(name, o, bound, x, r, mask, scale, diff) -> list[dict]:
    found = []
    x, r = np.asarray(x), np.asarray(r)
    if x.shape != r.shape or x.ndim == 0 or not diff.any():
        return found
    if o.cls == REPRESENTED:
        with np.errstate(all="ignore"):
            found += _value_signatures(name, o, bound, x, r, mask, scale)
            found += _format_signature(name, o, x, mask, diff)
    found += _index_signatures(name, o, bound, x, r, mask, scale, diff)
    return found


def _value_signatures(name, o, bound, x, r, mask, scale) -> list[dict]:
    found = []
    x64, r64 = x.astype(np.float64), r.astype(np.float64)
    ok = mask & np.isfinite(x64) & np.isfinite(r64)
    if ok.sum() < 4:
        return found
    rr = float(np.sum(np.where(ok, r64 * r64, 0.0)))
    if rr > 0:
        c = float(np.sum(np.where(ok, x64 * r64, 0.0))) / rr
        if abs(c - 1.0) > 1e-3 and np.isfinite(c) and _close(o, bound, x64, c * r64, mask, scale).all():
            found.append({"signature": "constant scale", "output": name, "factor": c,
                          "text": f"{name} is the reference times {c:.6g}",
                          "evidence": f"every compared element of {name} within the allowance of {c:.6g} x "
                                      "the reference", "confidence": 0.8})
    c = float(np.mean((x64 - r64)[ok]))
    if c != 0 and np.isfinite(c) and _close(o, bound, x64, r64 + c, mask, scale).all():
        found.append({"signature": "constant offset", "text": f"{name} is the reference plus {c:.6g}",
                      "evidence": f"every compared element of {name} within the allowance of the reference "
                                  f"+ {c:.6g}", "confidence": 0.8})
    return found


def _format_signature(name, o, x, mask, diff) -> list[dict]:
    """Most differing elements (``OFF_FORMAT``) hold values outside the format the output's values must
    follow (V a BF16 value stored as FP16): a rounding to that format skipped."""
    if o.cls != REPRESENTED or o.value_fmt == o.fmt:
        return []
    x64 = np.asarray(x).astype(np.float64)
    fin = np.isfinite(x64)
    held = np.where(fin, numerics.storage(np.where(fin, x64, 0.0), o.value_fmt).astype(np.float64), x64)
    off = fin & (held != x64) & mask
    d = int((diff & mask).sum())
    k = int((off & diff).sum())
    if d == 0 or k < OFF_FORMAT * d:
        return []
    return [{"signature": "off format", "output": name, "format": o.value_fmt,
             "text": f"{name} holds values that are not {o.value_fmt} values",
             "evidence": f"{k} of the {d} differing elements of {name} are off the {o.value_fmt} grid its values "
                         f"must lie on", "confidence": 0.8}]


def _index_signatures(name, o, bound, x, r, mask, scale, diff) -> list[dict]:
    found = []
    for a in range(x.ndim):
        n = x.shape[a]
        if n < 2:
            continue
        where = np.moveaxis(diff, a, 0).reshape(n, -1).any(axis=1)
        lab = _label(name, x.shape, a)
        if diff.sum() < 2:  # one differing element has no "only" about it
            pass
        elif n >= 3 and where[-1] and not where[:-1].any():
            found.append({"signature": "last element only", "text": f"only the last index of {lab} differs",
                          "evidence": f"{int(diff.sum())} differing elements, all at index {n - 1} of axis {a}",
                          "confidence": 0.5})
        elif n >= 3 and (where[0] or where[-1]) and not where[1:-1].any():
            at = [i for i in (0, n - 1) if where[i]]
            found.append({"signature": "boundary only", "text": f"only the boundary of {lab} differs (index "
                          f"{' and '.join(map(str, at))})", "evidence": f"{int(diff.sum())} differing elements, all "
                          f"at the edge of axis {a}", "confidence": 0.5})
        xs, rs, ms = np.moveaxis(x, a, 0), np.moveaxis(r, a, 0), np.moveaxis(mask, a, 0)
        ss = None if scale is None or np.shape(scale) != x.shape else np.moveaxis(np.asarray(scale), a, 0)

        def same(i, j, xs=xs, rs=rs, ms=ms, ss=ss):
            # every element compared at i must have a compared counterpart at j
            if (ms[i] & ~ms[j]).any():
                return False
            return bool(_close(o, bound, xs[i], rs[j], ms[i], None if ss is None else ss[j]).all())

        if all(same(i, n - 1 - i) for i in range(n)):
            found.append({"signature": "mirrored", "text": f"{lab} in reverse order",
                          "evidence": f"index i of axis {a} holds the reference's index {n - 1} - i, every element "
                                      "within the allowance", "confidence": 0.8})
            continue
        for step in (1, -1):
            idx = range(1, n) if step == 1 else range(n - 1)
            changed = [i for i in idx if where[i]]
            if changed and all(same(i, i - step) for i in idx):
                found.append({"signature": "shift by one", "output": name, "axis": a, "step": step,
                              "text": f"{lab} shifted by {step:+d} (index i holds the "
                              f"reference's i {'-' if step == 1 else '+'} 1)",
                              "evidence": f"{len(changed)} differing indices of axis {a}, each equal within the "
                                          "allowance to its neighbour in the reference", "confidence": 0.7})
                break
        if n <= MAX_AXIS and where.any():
            perm = []
            for i in range(n):
                js = [j for j in range(n) if j not in perm and same(i, j)]
                if not js:
                    perm = None
                    break
                perm.append(i if i in js else js[0])
            if perm is not None and perm != list(range(n)) and len(set(perm)) == n:
                moved = [f"{i}<-{j}" for i, j in enumerate(perm) if i != j]
                # a cyclic rotation (index i holds the reference's i - s, wrapping): s, else None
                rot = next((s for s in (1, -1) if all(j == (i - s) % n for i, j in enumerate(perm))), None)
                found.append({"signature": "permutation", "output": name, "axis": a, "rotation": rot,
                              "text": f"{lab} permuted: {', '.join(moved[:8])}" + (" ..." if len(moved) > 8 else ""),
                              "evidence": f"each index of axis {a} equals (within the allowance) another index of "
                                          "the reference, a one-to-one map", "confidence": 0.8})
    return found


def _tighter(key: str, s, vec):
    """A rerun's magnitude scale capped at the largest of the vector's own: a rerun whose inputs put large
    values in play (a ring slot read that was never written) must not widen the allowance that judges
    the implementation against it, while an element the rerun makes nonzero (a token a filter kept)
    keeps its own scale."""
    own = vec.expected.get(key)
    if own is None or not np.size(own):
        return s
    with np.errstate(invalid="ignore"):
        cap = np.nanmax(np.asarray(own, np.float64))
        return np.fmin(np.asarray(s, np.float64), cap) if np.isfinite(cap) else s


def _conforms(vec, spec, impl: Mapping, kwargs):
    """The implementation's verdict against the reference rerun on ``kwargs()`` (fresh inputs each call),
    its allowance no wider than the vector's own (``_tighter``); None where the reference refuses them."""
    try:
        with np.errstate(all="ignore"):
            ref = dict(spec.reference(**kwargs()))
            if spec.scales is not None:
                for k, s in spec.scales(kwargs(), ref).items():
                    key = k if "." in k else f"{k}.scale"
                    ref[key] = _tighter(key, s, vec)
            return compare.compare(vec.outputs, ref, impl, vec.masks, vec.bounds, spec.force, kwargs,
                                   spec.independent, spec=spec).result
    except Exception:  # noqa: BLE001 - an input the reference refuses: no signature
        return None


def _offset(value, step: int, field: str):
    """``value`` moved by ``step``: an array or a scalar, or a list (masked_block's per-layer ``windows``:
    each bounded window moved, 0 meaning none stays 0) kept a list of ints."""
    if isinstance(value, (list, tuple)):
        moved = [int(x) + step if (field != "windows" or int(x) > 0) else int(x) for x in value]
        return type(value)(moved)
    if np.ndim(value):
        return (np.asarray(value) + step).astype(np.asarray(value).dtype)
    return type(value)(int(value) + step)


def _offset_signatures(vec, spec, impl: Mapping) -> list[dict]:
    if spec is None:
        return []
    found = []
    kw0 = fresh(vec)
    rng = any(k in kw0 for k in RNG_INPUTS)
    for field in OFFSET_FIELDS:
        if field not in kw0:
            continue
        v = np.asarray(kw0[field])
        if v.dtype.kind not in "iu" or v.size == 0:
            continue
        for step in (1, -1):
            def kwargs(field=field, step=step):
                kw = fresh(vec)
                kw[field] = _offset(kw[field], step, field)
                return kw
            result = _conforms(vec, spec, impl, kwargs)
            if result in (Result.PASS, Result.ACCEPTABLE):
                what = "a position / RNG counter field" if rng and field != "window" else "an input"
                found.append({"signature": "input off by one", "field": field, "step": step,
                              "text": f"the reference's output with `{field}` {step:+d} ({what})",
                              "evidence": f"the implementation is {result.name} against the reference "
                                          f"rerun with {field} {step:+d}", "confidence": 0.85})
    return found


def _transformed(field: str, what: str, how: str, result) -> dict:
    """The signature of a conforming rerun with ``field`` transformed (``how``: the transform in words)."""
    return {"signature": "input transformed", "field": field, "transform": what,
            "text": f"the reference's output with {how}",
            "evidence": f"the implementation is {result.name} against the reference rerun with {how}",
            "confidence": 0.85}


_M32 = np.uint64(0xFFFFFFFF)
# how a 64-bit integer input is commonly mangled: its two 32-bit words exchanged, or one of them lost
WORD_TRANSFORMS = {
    "its 32-bit words swapped": lambda a: ((a & _M32) << np.uint64(32)) | (a >> np.uint64(32)),
    "its high word dropped": lambda a: a & _M32,
    "its low word dropped": lambda a: a & ~_M32,
}


# how a per-row seed is commonly keyed by the batch row (C3: the row never enters the key)
ROW_SEED_TRANSFORMS = {
    "the batch row mixed in (seed xor row)": lambda a: a ^ np.arange(a.size, dtype=np.uint64).reshape(a.shape),
    "the batch row added (seed + row)": lambda a: a + np.arange(a.size, dtype=np.uint64).reshape(a.shape),
}
# how C3's counter (position lo, position hi, purpose, index) is commonly built another way
COUNTER_FORMS = {
    "its words in the order (purpose, index, position lo, position hi)": lambda c: c[..., [2, 3, 0, 1]],
    "its two position words swapped": lambda c: c[..., [1, 0, 2, 3]],
    "its purpose and index words swapped": lambda c: c[..., [0, 1, 3, 2]],
    "purpose codes counted from 0": lambda c: _word_plus(c, 2, -1),
    "purpose codes counted from 2": lambda c: _word_plus(c, 2, 1),
    "draw indices counted from 1": lambda c: _word_plus(c, 3, 1),
    "the correction's draws keyed with the accept test's purpose": lambda c: _purpose_as(c, 3, 2),
}


def _purpose_as(c, purpose: int, other: int):
    """Every counter of ``purpose`` built with ``other`` instead (one stream's draws reused for another)."""
    c = np.array(c, dtype=np.uint64, copy=True)
    c[..., 2] = np.where(c[..., 2] == purpose, np.uint64(other), c[..., 2])
    return c


COUNTER_OPS = ("speculative_accept", "tree_verify", "candidate_selector")  # the Ops that draw C3 uniforms


def _word_plus(c, word: int, step: int):
    c = np.array(c, dtype=np.uint64, copy=True)
    c[..., word] = (c[..., word].astype(np.int64) + step).astype(np.uint64) & np.uint64(0xFFFFFFFF)
    return c


# the sampling parameters (C5) and the value at which each one does nothing
NEUTRAL = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "repetition_penalty": 1.0,
           "frequency_penalty": 0.0, "presence_penalty": 0.0}
PENALTIES = ("repetition_penalty", "frequency_penalty", "presence_penalty")


def _ignored_signatures(vec, spec, impl: Mapping) -> list[dict]:
    """The implementation conforms to the reference rerun with one sampling parameter (or every penalty)
    at its neutral value (``NEUTRAL``) in every row: that parameter never reached the computation."""
    if spec is None:
        return []
    kw0 = fresh(vec)
    groups = {f: (f,) for f in NEUTRAL if f in kw0}
    if sum(f in kw0 for f in PENALTIES) > 1:
        groups["the penalties"] = tuple(f for f in PENALTIES if f in kw0)
    found = []
    for what, fields in groups.items():
        if all(np.all(np.asarray(kw0[f]) == NEUTRAL[f]) for f in fields):  # already neutral: no evidence
            continue

        def kwargs(fields=fields):
            kw = fresh(vec)
            for f in fields:
                kw[f] = np.full_like(np.asarray(kw[f]), NEUTRAL[f]) if np.ndim(kw[f]) else type(kw[f])(NEUTRAL[f])
            return kw
        result = _conforms(vec, spec, impl, kwargs)
        if result in (Result.PASS, Result.ACCEPTABLE):
            name = what if len(fields) > 1 else f"`{what}`"
            found.append({"signature": "input ignored", "fields": fields,
                          "text": f"the reference's output with {name} ignored (neutral in every row)",
                          "evidence": f"the implementation is {result.name} against the reference rerun with {name} "
                                      "at its neutral value", "confidence": 0.85})
    return found


def _full_extent(op: str, kw: Mapping) -> int | None:
    """The width a live-extent input can reach on ``op`` (every row or proposal slot live); None where
    the Op has none."""
    if op == "draft_attention":
        return np.shape(kw["q"])[1]
    if op == "draft_layer":
        return np.shape(kw["x"])[1]
    if op == "masked_block":
        return int(kw["num_drafts"]) + 1
    if op == "speculative_accept":
        return np.shape(kw["proposals"])[1]
    return None


# speculative_accept's rules as they are commonly written another way: (the reference function the rule
# lives in, what the rule becomes, the function that replaces it)
ACCEPT_RULES = (
    ("_accept_distance", "the accept test with p and q exchanged (U p(d) < q(d))",
     lambda p_d, q_d, u: float(q_d - u * p_d)),
    ("_accept_distance", "the accept test without q (U < p(d))", lambda p_d, q_d, u: float(p_d - u)),
    ("_correction_weights", "the correction drawn from p, not from the residual max(p - q, 0)",
     lambda p, qv: p),
    ("_bonus_row", "the bonus drawn from the last proposal's row (P - 1), not row P", lambda live: live - 1),
)


def _patched(vec, spec, impl, module, swaps: Mapping):
    """The implementation's verdict against the reference rerun with each ``module.<name>`` of ``swaps``
    replaced (restored after, whatever happens)."""
    plain = {name: getattr(module, name) for name in swaps}
    for name, replacement in swaps.items():
        setattr(module, name, replacement)
    try:
        return _conforms(vec, spec, impl, lambda: fresh(vec))
    finally:
        for name, f in plain.items():
            setattr(module, name, f)


def _counter_signatures(vec, spec, impl: Mapping) -> list[dict]:
    """On an Op with a seed (it draws C3 uniforms): the implementation conforms to the reference rerun with
    every Philox counter built another way (``COUNTER_FORMS``: words reordered, a field's base off by
    one). The reference's counter builder is swapped for the rerun and restored after."""
    if spec is None or vec.op not in COUNTER_OPS:
        return []
    from reference import rng

    found = []
    plain = rng.counter_of
    for what, f in COUNTER_FORMS.items():
        result = _patched(vec, spec, impl, rng, {"counter_of": lambda *a, f=f, **k: f(plain(*a, **k))})
        if result in (Result.PASS, Result.ACCEPTABLE):
            found.append({"signature": "counter transformed", "transform": what,
                          "text": f"the reference's draws with the Philox counter's {what}",
                          "evidence": f"the implementation is {result.name} against the reference rerun with every "
                                      f"counter's {what}", "confidence": 0.85})
    return found


def _stop_cut(step: int):
    """preview_commit's preview length with the cut at the first EOS or stop token moved by ``step``
    (-1: the stop token itself dropped; +1: the token after it kept, within the licensed ones)."""
    def length(tokens, num_out, budget, cancel, eos_ids, stop_ids) -> int:
        if cancel:
            return 0
        ends = np.isin(tokens[:num_out], np.concatenate([np.ravel(eos_ids), np.ravel(stop_ids)]))
        n = min(max(int(np.argmax(ends)) + 1 + step, 0), int(num_out)) if ends.any() else int(num_out)
        return min(n, max(int(budget), 0))
    return length


PREVIEW_RULES = (
    ("preview_length", "the preview cut before the first EOS or stop token (the token itself dropped)", _stop_cut(-1)),
    ("preview_length", "the preview cut one token after the first EOS or stop token", _stop_cut(1)),
)
# candidate_selector's rules as they are commonly written another way
SELECTOR_RULES = (
    ("_walked", "the walk continued from each step's argmax, not from the rank it chose",
     lambda chosen, e: int(np.argmax(np.asarray(e, np.float64)))),
)


def _shared_length(p_k, p_q, window):
    """Decode rows sharing one sequence length: every row's window also starts from the block's last
    position (p_q [B, W, 1]), as if each row were the block's last."""
    last = p_q.max(axis=-2, keepdims=True)
    return (p_k > last - window) & (abs(p_k - p_q) < window)


# the attention's window rule (reference.draft_attention._in_window, also the layer's and the block's)
WINDOW_RULES = (
    ("_in_window", "the window bounding only the keys before the query (the left-only staircase)",
     lambda p_k, p_q, window: (p_k - p_q) > -window),
    ("_in_window", "every row's window starting from the block's last position (decode rows sharing one "
                   "sequence length)", _shared_length),
)


def _bf16_ranked(z, output_multiplier, softcap):
    from reference.candidate_topk import _transform

    return numerics.to_bf16(_transform(z, output_multiplier, softcap))


# candidate_topk ranks the raw logits (C4); commonly the scores as the model dtype holds them
TOPK_RULES = (("_ranked", "the selection ranking the transformed scores rounded to BF16", _bf16_ranked),)
# tree_verify's recursive rejection without the residual update between siblings (C6); its magnitudes follow
TREE_RULES = (("_after_rejection", "each sibling tested against the same target (no residual update between "
                                   "siblings)", lambda r, g: r, {"_after_rejection_scale": lambda r, sr, g, sg: sr}),)
# top-p's boundary as it is commonly written another way (cum > top_p; the crossing token dropped)
TOP_P_RULES = (
    ("_top_p_count", "top-p keeping the prefix whose mass exceeds top_p (a token reaching it exactly kept going)",
     lambda cum, top_p: int(np.searchsorted(cum, top_p, side="right")) + 1),
    ("_top_p_count", "top-p dropping the token whose cumulative mass crosses top_p",
     lambda cum, top_p: max(1, int(np.searchsorted(cum, top_p, side="right")))),
)
# the rules per Op: (the reference module the rule lives in, its rules)
RULES = {
    "speculative_accept": ("reference.speculative_accept", ACCEPT_RULES),
    "candidate_selector": ("reference.candidate_selector", SELECTOR_RULES),
    "preview_commit": ("reference.preview_commit", PREVIEW_RULES),
    "draft_attention": ("reference.draft_attention", WINDOW_RULES),
    "draft_layer": ("reference.draft_attention", WINDOW_RULES),
    "masked_block": ("reference.draft_attention", WINDOW_RULES),
    "candidate_topk": ("reference.candidate_topk", TOPK_RULES),
    "tree_verify": ("reference.tree_verify", TREE_RULES),
    "target_distribution": ("reference.target_distribution", TOP_P_RULES),
}


def _accept_rule_signatures(vec, spec, impl: Mapping) -> list[dict]:
    """The implementation conforms to the reference rerun with one of the Op's rules written another way
    (``RULES``: speculative_accept's accept test, correction distribution and bonus row; the selector's
    next rank; where the preview ends at a stop token; the attention's window; the top-k's ranked values;
    tree_verify's residual between siblings; top-p's boundary)."""
    module_name, rules = RULES.get(vec.op, (None, ()))
    if spec is None or not rules:
        return []
    import importlib

    module = importlib.import_module(module_name)
    found = []
    for name, what, f, *companions in rules:  # a companion: another function the rule swaps with it
        result = _patched(vec, spec, impl, module, {name: f, **(companions[0] if companions else {})})
        if result in (Result.PASS, Result.ACCEPTABLE):
            found.append({"signature": "rule changed", "rule": name, "text": f"the reference's output with {what}",
                          "evidence": f"the implementation is {result.name} against the reference rerun with {what}",
                          "confidence": 0.85})
    return found


def _rank_mirrored(spec):
    """candidate_selector's spec with the candidates taken in reverse rank order (scores and ids reversed
    along k, the walk's ranks and q mapped back): its reference, teacher forcing and follow-up rerun."""
    import dataclasses

    def rev(kw):
        return {**kw, **{f: np.ascontiguousarray(np.asarray(kw[f])[..., ::-1]) for f in ("scores", "ids")}}

    def back(out, k: int):
        out = dict(out)
        out["path"] = (k - 1 - np.asarray(out["path"])).astype(np.int32)
        for key in ("q", "q.scale"):
            if key in out:
                out[key] = np.ascontiguousarray(np.asarray(out[key])[..., ::-1])
        return out

    def k_of(kw) -> int:
        return int(np.shape(kw["ids"])[-1])

    def mirrored(impl, k: int):
        return {**impl, "path": (k - 1 - np.asarray(impl["path"], np.int64))}

    return dataclasses.replace(
        spec, reference=lambda **kw: back(spec.reference(**rev(kw)), k_of(kw)),
        force=lambda kw, impl: back(spec.force(rev(kw), mirrored(impl, k_of(kw))), k_of(kw)),
        follow=lambda kw, impl: back(spec.follow(rev(kw), impl), k_of(kw)))


def _rank_order_signature(vec, spec, impl: Mapping) -> list[dict]:
    """candidate_selector conforms to the reference rerun on its candidates in reverse rank order (greedy
    ties then go to the higher rank, and the race's uniforms to the ranks counted from the last)."""
    if spec is None or vec.op != "candidate_selector" or "path" not in impl:
        return []
    result = _conforms(vec, _rank_mirrored(spec), impl, lambda: fresh(vec))
    if result not in (Result.PASS, Result.ACCEPTABLE):
        return []
    return [{"signature": "ranks mirrored", "text": "the reference's walk over the candidates in reverse rank order",
             "evidence": f"the implementation is {result.name} against the reference rerun with scores and ids "
                         "reversed along k (path and q mapped back)", "confidence": 0.85}]


def _transform_signatures(vec, spec, impl: Mapping) -> list[dict]:
    """The implementation conforms to the reference rerun with one input transformed the way inputs are
    commonly mishandled: a 64-bit input's words swapped or one of them lost; a per-row input (one value
    per batch row) given row 0's value in every row."""
    if spec is None:
        return []
    found = []
    kw0 = fresh(vec)
    for field, v0 in kw0.items():
        v0 = np.asarray(v0) if isinstance(v0, (np.ndarray, np.integer, int)) or field in WINDOW_FIELDS else None
        if v0 is None or v0.dtype.kind not in "iu":
            continue
        forms = {}
        if v0.dtype == np.uint64:
            forms.update({k: (lambda a, f=f: f(np.asarray(a, np.uint64))) for k, f in WORD_TRANSFORMS.items()})
            if field in RNG_INPUTS and v0.ndim == 1 and v0.size > 1:
                forms.update({k: (lambda a, f=f: f(np.asarray(a, np.uint64))) for k, f in ROW_SEED_TRANSFORMS.items()})
        if v0.ndim == 1 and v0.size > 1 and np.unique(v0).size > 1 and field not in WINDOW_FIELDS:
            forms["row 0's value in every row"] = lambda a: np.full_like(np.asarray(a), np.asarray(a)[0])
        if field == "vocab_size" and ("head" in kw0 or "logits" in kw0):
            padded = np.shape(kw0["logits"])[-1] if "logits" in kw0 else 2**31 - 1
            forms["the padded width (padding rows eligible)"] = lambda a, padded=padded: type(a)(padded)
        if field == "anchor" and "mask_token_id" in kw0:
            forms["set to the mask token"] = lambda a: np.full_like(np.asarray(a), int(kw0["mask_token_id"]))
        if field in ("live", "live_proposals") and _full_extent(vec.op, kw0) is not None:
            forms["set to the full width (the live extent ignored)"] = \
                lambda a: np.full_like(np.asarray(a), _full_extent(vec.op, kw0))
        if field in WINDOW_FIELDS and v0.size and (v0 > 0).any():
            forms["set to 0 (no window)"] = lambda a: type(a)([0] * len(a)) if isinstance(a, (list, tuple)) \
                else np.zeros_like(np.asarray(a)) if np.ndim(a) else type(a)(0)
        for what, f in forms.items():
            def kwargs(field=field, f=f):
                kw = fresh(vec)
                kw[field] = f(kw[field])
                return kw
            if np.array_equal(kwargs()[field], v0):  # the transform changes nothing here: no evidence
                continue
            result = _conforms(vec, spec, impl, kwargs)
            if result in (Result.PASS, Result.ACCEPTABLE):
                found.append(_transformed(field, what, f"`{field}` {what}", result))
    return found


# how a list of block ids is commonly misread (feature_capture's target_layer_ids): one entry late (the
# last block standing in past the end) or early (wrapping, as Python's index -1 does), or in another order
ID_TRANSFORMS = {
    "each id one block late": lambda ids, n: [min(i + 1, n - 1) for i in ids],
    "each id one block early": lambda ids, n: [(i - 1) % n for i in ids],
    "in reverse order": lambda ids, n: ids[::-1],
    "in ascending order": lambda ids, n: sorted(ids),
}


NORM_WEIGHT_FORMS = {  # how a norm's weight is commonly misread: the other of the two checkpoint conventions
    "read as 1 + w (Gemma's convention, on a checkpoint that stores w)": 1.0,
    "read as w - 1 (a 1 + w checkpoint's convention undone twice)": -1.0,
}


def _norm_weight_signatures(vec, spec, impl: Mapping) -> list[dict]:
    """The implementation conforms to the reference rerun with one RMSNorm weight (an input whose name ends
    in ``norm``) offset by +-1: the weight convention (w or 1 + w) mixed up."""
    if spec is None:
        return []
    kw0 = fresh(vec)
    found = []
    for field, v0 in kw0.items():
        if not field.endswith("norm") or not isinstance(v0, np.ndarray) or v0.dtype.kind not in "fV" or not v0.size:
            continue
        for what, c in NORM_WEIGHT_FORMS.items():
            def kwargs(field=field, c=c):
                kw = fresh(vec)
                w = np.asarray(kw[field])
                kw[field] = (w.astype(np.float64) + c).astype(w.dtype)
                return kw
            result = _conforms(vec, spec, impl, kwargs)
            if result in (Result.PASS, Result.ACCEPTABLE):
                found.append(_transformed(field, what, f"`{field}` {what}", result))
    return found


def _last_normed(kw):
    """feature_capture's inputs with the last block's output replaced by its RMSNorm (unit weight), stored
    as the block outputs are."""
    from reference.norms import plain_rmsnorm

    r = np.asarray(kw["block_outputs"])
    normed = np.array(r, copy=True)
    normed[-1] = numerics.storage(plain_rmsnorm(r[-1].astype(np.float64), np.ones(r.shape[-1]), float(kw["eps"])),
                                  "bf16").astype(r.dtype)
    return {**kw, "block_outputs": normed}


# RMSNorm written another way (the norm family's formula slips), as feature_capture's context norm
NORM_FORMULAS = {
    "the weight applied before the statistics ((w x) / rms(w x))":
        lambda x, w, eps: _rms(np.asarray(w, np.float64) * np.asarray(x, np.float64), eps, np.mean),
    "eps added outside the square root": lambda x, w, eps: np.asarray(w, np.float64) * np.asarray(x, np.float64)
        / (np.sqrt(np.mean(np.asarray(x, np.float64) ** 2, axis=-1, keepdims=True)) + eps),
    "the sum of squares where the mean belongs":
        lambda x, w, eps: np.asarray(w, np.float64) * _rms(x, eps, np.sum),
}


def _rms(x, eps, reduce):
    x = np.asarray(x, np.float64)
    return x / np.sqrt(reduce(x * x, axis=-1, keepdims=True) + eps)


def _norm_formula_signatures(vec, spec, impl: Mapping) -> list[dict]:
    """feature_capture conforms to the reference rerun with its context RMSNorm written another way
    (``NORM_FORMULAS``; the reference's norm swapped for the rerun and restored after)."""
    if spec is None or vec.op != "feature_capture":
        return []
    from reference import feature_capture as fc

    found = []
    for what, f in NORM_FORMULAS.items():
        result = _patched(vec, spec, impl, fc, {"plain_rmsnorm": f})
        if result in (Result.PASS, Result.ACCEPTABLE):
            found.append({"signature": "norm formula", "formula": what, "text": f"the context norm with {what}",
                          "evidence": f"the implementation is {result.name} against the reference rerun with its "
                                      f"RMSNorm computed with {what}", "confidence": 0.85})
    return found


def _capture_signatures(vec, spec, impl: Mapping) -> list[dict]:
    """feature_capture conforms to the reference rerun with its block ids misread (``ID_TRANSFORMS``), with
    each id reading the previous block's output (the capture taken at the block's input; id 0 the
    embedding, not an input: zeros), or with the last block read after a final norm."""
    if spec is None or vec.op != "feature_capture":
        return []
    kw0 = fresh(vec)
    ids0 = [int(i) for i in np.asarray(kw0.get("target_layer_ids", [])).reshape(-1)]
    blocks = np.shape(kw0.get("block_outputs", ()))[0] if "block_outputs" in kw0 else 0
    if not ids0 or blocks < 2:
        return []
    forms = {k: (lambda kw, f=f: {**kw, "target_layer_ids": f(ids0, blocks)}) for k, f in ID_TRANSFORMS.items()}
    forms["each id reading the previous block's output"] = lambda kw: {
        **kw, "block_outputs": np.concatenate([np.zeros_like(kw["block_outputs"][:1]), kw["block_outputs"][:-1]])}
    forms["the last block read after a final RMSNorm (Hugging Face's hidden_states[-1])"] = _last_normed
    found = []
    for what, f in forms.items():
        if what in ID_TRANSFORMS and ID_TRANSFORMS[what](ids0, blocks) == ids0:  # no change: no evidence
            continue
        result = _conforms(vec, spec, impl, lambda f=f: f(fresh(vec)))
        if result in (Result.PASS, Result.ACCEPTABLE):
            how = f"the target layer ids read {what}" if what in ID_TRANSFORMS else what
            found.append(_transformed("target_layer_ids", what, how, result))
    return found


def _exchange_signatures(vec, spec, impl: Mapping) -> list[dict]:
    """The implementation conforms to the reference rerun with two inputs of one shape and dtype exchanged
    (weights loaded under each other's names). Only pairs whose exchange changes the values are tried."""
    if spec is None:
        return []
    kw0 = fresh(vec)
    arrays = [k for k, v in kw0.items() if isinstance(v, np.ndarray) and v.ndim >= 2]
    found = []
    for i, a in enumerate(arrays):
        for b in arrays[i + 1:]:
            x, y = kw0[a], kw0[b]
            if x.shape != y.shape or x.dtype != y.dtype or np.array_equal(x, y):
                continue

            def kwargs(a=a, b=b):
                kw = fresh(vec)
                kw[a], kw[b] = kw[b], kw[a]
                return kw
            result = _conforms(vec, spec, impl, kwargs)
            if result in (Result.PASS, Result.ACCEPTABLE):
                found.append({"signature": "inputs exchanged", "fields": (a, b),
                              "text": f"the reference's output with `{a}` and `{b}` exchanged",
                              "evidence": f"the implementation is {result.name} against the reference rerun with "
                                          f"`{a}` and `{b}` exchanged", "confidence": 0.85})
    return found


def _rerun_close(vec, spec, x, kw, mask, name="out"):
    """Per element of output ``name``: x within the allowance (``_close``) of the reference rerun on ``kw``,
    its scale from that rerun; None where the reference refuses ``kw``."""
    try:
        with np.errstate(all="ignore"):
            ref = dict(spec.reference(**kw))
            sc = spec.scales(kw, ref).get(name) if spec.scales is not None else None
    except Exception:  # noqa: BLE001 - inputs the reference refuses
        return None
    return _close(vec.outputs[name], vec.bounds.get(name, {}), x, ref[name], mask, sc)


def _head_map_signature(vec, spec, impl: Mapping) -> list[dict]:
    """draft_attention's query heads each equal, within the allowance, the attention over one KV head
    other than the spec's h // G for some h: the heads read through another map. One reference run per
    KV head, with every KV head of the block and the caches replaced by that one."""
    if spec is None or vec.op != "draft_attention" or "out" not in impl:
        return []
    kw0 = fresh(vec)
    hq, hk = np.shape(kw0["q"])[2], np.shape(kw0["k"])[2]
    x = np.asarray(impl["out"])
    if hk < 2 or hq % hk or x.shape != np.shape(vec.expected["out"]):
        return []
    mask = compare.full_masks(vec.outputs, vec.expected, vec.masks)["out"]
    ok = np.zeros((hq, hk), bool)  # ok[h, j]: query head h reads KV head j
    for j in range(hk):
        kw = fresh(vec)
        for name in ("k", "v", "k_cache", "v_cache"):
            a = np.asarray(kw[name])
            kw[name] = np.ascontiguousarray(np.repeat(a[:, :, j:j + 1], hk, axis=2))
        close = _rerun_close(vec, spec, x, kw, mask)
        if close is None:
            return []
        ok[:, j] = close.reshape(-1, hq, x.shape[-1]).transpose(1, 0, 2).reshape(hq, -1).all(axis=1)
    spec_map = np.arange(hq) // (hq // hk)
    if not ok.any(axis=1).all() or ok[np.arange(hq), spec_map].all():
        return []
    got = [int(spec_map[h]) if ok[h, spec_map[h]] else int(np.argmax(ok[h])) for h in range(hq)]
    moved = [f"{h}->{j}" for h, j in enumerate(got) if j != spec_map[h]]
    return [{"signature": "head map", "output": "out", "map": got,
             "text": f"query heads read other KV heads: {', '.join(moved[:8])}" + (" ..." if len(moved) > 8 else ""),
             "evidence": f"each query head's output equals (within the allowance) the attention over one KV head; "
                         f"{len(moved)} of {hq} are not h // {hq // hk}", "confidence": 0.8}]


ROW_OUTPUTS = {"draft_attention": "out", "draft_layer": "x_next"}  # outputs whose rows are the block's rows


def _row_extent_signature(vec, spec, impl: Mapping) -> list[dict]:
    """draft_attention's (or draft_layer's) rows each equal, within the allowance, the reference with the
    block's live extent set to some L: which block keys each row sees. Said when every compared row is
    explained and some row sees another extent than ``live``: ``causal`` when each row i sees the first
    i + 1 keys, ``beyond live`` when the rows see keys past the live extent. One reference run per L in
    1..W."""
    name = ROW_OUTPUTS.get(vec.op)
    if spec is None or name is None or name not in impl:
        return []
    kw0 = fresh(vec)
    live = np.asarray(kw0["live"]).astype(np.int64).reshape(-1)
    x = np.asarray(impl[name])
    if x.ndim < 3 or x.shape != np.shape(vec.expected[name]) or live.size != x.shape[0]:
        return []
    b, w = x.shape[:2]
    mask = compare.full_masks(vec.outputs, vec.expected, vec.masks)[name]
    rows = mask.reshape(b, w, -1).any(axis=2)  # the compared rows
    ok = np.zeros((w + 1, b, w), bool)  # ok[L, b, i]: row (b, i) is the reference's with live L
    for n in range(1, w + 1):
        kw = fresh(vec)
        kw["live"] = np.full_like(np.asarray(kw["live"]), n)
        close = _rerun_close(vec, spec, x, kw, mask, name)
        if close is not None:  # an extent the reference refuses: not this one
            ok[n] = close.reshape(b, w, -1).all(axis=2)
    idx = np.arange(w)
    own = ok[np.clip(live, 0, w)[:, None], np.arange(b)[:, None], idx[None, :]]  # the spec's extent
    if not (ok.any(axis=0) | ~rows)[rows].all() or own[rows].all():
        return []
    causal = np.minimum(live[:, None], idx[None, :] + 1)
    if ok[causal, np.arange(b)[:, None], idx[None, :]][rows].all():
        kind, what = "causal", "each query row i sees only the block's first i + 1 keys (a causal mask)"
    elif (((np.arange(w + 1)[:, None, None] > live[None, :, None]) & ok).any(axis=0) | own)[rows].all():
        kind, what = "beyond live", "rows see block keys past the live extent"
    else:
        kind, what = "other", "rows see other block extents than live"
    return [{"signature": "row extent", "extent": kind, "output": name,
             "text": f"{name}: {what}",
             "evidence": f"each compared row equals (within the allowance) the reference with the live extent set to "
                         f"some L of 1..{w}; {int((~own & rows).sum())} of {int(rows.sum())} rows not at L = live",
             "confidence": 0.8}]


# a signature found by searching many alternatives (a rotation per row, a window per row) is likelier to fit
# by chance than one tested as a single hypothesis (a conforming rerun: ``SINGLE``): it ranks just below those
SEARCHED = 0.75
SINGLE = 0.85


def _row_window_signature(vec, spec, impl: Mapping) -> list[dict]:
    """draft_attention with a sliding window: each query row equals, within the allowance, the reference
    with the window set to some S' of 1..S + W, and some row not at S' = S: each row's window edge taken
    from another position than its own (a shared sequence length, an edge counted from the block's end).
    One reference run per S'."""
    if spec is None or vec.op != "draft_attention" or "out" not in impl:
        return []
    kw0 = fresh(vec)
    s0 = int(kw0.get("window", 0))
    x = np.asarray(impl["out"])
    if s0 <= 0 or x.ndim != 4 or x.shape != np.shape(vec.expected["out"]):
        return []
    b, w = x.shape[:2]
    mask = compare.full_masks(vec.outputs, vec.expected, vec.masks)["out"]
    rows = mask.reshape(b, w, -1).any(axis=2)
    sizes = range(1, s0 + w + 1)
    ok = np.zeros((len(sizes), b, w), bool)
    for n, size in enumerate(sizes):
        close = _rerun_close(vec, spec, x, {**fresh(vec), "window": size}, mask)
        if close is not None:
            ok[n] = close.reshape(b, w, -1).all(axis=2)
    own = ok[s0 - 1]
    if not ok.any(axis=0)[rows].all() or own[rows].all():
        return []
    moved = int((~own & rows).sum())
    return [{"signature": "row windows", "output": "out",
             "text": "out: query rows see windows of other sizes than the window's",
             "evidence": f"each compared row equals (within the allowance) the reference with the window set to some "
                         f"S' of 1..{s0 + w}; {moved} of {int(rows.sum())} rows not at S' = {s0}",
             "confidence": SEARCHED}]


MAX_RING = 64  # ring rotations are searched on rings up to this capacity


def _ring_rotation_signature(vec, spec, impl: Mapping) -> list[dict]:
    """draft_attention / draft_layer / masked_block: each batch row equals, within the allowance, the
    reference with that row's ring (K and V caches; masked_block: every layer's) rotated by some r slots,
    not all r = 0: the ring read at an offset (its live interval taken as starting at another slot, a
    reader without mod C). One reference run per r."""
    name = {**ROW_OUTPUTS, "masked_block": "hidden"}.get(vec.op)
    if spec is None or name is None or name not in impl:
        return []
    kw0 = fresh(vec)
    rings, axis = (("context_k", "context_v"), 2) if vec.op == "masked_block" else (("k_cache", "v_cache"), 1)
    cap = np.shape(kw0[rings[0]])[axis]
    x = np.asarray(impl[name])
    if cap < 2 or cap > MAX_RING or x.shape != np.shape(vec.expected[name]):
        return []
    mask = compare.full_masks(vec.outputs, vec.expected, vec.masks)[name]
    b = x.shape[0]
    rows = mask.reshape(b, -1).any(axis=1)
    ok = np.zeros((cap, b), bool)
    for r in range(cap):
        kw = fresh(vec)
        for c in rings:
            kw[c] = np.ascontiguousarray(np.roll(np.asarray(kw[c]), r, axis=axis))
        close = _rerun_close(vec, spec, x, kw, mask, name)
        if close is None:
            return []
        ok[r] = close.reshape(b, -1).all(axis=1)
    if not ok.any(axis=0)[rows].all() or ok[0][rows].all():
        return []
    shifts = [int(np.argmax(ok[:, i])) for i in range(b) if rows[i]]
    return [{"signature": "ring rotated", "output": name, "shifts": shifts,
             "text": f"{name}: the context ring read at an offset (rows' rings rotated by {shifts} slots)",
             "evidence": f"each compared batch row equals (within the allowance) the reference with its ring rotated "
                         f"by some r of 0..{cap - 1}; rotations {shifts}",
             "confidence": SEARCHED}]


def _slot_signature(vec, spec, impl: Mapping) -> list[dict]:
    """context_kv's caches: every slot (a ring row or a page row: all axes but the last two) that differs
    holds, within the allowance, the reference's row of another slot or its own old row (not written),
    and at least one holds another slot's row: rows stored in the wrong slots."""
    if vec.op != "context_kv":
        return []
    kw0 = fresh(vec)
    masks = compare.full_masks(vec.outputs, vec.expected, vec.masks)
    moved = stale = 0
    for name in ("k_cache", "v_cache"):
        if name not in impl or name not in kw0 or name not in vec.outputs:
            continue
        x, r, old = (np.asarray(a) for a in (impl[name], vec.expected[name], kw0[name]))
        if x.shape != r.shape or x.shape != old.shape or x.ndim < 3:
            return []
        tail = x.shape[-2:]
        xs, rs, olds = (a.reshape((-1,) + tail) for a in (x, r, old))
        ms = np.broadcast_to(masks[name], x.shape).reshape((-1,) + tail)
        sc = vec.expected.get(f"{name}.scale")
        ss = None if sc is None or np.shape(sc) != x.shape else np.asarray(sc).reshape((-1,) + tail)
        o, bound = vec.outputs[name], vec.bounds.get(name, {})

        def close(i, j, xs=xs, rs=rs, ms=ms, ss=ss, o=o, bound=bound):
            return bool(_close(o, bound, xs[i], rs[j], ms[i], None if ss is None else ss[j]).all())

        for i in range(xs.shape[0]):
            if close(i, i):
                continue
            if any(close(i, j) for j in range(xs.shape[0]) if j != i):
                moved += 1
            elif np.array_equal(xs[i].astype(np.float64), olds[i].astype(np.float64), equal_nan=True):
                stale += 1
            else:
                return []
    if moved == 0 and stale == 0:
        return []
    return [{"signature": "slots moved", "output": "k_cache, v_cache",
             "text": "cache rows stored in other slots than their positions'" if moved else
                     "cache rows the spec writes left unwritten",
             "evidence": f"{moved} differing slot rows each hold, within the allowance, the reference's row of another "
                         f"slot; {stale} hold their old contents", "confidence": 0.75}]


ID_OUTPUTS = {"proposal_head": "tokens", "candidate_topk": "ids"}  # the Ops that rank head logits, their id output


def _tied_order_signature(vec, spec, impl: Mapping) -> list[dict]:
    """proposal_head / candidate_topk: every id that differs from the reference's names a head row whose
    logit (hidden . head row, float64 of the inputs) equals exactly the logit of the reference's id there,
    both rows eligible, in a row whose logits are not all equal (where they are, a reversed or unranked
    order looks the same): the same ranking with exact ties broken another way."""
    name = ID_OUTPUTS.get(vec.op)
    if name is None or name not in impl or name not in vec.expected:
        return []
    kw0 = fresh(vec)
    x, r = np.asarray(impl[name]).astype(np.int64), np.asarray(vec.expected[name]).astype(np.int64)
    if x.shape != r.shape or x.ndim < 2:
        return []
    hidden, head = np.asarray(kw0["hidden"], np.float64), np.asarray(kw0["head"], np.float64)
    rows = head.shape[0]
    ids = np.arange(rows) if kw0.get("shortlist") is None else np.asarray(kw0["shortlist"]).astype(np.int64)
    eligible = (ids >= 0) & (ids < int(kw0["vocab_size"]))
    row_of = {int(g): j for j, g in enumerate(ids) if eligible[j]}
    differ = np.argwhere(x != r)
    if len(differ) == 0:
        return []
    for at in differ:
        a, b = row_of.get(int(x[tuple(at)])), row_of.get(int(r[tuple(at)]))
        if a is None or b is None:
            return []
        h = hidden[tuple(at[:2])] if hidden.ndim >= 3 else hidden[at[0]]
        with np.errstate(all="ignore"):
            za, zb = float(h @ head[a]), float(h @ head[b])
        if not (np.isfinite(za) and za == zb):
            return []
        with np.errstate(all="ignore"):
            if np.unique(head[eligible] @ h).size < 2:  # every logit tied: any order, ranked or not, looks the same
                return []
    return [{"signature": "tied order", "output": name,
             "text": f"{name}: exact ties ranked in another order",
             "evidence": f"each of the {len(differ)} differing ids names a head row whose logit equals exactly that "
                         "of the reference's id (both eligible)", "confidence": 0.8}]


SPEC_TAPS = "the spec's taps"
TILED = "the delta indexed per channel (channel c reading group c mod G)"


def _conv_forms(x, base_side, delta_side, group: int, tiled: bool = False) -> dict:
    """The grouped conv (reference.grouped_conv's formula, float64) with each way its taps are commonly
    laid out: the spec's (tap 0 on column i, tap 1 on column i - 1, none at 0), the taps' coefficients
    exchanged, the second tap on column i + 1, and column 0's preceding tap read from the last column
    (a wrapping shift). ``tiled``: each channel c reads group c mod G's delta (the delta indexed per
    channel), not group c // 16's."""
    b, w, h = x.shape
    g = h // group
    xg = x.reshape(b, w, g, group)
    if tiled:
        delta = delta_side[..., np.arange(h) % g].reshape(b, w, 2, g, group)
    else:
        delta = delta_side[..., None]
    coef = base_side.reshape(1, 1, 2, g, group) + delta
    zero = np.zeros_like(xg[:, :1])
    prev, nxt = np.concatenate([zero, xg[:, :-1]], axis=1), np.concatenate([xg[:, 1:], zero], axis=1)
    forms = {SPEC_TAPS: coef[:, :, 0] * xg + coef[:, :, 1] * prev,
             "the taps' coefficients exchanged": coef[:, :, 1] * xg + coef[:, :, 0] * prev,
             "the second tap on the next column": coef[:, :, 0] * xg + coef[:, :, 1] * nxt,
             "column 0's preceding tap read from the last column": coef[:, :, 0] * xg
             + coef[:, :, 1] * np.roll(xg, 1, axis=1)}
    return {k: v.reshape(b, w, h) for k, v in forms.items()}


def _conv_layout_signature(vec, spec, impl: Mapping) -> list[dict]:
    """grouped_conv: every output within the allowance of the conv recomputed with another layout: a tap
    layout of ``_conv_forms``, its delta projection read as the spec lays it out ([2 sides, 2 taps, G]) or
    group-major ([G, 2, 2]), its delta shared by each group of 16 or indexed per channel (not all the
    spec's); ``finished`` on the implementation's own finish_delta."""
    if vec.op != "grouped_conv" or not {"prepared", "finished", "finish_delta"} <= set(impl):
        return []
    from reference.grouped_conv import GROUP

    kw0 = fresh(vec)
    x, z, base, proj = (np.asarray(kw0[k], np.float64) for k in ("x", "z", "base", "proj"))
    b, w, h = x.shape
    if h % GROUP:
        return []
    g = h // GROUP
    raw = (x @ proj.T).reshape(b, w, -1)
    layouts = {"": raw.reshape(b, w, 2, 2, g),
               "the delta projection read group-major": raw.reshape(b, w, g, 2, 2).transpose(0, 1, 3, 4, 2)}
    masks = compare.full_masks(vec.outputs, vec.expected, vec.masks)
    fd = np.asarray(impl["finish_delta"], np.float64)

    def close(name, y):
        o = vec.outputs[name]
        return bool(_close(o, vec.bounds.get(name, {}), np.asarray(impl[name]),
                           numerics.storage(y, o.fmt).astype(np.float64), masks[name],
                           vec.expected.get(f"{name}.scale")).all())

    found = []
    for (lay, delta), tiled in itertools.product(layouts.items(), (False, True)):
        if not close("finish_delta", delta[:, :, 1]):
            continue
        prepared = _conv_forms(x, base[0], delta[:, :, 0], GROUP, tiled)
        finished = _conv_forms(z, base[1], fd, GROUP, tiled)
        for form in prepared:
            what = ", ".join(t for t in ((form if form != SPEC_TAPS else ""), lay, TILED if tiled else "") if t)
            if what and close("prepared", prepared[form]) and close("finished", finished[form]):
                found.append({"signature": "conv layout", "layout": what, "text": f"the grouped conv with {what}",
                              "evidence": f"every output within the allowance of the conv recomputed with {what} "
                                          "(finished on the implementation's own finish_delta)", "confidence": 0.8})
    return found


BF16_U = 2.0 ** -8  # BF16's unit roundoff
ROTATION_NORM = 4 * BF16_U  # two BF16 stores' roundings, and as much again for the engine's arithmetic
ROTATED = 2.0 ** -4  # a vector moved by more than 16 BF16 roundings: not a rounding
SMALL_POSITION = 2**24  # below it a position's value is exact in FP32: the positions family cannot bite


def _rotation_signature(vec, spec, impl: Mapping) -> list[dict]:
    """context_kv's K rows: every compared head vector has the reference's norm (within ``ROTATION_NORM``)
    and some are moved by more than ``ROTATED`` of it, all positions below ``SMALL_POSITION``: each K
    vector turned by another rotation than the spec's RoPE (rotation keeps the norm; a rounding moves a
    vector far less, a wrong value or slot changes its norm)."""
    if vec.op != "context_kv" or "k_cache" not in impl or "k_cache" not in vec.expected:
        return []
    kw0 = fresh(vec)
    rows = np.shape(kw0.get("context", ()))[0] if "context" in kw0 else 0
    if rows == 0 or int(np.asarray(kw0.get("start", 0))) + rows > SMALL_POSITION:
        return []
    x, r = (np.asarray(a).astype(np.float64) for a in (impl["k_cache"], vec.expected["k_cache"]))
    if x.shape != r.shape or x.ndim < 3:
        return []
    mask = np.broadcast_to(compare.full_masks(vec.outputs, vec.expected, vec.masks)["k_cache"], x.shape)
    used = mask.all(axis=-1)  # the compared head vectors
    if not used.any() or not (np.isfinite(x[used]).all() and np.isfinite(r[used]).all()):
        return []
    nx, nr = np.linalg.norm(x[used], axis=-1), np.linalg.norm(r[used], axis=-1)
    moved = np.linalg.norm(x[used] - r[used], axis=-1)
    if not (np.abs(nx - nr) <= ROTATION_NORM * nr).all() or not (moved > ROTATED * nr).any():
        return []
    n = int((moved > ROTATED * nr).sum())
    return [{"signature": "rotation", "output": "k_cache",
             "text": "k_cache: head vectors turned by another rotation (each keeps its norm)",
             "evidence": f"every one of the {int(used.sum())} compared K head vectors has the reference's norm "
                         f"(within {ROTATION_NORM:.3g} of it); {n} moved by more than {ROTATED:.3g} of their norm, "
                         f"at positions below 2^24", "confidence": 0.75}]


def _layer_head_map_signature(vec, spec, impl: Mapping) -> list[dict]:
    """draft_layer / masked_block conform to the reference rerun with the query heads regrouped so that the
    spec's map (head h reads KV head h // G) becomes h % Hk (the rows of wq and the columns of wo by head):
    the KV heads expanded by tiling (x.repeat) where the spec repeats each one G times."""
    if spec is None or vec.op not in ("draft_layer", "masked_block"):
        return []
    kw0 = fresh(vec)
    d = int(kw0.get("head_dim", 0))
    wq, wk = np.shape(kw0.get("wq", ())), np.shape(kw0.get("wk", ()))
    if d < 1 or len(wq) < 2 or len(wk) < 2:
        return []
    hq, hk = wq[-2] // d, wk[-2] // d
    if hk < 2 or hq == hk or hq % hk:
        return []
    h = np.arange(hq)
    perm = _gqa_perm(hq, hk)

    def kwargs():
        kw = fresh(vec)
        for name, axis in (("wq", -2), ("wo", -1)):
            kw[name] = np.ascontiguousarray(_reorder_heads(kw[name], perm, d, axis))
        return kw
    result = _conforms(vec, spec, impl, kwargs)
    if result not in (Result.PASS, Result.ACCEPTABLE):
        return []
    return [{"signature": "head map", "output": next(iter(vec.outputs)), "map": [int(j) for j in h % hk],
             "text": f"query heads read KV head h % {hk} (the spec: h // {hq // hk})",
             "evidence": f"the implementation is {result.name} against the reference rerun with the query heads "
                         "regrouped so that head h reads KV head h % Hk", "confidence": 0.8}]


def _shortlist_rows_signature(vec, spec, impl: Mapping) -> list[dict]:
    """proposal_head / candidate_topk with a shortlist: every differing id is the head row of the reference's
    id (its index in the shortlist), not the id itself."""
    name = ID_OUTPUTS.get(vec.op)
    kw0 = fresh(vec)
    if name is None or name not in impl or kw0.get("shortlist") is None:
        return []
    x, r = np.asarray(impl[name]).astype(np.int64), np.asarray(vec.expected[name]).astype(np.int64)
    if x.shape != r.shape or not (x != r).any():
        return []
    row = {}
    for j, g in enumerate(np.asarray(kw0["shortlist"]).astype(np.int64).tolist()):
        row.setdefault(int(g), j)
    differ = x != r
    if not all(row.get(int(g)) == int(v) for g, v in zip(r[differ], x[differ])):
        return []
    return [{"signature": "rows for ids", "output": name, "text": f"{name}: head rows returned where ids belong",
             "evidence": f"each of the {int(differ.sum())} differing {name} is the shortlist index of the "
                         "reference's id there", "confidence": 0.8}]


def _pair_layout_signature(vec, spec, impl: Mapping) -> list[dict]:
    """draft_layer / masked_block conform to the reference rerun with every query and key head's dims
    reordered from interleaved pairs (2i, 2i + 1) to split halves (i, i + D/2) (the rows of wq and wk
    within each head, q_norm, k_norm and the cached keys): RoPE applied to interleaved pairs (GPT-J's
    layout) where the spec rotates halves; attention scores only see the common reordering."""
    if spec is None or vec.op not in ("draft_layer", "masked_block"):
        return []
    kw0 = fresh(vec)
    d = int(kw0.get("head_dim", 0))
    if d < 4 or d % 2:
        return []
    perm = _split_of_interleaved(d)

    def kwargs():
        kw = fresh(vec)
        for name in ("wq", "wk"):
            w = np.asarray(kw[name])
            kw[name] = w.reshape(w.shape[:-2] + (w.shape[-2] // d, d, w.shape[-1]))[..., perm, :].reshape(w.shape)
        for name in ("q_norm", "k_norm", "k_cache", "context_k"):
            if name in kw:
                kw[name] = np.ascontiguousarray(np.asarray(kw[name])[..., perm])
        return kw
    result = _conforms(vec, spec, impl, kwargs)
    if result not in (Result.PASS, Result.ACCEPTABLE):
        return []
    return [{"signature": "pair layout", "text": "the reference's output with RoPE on interleaved pairs",
             "evidence": f"the implementation is {result.name} against the reference rerun with each query and "
                         "key head's dims in interleaved-pair order (weights, norms and cached keys reordered)",
             "confidence": 0.85}]


def signatures(vec, spec, impl: Mapping, maps: Mapping, diff: Mapping, reruns: bool = True) -> list[dict]:
    """Structural hypotheses, most confident first. ``reruns`` False: only those read off the outputs
    themselves, none that reruns the reference (where a catalogued mutant already matches, they would
    rank below it and cost most of the diagnosis)."""
    from conformance.compare import full_masks

    masks = full_masks(vec.outputs, vec.expected, vec.masks)
    found = []
    rerun_probes = (_offset_signatures, _transform_signatures, _accept_rule_signatures, _counter_signatures,
                    _rank_order_signature,
                    _ignored_signatures, _capture_signatures, _exchange_signatures, _pair_layout_signature,
                    _norm_weight_signatures, _norm_formula_signatures, _layer_head_map_signature)
    searches = (_head_map_signature, _row_extent_signature, _ring_rotation_signature, _row_window_signature)
    for probe in (rerun_probes if reruns else ()) + (_slot_signature, _rotation_signature, _tied_order_signature,
                                                     _conv_layout_signature, _shortlist_rows_signature) + searches:
        # the searches (one rerun per head, extent, ring rotation or window size) only where no single rerun
        # already explains the whole difference: they would rank below it
        if probe in searches and (not reruns or any(h["confidence"] >= SINGLE for h in found)):
            break
        try:
            found += probe(vec, spec, impl)
        except Exception:  # noqa: BLE001, S112 - shapes a probe cannot read: no signature
            continue
    for name, o in vec.outputs.items():
        if not diff[name].any():
            continue
        try:
            found += _axis_signatures(name, o, vec.bounds.get(name, {}), impl[name], vec.expected[name],
                                      masks[name], vec.expected.get(f"{name}.scale"), diff[name])
        except Exception:  # noqa: BLE001, S112 - an output whose shape defeats a signature: no signature
            continue
    found.sort(key=lambda h: -h["confidence"])
    return [{"kind": "structure", **h} for h in found]
