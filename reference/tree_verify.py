"""DFlash2 tree verification (spec: "With --draft-tree-nodes a DFlash2 round instead
verifies a tree of proposals built from the same lattice, whose main chain is this
path"; CONTRACTS C3 keys, C4 ties, C6 acceptance).

Inputs per request: anchor a, candidate ids C_i = ids[i] [K, k], pair energies
E_i[p, c] = energies[i, p, c] (row = predecessor rank, column = candidate; step 0
reads row 0, the anchor row), temperature T, seed s, frontier F; the target is a
bigram model: the logits after token x are target_bigram[x] (so a vector holds the
whole target); p(. | x) = softmax(target_bigram[x] / T), argmax at T <= 0. No
penalties or filters here: C5 is target_distribution's business.

Walk (the selector's, exactly): q_i(. | p) = FP32(softmax(E_i[p, :] / T));
T <= 0: j_i = lowest-rank argmax E_i[j_(i-1), :]; T > 0: j_i ~ q_i(. | j_(i-1)) by the
race at F+i, purpose DFLASH2_PROPOSAL, index = rank.

Tree of N = tree_nodes nodes (1..64). A node is (depth i, rank c, parent), token C_i[c].
  1. The main chain j_0 .. j_(K-1) comes first: nodes 0 .. min(N, K)-1, node i at depth i.
     So N <= K gives the chain prefix of N nodes, and N = K the whole chain.
  2. Then best-first: among the children (depth i+1, any rank) of nodes already in
     the tree, add the one with the highest path score, the sum of
     log q_i(c | parent rank) along its path, with rho = T (T > 0) or rho = 1 (T <= 0:
     the E-softmax ranking, since greedy q is one-hot) in q's softmax; ties go to the
     lower depth, then the lower parent node, then the lower rank. Repeat until N
     nodes or no child is left (the rest is padding: token -1, parent -1).
Siblings keep node order (the main-chain child first, then by score).
tree_mask[n, m] = 1 iff m = n or m is an ancestor of n: the target's tree attention.

Verification walks down from the root (context a, depth 0). At a node at depth i
(its children predict position F+1+i) with target p = p(. | token of the node):
  greedy:  t = argmax p; the child with token t is accepted, else t is emitted.
  sampled: recursive rejection over the children in sibling order, r = p:
           child j with draft law g_j (the retained q_i(. | parent rank) for the
           main-chain child of a main-chain node, which the walk drew from it; a
           point mass at its token otherwise):
             accept iff U * g_j(c_j) < r(c_j),  U = uniform(s, F+1+i, ACCEPT, j)
             else r = max(r - g_j, 0) normalized (r unchanged when that has no mass)
           all children rejected: correction ~ r by the race at F+1+i, CORRECTION,
           index = token id; a leaf (no children): bonus ~ p at F+1+i, BONUS.
Each stage is a speculative step whose draft is independent of its uniforms, so the
emitted token follows p and the path follows the target (the chi-square test checks
it). With N = K every node has one child and this is speculative_accept's scan.

Outputs: parent [B,N], node_tokens [B,N], tree_mask [B,N,N] (exact); tokens [B,K+1]
(accepted path tokens, then the correction or bonus, then -1) and accepted [B]
(decisions); num_out [B] (exact). Margins as speculative_accept: tokens.margin at an
accepted depth is the smallest |distance| of that depth's accept tests, at the last
token the draw's (race log-ratio, or greedy top-1 minus top-2 logit); accepted.margin
the smallest over all tests (greedy: the logit gaps of every depth).
"""

from __future__ import annotations

import heapq

import numpy as np

from reference import precision as P
from reference import scales
from reference.precision import represent, work
from reference.rng import Purpose, exponential_race, uniform
from reference.target_distribution import argmax_with_gap

INF = float("inf")
MAX_NODES = 64
FLOOR = -80.0  # path scores below this involve a q within a few binades of FP32's smallest normal


def _softmax(x) -> np.ndarray:
    e = P.exp(x - x.max())
    return e / e.sum()


def _q(energies_row, rho) -> np.ndarray:
    """FP32 q over the k candidates of one predecessor row."""
    e = work(energies_row)
    return represent(_softmax(e / e.dtype.type(rho)), "fp32")


def walk(ids, energies, temperature, seed, frontier) -> tuple[list[int], float]:
    """The main chain's ranks j_0 .. j_(K-1) (the candidate_selector walk on given
    energies) and its smallest decision margin (greedy E lead, or race log-ratio)."""
    K = ids.shape[0]
    t = float(temperature)
    ranks, prev, margin = [], 0, INF
    for i in range(K):
        e = work(energies[i, prev])
        if t <= 0:
            j = int(np.argmax(e))  # first maximum: the lowest rank (C4)
            m = float(e[j] - np.delete(e, j).max()) if e.size > 1 else INF
        else:
            j, m = exponential_race(_q(energies[i, prev], t), seed, frontier + i, Purpose.DFLASH2_PROPOSAL)
        ranks.append(j)
        margin = min(margin, m)
        prev = j
    return ranks, margin


def build_tree(ids, energies, temperature, seed, frontier, tree_nodes) -> tuple[list, float]:
    """Nodes [(depth, rank, parent, on_main_chain)] and the smallest margin of the shape:
    the walk's, and each best-first pick's score lead over the best candidate left behind
    (0 for a pick scoring below FLOOR)."""
    K, k = ids.shape
    t = float(temperature)
    rho = t if t > 0 else 1.0
    chain, lead = walk(ids, energies, temperature, seed, frontier)
    nodes, score = [], []
    for i in range(min(tree_nodes, K)):
        nodes.append((i, chain[i], i - 1, True))
        prev = chain[i - 1] if i else 0
        score.append((score[-1] if i else 0.0) + float(np.log(np.float64(_q(energies[i, prev], rho)[chain[i]]))))
    taken = {(n[2], n[1]) for n in nodes}  # (parent node, rank) already in the tree
    heap = []

    def push_children(n):
        depth = nodes[n][0] + 1 if n >= 0 else 0
        if depth >= K:
            return
        prev = nodes[n][1] if n >= 0 else 0
        with np.errstate(divide="ignore"):  # an FP32 q of 0 scores -inf: last, by the tie rule
            logq = np.log(_q(energies[depth, prev], rho).astype(np.float64))
        base = score[n] if n >= 0 else 0.0
        for c in range(k):
            if (n, c) not in taken:
                heapq.heappush(heap, (-(base + logq[c]), depth, n, c))

    if tree_nodes > K:
        for n in range(-1, len(nodes)):
            push_children(n)
    while len(nodes) < tree_nodes and heap:
        neg, depth, parent, c = heapq.heappop(heap)
        if -neg < FLOOR:
            lead = 0.0  # a path through a q near FP32 underflow: flush-to-zero would reorder it
        elif heap:
            lead = min(lead, heap[0][0] - neg)
        nodes.append((depth, c, parent, False))
        score.append(-neg)
        taken.add((parent, c))
        push_children(len(nodes) - 1)
    return nodes, lead


def _after_rejection(r, g) -> np.ndarray:
    """The next stage's target: max(r - g, 0) normalized, or r when that has no mass (C6)."""
    nxt = np.maximum(r - g, 0)
    return nxt / nxt.sum() if nxt.sum() > 0 else r


def _after_rejection_scale(r, sr, g, sg) -> np.ndarray:
    """s of _after_rejection's result (FP32 units): the difference's terms and rounding,
    through the normalization (C2 v2, the decisions' band)."""
    nxt = np.maximum(r - g, 0)
    total = nxt.sum()
    if total <= 0:
        return sr
    return np.where(nxt > 0, (sr + sg + np.abs(r - g)) / total + nxt / total, 0.0)


def _verify_row(nodes, ids, energies, temperature, seed, frontier, bigram, anchor, W):
    t = float(temperature)
    tokens = np.full(W, -1, dtype=np.int32)
    tok_margin = np.full(W, INF)
    acc_margin = INF
    tok_scale, acc_scale = np.zeros(W), 0.0  # the magnitude of the scores each margin compares (FP32 units)
    node, prev, depth = -1, int(anchor), 0
    while True:
        kids = [n for n, nd in enumerate(nodes) if nd[2] == node]
        z = work(bigram[prev])
        pos = frontier + 1 + depth
        if t <= 0:
            top, gap = argmax_with_gap(z)
            tokens[depth], tok_margin[depth] = top, gap
            tok_scale[depth] = scales.greedy_scale(np.asarray(z, np.float64), np.zeros(np.shape(z)))
            hit = [n for n in kids if ids[nodes[n][0], nodes[n][1]] == top]
            if kids and gap < acc_margin:
                acc_margin, acc_scale = gap, tok_scale[depth]
            if not hit:
                return tokens, tok_margin, depth, acc_margin, tok_scale, acc_scale
            node, prev, depth = hit[0], top, depth + 1
            continue
        p = _softmax(z / z.dtype.type(t))
        y = np.asarray(z, np.float64) / t
        r, sr = p, scales.softmax_scale(p, y, np.abs(y), np.isfinite(y))
        sp = sr
        chosen = None
        dists, dist_scales = [], []
        for j, n in enumerate(kids):
            d_i, c_rank, parent, main = nodes[n]
            c = int(ids[d_i, c_rank])
            g = np.zeros_like(p)
            sg = np.zeros(np.shape(p))
            if main:  # the walk drew it from q; every other node is a deterministic pick
                prev_rank = nodes[parent][1] if parent >= 0 else 0
                qrow = _q(energies[d_i, prev_rank], t)
                np.add.at(g, np.asarray(ids[d_i], dtype=np.int64), qrow)
                ye = np.asarray(energies[d_i, prev_rank], np.float64) / t
                np.add.at(sg, np.asarray(ids[d_i], dtype=np.int64),
                          scales.softmax_scale(qrow, ye, np.abs(ye), np.ones(ye.shape, bool)))
            else:
                g[c] = 1
            u = work(uniform(seed, pos, Purpose.ACCEPT, j))
            dist = float(r[c] - u * g[c])
            dists.append(abs(dist))
            dist_scales.append(float(sr[c] + abs(u) * sg[c] + abs(u * g[c])))
            if dist > 0:
                chosen = (n, c)
                break
            r, sr = _after_rejection(r, g), _after_rejection_scale(r, sr, g, sg)
        if dists:
            k = int(np.argmin(dists))
            if dists[k] < acc_margin:
                acc_margin, acc_scale = dists[k], dist_scales[k]
        if chosen is not None:
            k = int(np.argmin(dists))
            tokens[depth], tok_margin[depth], tok_scale[depth] = chosen[1], dists[k], dist_scales[k]
            node, prev, depth = chosen[0], chosen[1], depth + 1
            continue
        purpose, weights, sw = (Purpose.CORRECTION, r, sr) if kids else (Purpose.BONUS, p, sp)
        tokens[depth], tok_margin[depth] = exponential_race(np.asarray(weights, np.float64), seed, pos, purpose)
        tok_scale[depth] = scales.race_scale(weights, sw, seed, pos, purpose)
        return tokens, tok_margin, depth, acc_margin, tok_scale, acc_scale


def tree_verify(anchor, ids, energies, temperature, seed, frontier, target_bigram, tree_nodes) -> dict[str, np.ndarray]:
    """The Op (C3, C4, C6): build the tree from the lattice, verify it against the bigram target."""
    ids = np.asarray(ids)
    B, K = ids.shape[:2]
    N = int(tree_nodes)
    if not 1 <= N <= MAX_NODES:
        raise ValueError(f"tree_verify: tree_nodes = {N} outside 1..{MAX_NODES}")
    W = K + 1
    parent = np.full((B, N), -1, dtype=np.int32)
    node_tokens = np.full((B, N), -1, dtype=np.int32)
    mask = np.zeros((B, N, N), dtype=np.uint8)
    tokens = np.full((B, W), -1, dtype=np.int32)
    tok_margin = np.full((B, W), INF)
    accepted = np.zeros(B, dtype=np.int32)
    acc_margin = np.full(B, INF)
    tok_scale, acc_scale = np.zeros((B, W)), np.zeros(B)
    for b in range(B):
        s, F, T = np.uint64(seed[b]), int(frontier[b]), temperature[b]
        nodes, _ = build_tree(ids[b], energies[b], T, s, F, N)
        for n, (d, c, par, _) in enumerate(nodes):
            parent[b, n], node_tokens[b, n] = par, ids[b, d, c]
            mask[b, n] = mask[b, par] if par >= 0 else 0
            mask[b, n, n] = 1
        tokens[b], tok_margin[b], accepted[b], acc_margin[b], tok_scale[b], acc_scale[b] = _verify_row(
            nodes, ids[b], energies[b], T, s, F, target_bigram, anchor[b], W
        )
    return {
        "parent": parent,
        "node_tokens": node_tokens,
        "tree_mask": mask,
        "tokens": tokens,
        "tokens.margin": tok_margin,
        "tokens.scale": tok_scale,
        "accepted": accepted,
        "accepted.margin": acc_margin,
        "accepted.scale": acc_scale,
        "num_out": accepted + 1,
    }
