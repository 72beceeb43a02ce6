"""Cases for tree_verify (DFlash2 --draft-tree-nodes; docs/ops.md sweep: budget 1 (chain
only) up to 64).

The draft approximates the target: E_i[p, c] = bigram[pred_token(i, p), C_i[c]] + noise,
so scans run deep and the tree matters. Each case is redrawn from its generator until
every decision (the walk, each best-first pick, each accept test and draw) is at least
MARGIN from flipping; some cases further require that the accepted path leaves the
main chain (a sibling past the first accepted: its key index and the residual
update are exercised).
"""

from __future__ import annotations

import numpy as np

from conformance.registry import ACCEPT_TIE, DECISION, EXACT, FP32_OUTPUT, Case, OpSpec, Output, case_rng, register
from reference.tree_verify import build_tree, tree_verify

OP = "tree_verify"
MARGIN = 1e-3  # energy, probability or log-ratio units; the fp32 baseline errs by ~1e-6
# best-first picks: path scores are sums of <= 15 log q of FP32 q (|score| < 40); fp32 sums of
# them err by < 15 * 40 * 2^-24 = 4e-5, so a pick leading by 1e-4 cannot flip
LEAD = 1e-4
INPUTS = ("anchor", "ids", "energies", "temperature", "seed", "frontier", "target_bigram")


def tv_inputs(anchor, ids, energies, temperature, seed, frontier, target_bigram, tree_nodes) -> tuple[dict, dict]:
    ids = np.asarray(ids, dtype=np.int32)
    B = ids.shape[0]

    def per_row(x, dtype):
        return np.broadcast_to(np.asarray(x, dtype=dtype), (B,)).copy()

    inputs = {
        "anchor": per_row(anchor, np.int32),
        "ids": ids,
        "energies": np.asarray(energies, dtype=np.float32),
        "temperature": per_row(temperature, np.float32),
        "seed": per_row(seed, np.uint64),
        "frontier": per_row(frontier, np.int64),
        "target_bigram": np.asarray(target_bigram, dtype=np.float32),
    }
    return inputs, {"tree_nodes": int(tree_nodes)}


def lattice(rng, bigram, anchor, K, k, noise=0.5):
    """ids [K, k] and energies [K, k, k] of a draft that roughly follows the bigram target."""
    V = bigram.shape[0]
    ids = np.stack([rng.permutation(V)[:k] for _ in range(K)])
    e = np.empty((K, k, k))
    for i in range(K):
        pred = np.full(k, anchor) if i == 0 else ids[i - 1]
        e[i] = bigram[pred][:, ids[i]] + noise * rng.standard_normal((k, k))
    return ids, e


def clear(inputs, params, out) -> bool:
    """Every decision of every row at least MARGIN (tree shape: LEAD) from flipping."""
    for b in range(len(out["num_out"])):
        L = int(out["num_out"][b])
        if out["accepted.margin"][b] < MARGIN or np.any(out["tokens.margin"][b, :L] < MARGIN):
            return False
    for b in range(len(out["num_out"])):
        _, shape = build_tree(
            inputs["ids"][b],
            inputs["energies"][b],
            inputs["temperature"][b],
            np.uint64(inputs["seed"][b]),
            int(inputs["frontier"][b]),
            params["tree_nodes"],
        )
        if shape < LEAD:
            return False
    return True


def off_chain(inputs, params, out, rows=None) -> bool:
    """The accepted path of each row in ``rows`` leaves the main chain."""
    K = inputs["ids"].shape[1]
    chain_len = min(params["tree_nodes"], K)
    for b in range(len(out["num_out"])) if rows is None else rows:
        A = int(out["accepted"][b])
        chain = out["node_tokens"][b, :chain_len]
        n = min(A, chain_len)
        if np.array_equal(out["tokens"][b, :n], chain[:n]) and A <= chain_len:
            return False
    return True


def _case(
    case_id,
    *,
    B=1,
    K=4,
    k=16,
    V=24,
    N=8,
    T=1.0,
    seeds=None,
    frontiers=None,
    same_request=False,
    want=None,
    scale=3.0,
    noise=0.5,
    flags=(),
    attempts=3000,
) -> Case:
    rng = case_rng(case_id)
    for _ in range(attempts):
        bigram = rng.standard_normal((V, V)) * scale
        anchor = rng.integers(0, V, B)
        lat = [lattice(rng, bigram, anchor[b], K, k, noise) for b in range(B)]
        if same_request:
            lat, anchor = [lat[0]] * B, np.full(B, anchor[0])
        inputs, params = tv_inputs(
            anchor,
            np.stack([x[0] for x in lat]),
            np.stack([x[1] for x in lat]),
            T,
            rng.integers(0, 2**63, B, dtype=np.uint64) if seeds is None else seeds,
            rng.integers(8, 10**6, B) if frontiers is None else frontiers,
            bigram,
            N,
        )
        out = tree_verify(**inputs, **params)
        if (want is None or want(inputs, params, out)) and clear(inputs, params, out):
            case = Case(id=case_id, inputs=inputs, params=params, flags=tuple(flags))
            from conformance.mutants import decisions_differ

            if decisions_differ(case):  # every mutant its flags name changes its tokens
                return case
    raise RuntimeError(f"{case_id}: no clear draw in {attempts} attempts")


def _deep(a):
    return lambda inputs, params, out: bool(np.all(out["accepted"] >= a))


def _accepts(a):
    return lambda inputs, params, out: bool(np.all(out["accepted"] == a))


def generate() -> list[Case]:
    c = f"{OP}/"
    return [
        _case(f"{c}budget1_chain_only_greedy", N=1, T=0.0),
        _case(f"{c}budget1_chain_only_sampled", N=1, want=_accepts(1)),
        _case(f"{c}budget2_below_K6_greedy", K=6, N=2, T=0.0, want=_accepts(2)),
        _case(f"{c}budget3_below_K6_sampled", K=6, N=3, T=0.8, want=_accepts(2), flags=("sibling_residual",)),
        _case(f"{c}budget_K4_is_the_chain_greedy", K=4, N=4, T=0.0, want=_accepts(2)),
        _case(f"{c}budget_K4_is_the_chain_sampled", K=4, N=4, want=_accepts(3)),
        _case(f"{c}budget_K4_all_accept_bonus_sampled", K=4, N=4, T=0.5, want=_accepts(4)),
        _case(f"{c}budget_K_plus_1_greedy", K=4, N=5, T=0.0),
        _case(f"{c}budget8_off_chain_greedy", K=4, N=8, T=0.0, noise=1.5, want=off_chain),
        _case(f"{c}budget8_off_chain_sampled", K=4, N=8, want=off_chain),
        _case(f"{c}budget16_off_chain_sampled_T0.7", K=6, N=16, T=0.7, want=off_chain),
        _case(f"{c}budget64_K7_greedy", K=7, N=64, T=0.0, noise=1.5, want=off_chain),
        _case(f"{c}budget64_K7_sampled", K=7, N=64, T=1.0, want=off_chain, flags=("sibling_residual",)),
        _case(f"{c}budget64_K15_sampled_deep", K=15, N=64, T=0.6, noise=0.3, want=_deep(3)),
        _case(f"{c}budget64_K1_fewer_nodes_than_budget", K=1, N=64, T=1.0),
        _case(f"{c}small_k4_budget20_sampled", K=3, k=4, V=16, N=20, want=off_chain),
        _case(f"{c}B3_mixed_temperatures", B=3, K=5, N=12, T=np.array([0.0, 0.7, 1.3])),
        # 0 and 2^64-1 are symmetric under a swap of the key words: seed edges, not key-order tests
        *[
            _case(f"{c}seed_{name}", K=4, N=10, seeds=[seed], want=_deep(1))
            for name, seed in (("0", 0), ("2p64-1", 2**64 - 1))
        ],
        *[
            _case(f"{c}seed_{name}", K=4, N=10, seeds=[seed], want=_deep(1), flags=("rng_key",))
            for name, seed in (("1", 1), ("2p32", 2**32), ("2p63+5", 2**63 + 5))
        ],
        _case(
            f"{c}positions_above_2p32",
            B=2,
            K=5,
            N=10,
            frontiers=[2**32 + 3, 2**40 + 1],
            want=_deep(1),
            flags=("positions_2p32",),
        ),
        _case(
            f"{c}positions_cross_2p32",
            B=2,
            K=6,
            N=12,
            frontiers=[2**32 - 3, 2**32 - 1],
            want=_deep(2),
        ),
        _case(
            f"{c}rng_batch_row__same_request_3_rows",
            B=3,
            K=4,
            N=10,
            same_request=True,
            seeds=np.full(3, 4242, np.uint64),
            frontiers=np.full(3, 1000),
            flags=("rng_batch_row",),
        ),
    ]


register(
    OpSpec(
        name=OP,
        reference=tree_verify,
        inputs=INPUTS,
        params=("tree_nodes",),
        outputs=(
            Output("parent", EXACT),
            Output("node_tokens", EXACT),
            Output("tree_mask", EXACT),
            Output("tokens", DECISION),
            Output("accepted", DECISION, tie_rule=ACCEPT_TIE),
            Output("num_out", EXACT),
        ),
        independent=("parent", "node_tokens", "tree_mask"),
        generate=generate,
        decision_k=FP32_OUTPUT.k,  # tokens/accepted.scale: the envelope of the compared probabilities
        doc="DFlash2 tree of proposals from the selector lattice (main chain first, best-first), tree-mask verify",
    )
)
