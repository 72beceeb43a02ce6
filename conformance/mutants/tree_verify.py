"""Mutants of tree_verify: seed words, batch rows, positions and the sibling residual."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from conformance.mutants.base import M32, Mutant, _ArgsMutant, _swap_words
from reference.precision import work


class TreeRngKey(_ArgsMutant):
    op, pitfall, fn = "tree_verify", "rng_key", None
    family = "rng"

    def change(self, kw):
        return {**kw, "seed": _swap_words(kw["seed"])}


class TreeRngBatchRow(_ArgsMutant):
    op, pitfall, fn = "tree_verify", "rng_batch_row", None
    family = "rng"

    def change(self, kw):
        return {**kw, "seed": np.asarray(kw["seed"], np.uint64) ^ np.arange(len(kw["seed"]), dtype=np.uint64)}


class TreePositions32(_ArgsMutant):
    op, pitfall, fn = "tree_verify", "positions_2p32", None
    family = "rng"

    def change(self, kw):
        return {**kw, "frontier": np.asarray(kw["frontier"], np.int64) & M32}


def _tree_verify_residual(anchor, ids, energies, temperature, seed, frontier, target_bigram, tree_nodes, *,
                          sibling_residual=True):
    """reference.tree_verify with the recursive rejection's residual update between siblings as a
    switch: off, every sibling is tested against the same p (the residual never shrinks)."""
    from reference import tree_verify as tv

    after = tv._after_rejection if sibling_residual else (lambda r, g: r)
    out = dict(tv.tree_verify(anchor, ids, energies, temperature, seed, frontier, target_bigram, tree_nodes))
    if sibling_residual:
        return out
    ids = np.asarray(ids)
    B, K = ids.shape[:2]
    W = K + 1
    tokens = np.full((B, W), -1, dtype=np.int32)
    accepted = np.zeros(B, dtype=np.int32)
    for b in range(B):
        s, F, T = np.uint64(seed[b]), int(frontier[b]), float(temperature[b])
        nodes, _ = tv.build_tree(ids[b], energies[b], temperature[b], s, F, int(tree_nodes))
        node, prev, depth = -1, int(anchor[b]), 0
        while True:
            kids = [n for n, nd in enumerate(nodes) if nd[2] == node]
            z = work(target_bigram[prev])
            pos = F + 1 + depth
            if T <= 0:
                top = tv.argmax_with_gap(z)[0]
                tokens[b, depth] = top
                hit = [n for n in kids if ids[b, nodes[n][0], nodes[n][1]] == top]
                if not hit:
                    break
                node, prev, depth = hit[0], top, depth + 1
                continue
            p = tv._softmax(z / z.dtype.type(T))
            r, chosen = p, None
            for j, n in enumerate(kids):
                d_i, c_rank, parent, main = nodes[n]
                c = int(ids[b, d_i, c_rank])
                g = np.zeros_like(p)
                if main:
                    prev_rank = nodes[parent][1] if parent >= 0 else 0
                    np.add.at(g, np.asarray(ids[b, d_i], dtype=np.int64), tv._q(energies[b, d_i, prev_rank], T))
                else:
                    g[c] = 1
                u = work(tv.uniform(s, pos, tv.Purpose.ACCEPT, j))
                if float(r[c] - u * g[c]) > 0:
                    chosen = (n, c)
                    break
                r = after(r, g)
            if chosen is not None:
                tokens[b, depth] = chosen[1]
                node, prev, depth = chosen[0], chosen[1], depth + 1
                continue
            purpose, weights = (tv.Purpose.CORRECTION, r) if kids else (tv.Purpose.BONUS, p)
            tokens[b, depth] = tv.exponential_race(np.asarray(weights, np.float64), s, pos, purpose)[0]
            break
        accepted[b] = depth
    out.update(tokens=tokens, accepted=accepted, num_out=accepted + 1)
    return out


class TreeSiblingResidual(Mutant):
    """Recursive rejection without the residual update between siblings: each sibling of a
    rejected node is tested against p itself instead of max(r - g, 0) normalized (C6)."""

    op, pitfall = "tree_verify", "sibling_residual"
    family = "residual"

    BUG: ClassVar[dict] = {"sibling_residual": False}

    def tree_verify(self, **kw):
        return self._baseline(_tree_verify_residual, **self.bug, **kw)


def _tree_fn():
    from reference.tree_verify import tree_verify

    return tree_verify


for _cls in (TreeRngKey, TreeRngBatchRow, TreePositions32):
    _cls.fn = staticmethod(_tree_fn())
