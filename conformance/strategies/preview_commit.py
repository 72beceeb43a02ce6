"""The preview_commit strategy: EOS, stop and MASK ids anywhere, budgets, cancel, frontiers."""

from __future__ import annotations

import numpy as np

from conformance.strategies.base import Strategy, _composite, _per_row, positions, salt, st


@_composite
def _preview_params(draw):
    from conformance.cases.preview_commit import MASK

    b, w = draw(st.integers(1, 4)), draw(st.integers(1, 16))
    eos = draw(st.sampled_from([[900, 901], [], list(range(900, 940))]))
    stop = draw(st.sampled_from([[950], []]))
    tokens = [t for t in (*eos[:2], *stop, MASK, 17)]
    place = draw(st.lists(st.tuples(st.integers(0, b - 1), st.integers(0, w - 1), st.sampled_from(tokens)),
                          max_size=4))
    return {"b": b, "w": w, "l": draw(_per_row(b, st.integers(1, w))), "place": [list(x) for x in place],
            "eos": eos, "stop": stop,
            "budget": draw(_per_row(b, st.sampled_from([10**6, 0, -3, 1, 2, w - 1, w, w + 1]))),
            "cancel": draw(_per_row(b, st.sampled_from([0, 1]))),
            "frontier": draw(_per_row(b, positions(small=2**20, wide=w + 1))), "salt": draw(salt())}


def _build_preview(cid, p):
    from conformance.cases import preview_commit as m

    return m._case(cid, (), B=p["b"], W=p["w"], L=p["l"], place=[tuple(x) for x in p["place"]],
                   eos=tuple(p["eos"]), stop=tuple(p["stop"]), budget=p["budget"], cancel=p["cancel"],
                   frontier=np.asarray(p["frontier"], np.int64))


STRATEGY = Strategy(
    "preview_commit", lambda: _preview_params(), _build_preview,
    "B 1..4, W 1..16, L per row 1..W; EOS, stop and MASK ids placed anywhere (inside and past L); "
    "EOS lists empty, two or forty ids; budgets -3, 0, 1, 2, W-1, W, W+1, unlimited; cancel; frontiers "
    "near 2^24..2^63")
