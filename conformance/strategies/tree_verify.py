"""The tree_verify strategy: lattices, tree budgets, temperatures, seeds, one request over rows."""

from __future__ import annotations

import numpy as np

from conformance.strategies.base import Reject, Strategy, _composite, _per_row, positions, salt, seeds, st


@_composite
def _tree_params(draw):
    b = draw(st.integers(1, 3))
    same = b > 1 and draw(st.booleans())
    one = lambda s: [draw(s)] * b if same else draw(_per_row(b, s))
    v = draw(st.sampled_from([24, 16, 32]))
    return {"b": b, "k": draw(st.integers(1, 8)), "topk": draw(st.sampled_from([16, 4, 8])), "v": v,
            "n": draw(st.sampled_from([8, 1, 2, 3, 4, 5, 10, 16, 64])),
            "temperature": one(st.sampled_from([1.0, 0.0, 0.5, 0.7, 1.3])),
            "seed": one(seeds()), "frontier": one(positions(small=10**6, wide=16)),
            "same_request": same, "noise": draw(st.sampled_from([0.5, 0.3, 1.5])), "salt": draw(salt())}


def _build_tree(cid, p):
    from conformance.cases import tree_verify as m

    try:
        case = m._case(cid, B=p["b"], K=p["k"], k=min(p["topk"], p["v"]), V=p["v"], N=p["n"],
                       T=np.asarray(p["temperature"]), seeds=np.asarray(p["seed"], np.uint64),
                       frontiers=np.asarray(p["frontier"], np.int64), same_request=p["same_request"],
                       noise=p["noise"], attempts=100)
    except RuntimeError as exc:
        raise Reject(str(exc)) from None
    return case


STRATEGY = Strategy(
    "tree_verify", lambda: _tree_params(), _build_tree,
    "B 1..3, K 1..8, lattice top-k 4..16, vocab 16..32, tree budgets 1..64 (chain only, below, at and "
    "above K+1, off-chain), temperatures per row 0..1.3, seeds (edges and any), frontiers near "
    "2^24..2^63, one request repeated over rows")
