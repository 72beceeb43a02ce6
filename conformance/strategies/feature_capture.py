"""The feature_capture strategy: target blocks, layer ids in any order, eps-dominated rows."""

from __future__ import annotations

from conformance.strategies.base import Strategy, _composite, salt, st


@_composite
def _capture_params(draw):
    blocks = draw(st.integers(1, 12))
    ids = draw(st.lists(st.integers(0, blocks - 1), min_size=1, max_size=min(5, blocks), unique=True))
    return {"blocks": blocks, "ids": ids, "rows": draw(st.integers(1, 8)), "ht": draw(st.sampled_from([16, 32])),
            "h": draw(st.sampled_from([64, 16, 32])), "eps": draw(st.sampled_from([1e-6, 1e-5])),
            "tiny_rows": draw(st.booleans()), "salt": draw(salt())}


def _build_capture(cid, p):
    from conformance.cases import feature_capture as m

    row_scale = [[1.0, 1e-3, 1e-4, 1e-5][i % 4] for i in range(p["rows"])] if p["tiny_rows"] else None
    return m.make(cid, [], ids=p["ids"], blocks=p["blocks"], rows=p["rows"], ht=p["ht"], h=p["h"], eps=p["eps"],
                  row_scale=row_scale)


STRATEGY = Strategy(
    "feature_capture", lambda: _capture_params(), _build_capture,
    "1..12 target blocks, 1..5 ids in any order (id 0 and the last block included), T 1..8, Ht 16/32, "
    "H 16..64, eps 1e-6/1e-5, eps-dominated rows")
