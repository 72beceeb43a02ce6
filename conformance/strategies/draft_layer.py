"""The draft_layer strategy: DFlash and DFlash2 layers over the draft_attention geometry."""

from __future__ import annotations

from conformance.strategies.base import Strategy
from conformance.strategies.draft_attention import _attention_params

_TINY = [1.0, 1e-2, 1e-3, 3e-4, 1e-5]


def _build_layer(cid, p):
    from conformance.cases import draft_layer as m

    row_scale = [_TINY[i % len(_TINY)] for i in range(p["width"])] if p["tiny_rows"] else None
    return m.make(cid, [], variant=p["variant"], window=p["window"], capacity=p["capacity"], frontier=p["frontier"],
                  live=p["live"], width=p["width"], h=p["h"], hq=p["hq"], hk=p["hk"], d=p["d"], inter=p["inter"],
                  row_scale=row_scale)


STRATEGY = Strategy(
    "draft_layer", lambda: _attention_params(True), _build_layer,
    "DFlash and DFlash2 layers over the draft_attention geometry (windows, rings, frontiers to 2^63, "
    "tails, GQA); H 32..128, intermediate 64/128; rows of tiny RMS (eps-dominated)")
