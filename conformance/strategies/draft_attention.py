"""The draft_attention strategy: local windows and full layers, rings, frontiers, tails, GQA, V = +-inf
outside the window."""

from __future__ import annotations

from typing import Any

import numpy as np

from conformance.registry import Case
from conformance.strategies import base
from conformance.strategies.base import Strategy, _composite, _heads, _per_row, positions, salt, st


@_composite
def _attention_params(draw, layer: bool):
    p: dict[str, Any] = {}
    if layer:
        p["variant"] = draw(st.sampled_from(["dflash", "dflash2"]))
    kind = draw(st.sampled_from(["local", "full"]))
    b = draw(st.integers(1, 3))
    width = draw(st.integers(2, 16))
    if kind == "local":
        s = draw(st.integers(2, 16))
        # window edges: frontiers around S (|d| = S-1, S, S+1 from the first query), ring wrap, far
        edge = st.integers(-2, 2).map(lambda d, s=s: max(0, s + d))
        frontier = draw(_per_row(b, st.one_of(st.integers(0, 6 * s + 3), edge,
                                              positions(wide=width, top=not layer and base.ROPE_NEAR_2P63))))
        capacity = s + draw(st.integers(0, 8))
    else:
        s = 0
        frontier = draw(_per_row(b, st.integers(0, 48)))
        capacity = max(1, max(frontier)) + draw(st.integers(0, 8))
    hk, hq = draw(_heads())
    p.update(window=s, capacity=capacity, frontier=frontier, width=width,
             live=draw(_per_row(b, st.integers(1, width))), hq=hq, hk=hk, d=draw(st.sampled_from([16, 8, 32])))
    if layer:
        p["h"] = draw(st.sampled_from([64, 32, 96, 128]))
        p["inter"] = draw(st.sampled_from([128, 64]))
        p["tiny_rows"] = draw(st.booleans())
    else:
        p["v_inf_outside_window"] = kind == "local" and draw(st.booleans())
    p["salt"] = draw(salt())
    return p


def _build_attention(cid, p):
    from conformance.cases import draft_attention as m

    case = m.make(cid, [], window=p["window"], capacity=p["capacity"], frontier=p["frontier"], live=p["live"],
                  width=p["width"], hq=p["hq"], hk=p["hk"], d=p["d"])
    if p.get("v_inf_outside_window"):
        v = np.array(case.inputs["v_cache"])
        s, cap = p["window"], p["capacity"]
        for b, f in enumerate(p["frontier"]):
            for pos in range(max(0, f - cap), f - s + 1):  # every query sits at f or later: >= S away
                v[b, pos % cap] = np.where(np.arange(v.shape[-1]) % 2, np.inf, -np.inf).astype(np.float16)
        case = Case(case.id, {**case.inputs, "v_cache": v}, case.params, case.flags, case.masks)
    return case


STRATEGY = Strategy(
    "draft_attention", lambda: _attention_params(False), _build_attention,
    "local windows S 2..16 (ring capacity S..S+8) and full layers; frontiers around S (window edges "
    "|d| = S-1, S, S+1), up to 6S (ring wrap), near 2^24, 2^31, 2^32, 2^40, 2^63; W 2..16; live per "
    "row 1..W (every tail extent); B 1..3; GQA Hq/Hk in {1, 2, 4} with Hk 1..3, D 8..32; V = +-inf at "
    "populated slots outside the window")
