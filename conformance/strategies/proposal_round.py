"""The proposal_round strategy: DFlash and DFlash2 rounds, pending rows, layer ids, context roles."""

from __future__ import annotations

from typing import Any

import numpy as np

from conformance.strategies.base import Reject, Strategy, _composite, _near, _per_row, salt, seeds, st


@_composite
def _round_params(draw):
    variant = draw(st.sampled_from(["dflash", "dflash2"]))
    b, k = draw(st.integers(1, 3)), draw(st.integers(1, 7))
    frontier = draw(_per_row(b, st.one_of(st.integers(1, 40), _near(2**32, 2, 8)) if variant == "dflash2"
                             else st.integers(1, 40)))
    pending = [draw(st.integers(0, min(f, 12))) for f in frontier]
    p = {"variant": variant, "b": b, "k": k, "frontier": frontier, "pending": pending,
         "live": draw(_per_row(b, st.integers(1, k + 1))),
         "ids": draw(st.sampled_from([[1, 3], [3, 0], [2, 4], [4, 1], [0, 2]])),
         "context_role": draw(st.booleans()), "salt": draw(salt())}
    if variant == "dflash2":
        p["temperature"] = draw(_per_row(b, st.sampled_from([0.0, 1.0, 0.5, 2.0, 4.0])))
        p["seed"] = draw(_per_row(b, seeds()))
        p["transform"] = draw(st.sampled_from(["none", "multiplier_softcap"]))
        p["top_k"] = draw(st.sampled_from([8, 4]))
    return p


def _build_round(cid, p):
    from conformance.cases import proposal_round as m

    kw: dict[str, Any] = {}
    if p["variant"] == "dflash2":
        kw.update(temperature=p["temperature"], seed=np.asarray(p["seed"], np.uint64), top_k=p["top_k"])
        if p["transform"] != "none":
            kw.update(multiplier=0.5, softcap=6.0)
        if max(p["temperature"]) > 0:
            kw["clear"] = 1.0
    try:
        return m.build(cid, variant=p["variant"], frontier=p["frontier"], pending=p["pending"], live=p["live"],
                       K=p["k"], ids=tuple(p["ids"]), context_role=p["context_role"], tries=12, **kw)
    except RuntimeError as exc:
        raise Reject(str(exc).splitlines()[0]) from None


STRATEGY = Strategy(
    "proposal_round", lambda: _round_params(), _build_round,
    "DFlash and DFlash2 rounds, B 1..3, K 1..7, frontiers 1..40 (DFlash2 also near 2^32), pending rows "
    "0..12 (catch-up chunks longer than the ring), live per row 1..K+1, target layer ids in any order, "
    "context-role weights, DFlash2 temperatures 0..4, seeds, multiplier/softcap, top-k 4/8")
