"""The candidate_selector strategy: drawn requests, planted exact ties and conditional paths."""

from __future__ import annotations

import numpy as np

from conformance import registry
from conformance.strategies.base import Reject, Strategy, _composite, _per_row, positions, salt, seeds, st


@_composite
def _selector_params(draw):
    kind = draw(st.sampled_from(["drawn", "exact_tie", "planted_path"]))
    if kind == "exact_tie":
        lo = draw(st.integers(0, 14))
        return {"kind": kind, "b": draw(st.integers(1, 3)), "k": draw(st.integers(1, 6)),
                "ranks": [lo, draw(st.integers(lo + 1, 15))], "salt": draw(salt())}
    if kind == "planted_path":
        return {"kind": kind, "plant": draw(_per_row(3, st.integers(1, 15))), "salt": draw(salt())}
    b = draw(st.integers(1, 4))
    return {"kind": kind, "b": b, "k": draw(st.integers(1, 8)), "h": draw(st.sampled_from([32, 16, 64])),
            "r": draw(st.sampled_from([16, 32])), "vr": draw(st.sampled_from([256, 64])),
            "temperature": draw(_per_row(b, st.sampled_from([0.0, 1.0, -1.0, 0.05, 0.4, 50.0]))),
            "seed": draw(_per_row(b, seeds())), "frontier": draw(_per_row(b, positions(wide=16))),
            "pair": draw(st.sampled_from([1.0, 2.0])), "flat_unary": draw(st.booleans()),
            "same_request": b > 1 and draw(st.booleans()), "salt": draw(salt())}


def _build_selector(cid, p):
    from conformance.cases import candidate_selector as m

    if p["kind"] == "exact_tie":
        return m.exact_tie(cid, b=p["b"], k=p["k"], ranks=tuple(p["ranks"]))
    if p["kind"] == "planted_path":
        return m.planted_path(cid, plant=tuple(p["plant"]))
    rng = registry.case_rng(cid)
    b = p["b"]
    for _ in range(40):
        a = m._request_arrays(rng, 1 if p["same_request"] else b, p["k"], p["h"], p["r"], p["vr"],
                              p["temperature"][0] if p["same_request"] else p["temperature"],
                              p["seed"][0] if p["same_request"] else np.asarray(p["seed"], np.uint64),
                              p["frontier"][0] if p["same_request"] else p["frontier"], pair=p["pair"])
        if p["same_request"]:  # one request at every row, each row with its own seed/frontier/temperature
            a = m._rows_of(a, [0] * b)
            a.update(temperature=np.asarray(p["temperature"], np.float64), seed=np.asarray(p["seed"], np.uint64),
                     frontier=np.asarray(p["frontier"], np.int64))
        if p["flat_unary"]:
            a["scores"] = a["scores"] * 0.05
        case = m._case(cid, a)
        if m.is_clear(case):
            return case
    raise Reject("no clear draw")


STRATEGY = Strategy(
    "candidate_selector", lambda: _selector_params(), _build_selector,
    "B 1..4, K 1..8, H, rank R, vocab; temperature per row in {0, <0, 0.05, 0.4, 1, 50}; seeds per row "
    "(edges 0, 1, 2^32-1, 2^32, 2^32+7, 2^63+5, 2^64-1 and any 64-bit); frontiers near 2^24, 2^31, 2^32, "
    "2^40, 2^63; flat unary scores with strong pair terms; one request repeated over rows; planted exact "
    "ties at any two ranks; planted conditional paths")
