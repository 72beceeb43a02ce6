"""The candidate_topk strategy: random heads, planted tie ladders, all-equal rows, NaN scores."""

from __future__ import annotations

from typing import Any

import numpy as np

from conformance import registry
from conformance.registry import Case
from conformance.strategies.base import Reject, Strategy, _composite, salt, st


@_composite
def _topk_params(draw):
    kind = draw(st.sampled_from(["random", "planted", "all_equal", "nan_scores"]))
    b, k = draw(st.integers(1, 3)), draw(st.integers(1, 8))
    top_k = draw(st.sampled_from([16, 1, 4, 8, 15]))
    h = draw(st.sampled_from([32, 16, 64]))
    vr = draw(st.sampled_from([64, 32, 128, 256, 512]))
    p: dict[str, Any] = {"kind": kind, "b": b, "k": k, "h": h, "vr": vr, "top_k": top_k}
    if kind == "random":
        p["pad"] = draw(st.sampled_from([0, 0, 12, vr // 4]))
        p["shortlist"] = draw(st.booleans())
        p["transform"] = draw(st.sampled_from(["none", "multiplier", "softcap", "both"]))
    elif kind == "planted":
        n_free = draw(st.integers(top_k + 4, 40))
        groups, at = [], 0
        for _ in range(draw(st.integers(0, 3))):
            start = at + draw(st.integers(0, 8))
            size = draw(st.integers(2, 5))
            groups.append([start, size])
            at = start + size
        p.update(n_free=n_free, groups=groups, per_column=draw(st.booleans()),
                 pad=draw(st.sampled_from([0, 12, vr // 8])), shortlist=draw(st.booleans()),
                 negative=draw(st.booleans()),
                 transform=draw(st.sampled_from(["none", "softcap_transformed", "softcap_saturated"])),
                 free_order=draw(st.sampled_from(["random", "descending_rows"])))
    elif kind == "nan_scores":
        p["nan_rows"] = draw(st.lists(st.integers(0, 31), min_size=1, max_size=6, unique=True))
    p["salt"] = draw(salt())
    return p


def _build_topk(cid, p):
    from conformance.cases import candidate_topk as m

    b, k, h, vr, top_k = p["b"], p["k"], p["h"], p["vr"], p["top_k"]
    if p["kind"] == "random":
        params = {"top_k": top_k}
        t = p["transform"]
        scale = 1.0
        if t in ("multiplier", "both"):
            params["output_multiplier"], scale = 0.25 if t == "multiplier" else 2.0, 4.0 if t == "multiplier" else 8.0
        if t in ("softcap", "both"):
            params["softcap"], scale = (15.0, 20.0) if t == "softcap" else (30.0, 8.0)
        kw = {}
        if p["shortlist"]:
            kw = {"shortlist_vocab": 4000, "vocab_size": 4000}
        elif p["pad"]:
            kw = {"vocab_size": vr - p["pad"]}
        try:
            return m._random(cid, b, k, h, vr, scale=scale, **kw, **params)
        except RuntimeError as exc:
            raise Reject(str(exc)) from None
    if p["kind"] == "all_equal":
        case = m._all_equal(cid, b, k, h, vr)
        return Case(case.id, case.inputs, {**case.params, "top_k": top_k}, (), case.masks)
    if p["kind"] == "nan_scores":
        rng = registry.case_rng(cid)
        hidden = rng.standard_normal((b, k, h))
        hidden[0, 0, 0] = np.inf
        head = rng.standard_normal((32, h)) / np.sqrt(h)
        head[:, 0] = np.where(rng.random(32) < 0.5, 1.0, -1.0) * rng.uniform(0.5, 1.5, 32)
        head[p["nan_rows"], 0] = 0.0
        return m._case(cid, hidden, head, {"vocab_size": 32, "top_k": top_k})
    kw: dict[str, Any] = {"top_k": top_k, "groups": [tuple(g) for g in p["groups"]], "n_free": p["n_free"],
                          "per_column_groups": p["per_column"], "free_order": p["free_order"]}
    if p["negative"]:
        kw.update(top=-10.0, floor=-120.0)
    if p["transform"] == "softcap_transformed":
        kw.update(top=200.0, step=2.0, output_multiplier=0.5, softcap=30.0)
    elif p["transform"] == "softcap_saturated":
        kw.update(top=100.0, step=2.0, softcap=4.0)
    if p["shortlist"]:
        vocab = 2900
        kw.update(vocab_size=vocab, shortlist=m._shortlist(cid, vr, vocab, p["pad"]))
    elif p["pad"]:
        kw["vocab_size"] = vr - p["pad"]
    placed = 0
    for start, size in p["groups"]:  # free rows fill every rank above a group
        if start - placed > p["n_free"]:
            raise Reject("a tie group starts below the free rows")
        placed += size
    need = p["n_free"] + sum(s for _, s in p["groups"])
    eligible = vr - p["pad"]
    if need > eligible or (p["per_column"] and 2 * need > eligible):
        raise Reject("not enough eligible rows for the planted ladder")
    return m._planted(cid, b, k, h, vr, **kw)


STRATEGY = Strategy(
    "candidate_topk", lambda: _topk_params(), _build_topk,
    "random heads (B, K, H, rows 32..512, top_k 1..16, padded vocabulary, shortlists, multiplier, "
    "softcap, both); planted ladders with tie groups at any rank (at the k boundary, straddling it, "
    "per column), padding rows above all, shortlist order, negative logits, softcap-transformed and "
    "saturated BF16 ties; all rows equal; +inf hidden with NaN rows anywhere")
