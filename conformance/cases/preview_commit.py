"""Cases for preview_commit (CONTRACTS C6; docs/ops.md sweep: N = 0, N = L, EOS inside
the block, budget 1).

Every case carries the param ``mask_token_id`` (an addition to docs/ops.md, which
lists no params): the reference ignores it, because a token equal to the mask id
is published like any other; an implementation that strips it fails the
mask_token_stripped cases. preview_cut_before_eos cases put the EOS (or stop id)
strictly inside the licensed tokens, so cutting before it changes n.
"""

from __future__ import annotations

import numpy as np

from conformance.registry import EXACT, Case, OpSpec, Output, case_rng, register
from reference.preview_commit import preview_commit

OP = "preview_commit"
OUTPUTS = ("n", "committed", "published", "next_anchor", "frontier", "ctx_frontier", "pending")
VOCAB = 1000
MASK = 999  # the case's mask_token_id


def pc_inputs(
    tokens,
    num_out,
    anchor,
    frontier,
    *,
    budget=10**6,
    cancel=0,
    eos_ids=(),
    stop_ids=(),
    ctx_frontier=None,
    mask_token_id=MASK,
) -> tuple[dict, dict]:
    """(inputs in storage dtypes, params); per-request scalars broadcast."""
    tokens = np.asarray(tokens, dtype=np.int32)
    B = tokens.shape[0]

    def per_row(x, dtype):
        return np.broadcast_to(np.asarray(x, dtype=dtype), (B,)).copy()

    frontier = per_row(frontier, np.int64)
    inputs = {
        "tokens": tokens,
        "num_out": per_row(num_out, np.int32),
        "anchor": per_row(anchor, np.int32),
        "frontier": frontier,
        "ctx_frontier": frontier.copy() if ctx_frontier is None else per_row(ctx_frontier, np.int64),
        "budget": per_row(budget, np.int64),
        "cancel": per_row(cancel, np.uint8),
        "eos_ids": np.asarray(eos_ids, dtype=np.int32).reshape(-1),
        "stop_ids": np.asarray(stop_ids, dtype=np.int32).reshape(-1),
    }
    return inputs, {"mask_token_id": int(mask_token_id)}


def _block(rng, B, W, L, avoid=()):
    """Licensed tokens (ids not in ``avoid``), -1 past each row's L."""
    L = np.broadcast_to(np.asarray(L), (B,))
    pool = np.setdiff1d(np.arange(VOCAB - 1), np.asarray(avoid, dtype=np.int64))
    tokens = np.full((B, W), -1, np.int64)
    for b in range(B):
        tokens[b, : L[b]] = rng.choice(pool, L[b])
    return tokens, L


def _case(case_id, flags=(), *, B=1, W=8, L=None, place=(), eos=(900, 901), stop=(950,), **kw) -> Case:
    """Random block; ``place`` puts (row, column, token) triples into the licensed tokens."""
    rng = case_rng(case_id)
    L = W if L is None else L
    tokens, L = _block(rng, B, W, L, avoid=(*eos, *stop, MASK))
    for b, col, tok in place:
        tokens[b, col] = tok
    inputs, params = pc_inputs(
        tokens,
        L,
        rng.integers(0, VOCAB - 1, B),
        kw.pop("frontier", rng.integers(0, 2**20, B)),
        eos_ids=eos,
        stop_ids=stop,
        **kw,
    )
    preview_commit(**inputs, **params)  # a case the reference refuses is no case
    return Case(id=case_id, inputs=inputs, params=params, flags=tuple(flags))


def generate() -> list[Case]:
    c = f"{OP}/"
    return [
        _case(f"{c}N_equals_L_full_block_W8"),
        _case(f"{c}N_equals_L_mixed_L_B4_W16", B=4, W=16, L=[1, 5, 16, 9]),
        _case(f"{c}L1_correction_only", B=2, W=4, L=1),
        _case(f"{c}N0_cancel", cancel=1),
        _case(f"{c}N0_cancel_mixed_B4", B=4, W=6, L=[6, 3, 1, 4], cancel=[1, 0, 1, 0]),
        _case(f"{c}N0_budget_0_and_negative", B=2, budget=[0, -3]),
        _case(f"{c}budget_1", B=3, W=5, L=[5, 1, 3], budget=1),
        _case(f"{c}budget_below_L", B=3, W=8, L=[8, 6, 7], budget=[3, 5, 6]),
        _case(f"{c}budget_equal_and_above_L", B=2, W=8, L=[4, 8], budget=[4, 9]),
        _case(f"{c}preview_cut_before_eos__eos_mid_block", ("preview_cut_before_eos",), W=8, place=[(0, 3, 900)]),
        _case(f"{c}preview_cut_before_eos__eos_at_y1", ("preview_cut_before_eos",), W=6, place=[(0, 0, 901)]),
        _case(f"{c}preview_cut_before_eos__stop_id_mid_block", ("preview_cut_before_eos",), W=8, place=[(0, 4, 950)]),
        _case(
            f"{c}preview_cut_before_eos__first_of_eos_and_stop",
            ("preview_cut_before_eos",),
            W=10,
            place=[(0, 6, 900), (0, 2, 950), (0, 8, 901)],
        ),
        _case(
            f"{c}preview_cut_before_eos__B4_mixed",
            ("preview_cut_before_eos",),
            B=4,
            W=8,
            L=[8, 5, 3, 8],
            place=[(0, 1, 900), (1, 3, 950), (3, 6, 901)],
            budget=[10, 10, 10, 4],
        ),
        _case(f"{c}eos_is_last_licensed_token", W=5, L=4, place=[(0, 3, 900)]),
        _case(f"{c}eos_past_L_is_ignored", W=6, L=3, place=[(0, 4, 900)]),
        _case(f"{c}eos_and_budget_budget_first", W=8, place=[(0, 5, 900)], budget=2),
        _case(f"{c}eos_cancelled", W=8, place=[(0, 2, 900)], cancel=1),
        _case(f"{c}no_eos_or_stop_lists", W=6, eos=(), stop=()),
        _case(f"{c}many_eos_ids", W=8, eos=tuple(range(900, 940)), place=[(0, 5, 933)]),
        _case(f"{c}mask_token_stripped__published_mask_mid_block", ("mask_token_stripped",), W=8, place=[(0, 2, MASK)]),
        _case(f"{c}mask_token_stripped__mask_is_next_anchor", ("mask_token_stripped",), W=6, L=4, place=[(0, 3, MASK)]),
        _case(
            f"{c}mask_token_stripped__mask_before_eos",
            ("mask_token_stripped", "preview_cut_before_eos"),
            W=8,
            place=[(0, 1, MASK), (0, 2, 901)],
        ),
        _case(f"{c}frontiers_near_2p32_and_2p40", B=3, W=6, frontier=[2**32 - 3, 2**32, 2**40 + 1]),
        _case(
            f"{c}B8_W16_everything",
            B=8,
            W=16,
            L=[16, 1, 7, 12, 16, 3, 10, 5],
            place=[(0, 9, 900), (2, 2, MASK), (4, 15, 950), (6, 0, 901)],
            budget=[100, 1, 6, 0, 16, 2, 10, 5],
            cancel=[0, 0, 0, 0, 0, 1, 0, 0],
        ),
    ]


register(
    OpSpec(
        name=OP,
        reference=preview_commit,
        inputs=("tokens", "num_out", "anchor", "frontier", "ctx_frontier", "budget", "cancel", "eos_ids", "stop_ids"),
        params=("mask_token_id",),
        outputs=tuple(Output(name, EXACT) for name in OUTPUTS),
        generate=generate,
        doc="Frontend preview (EOS/stop/budget/cancel) and commit: rows, outputs, next anchor, pending features (C6)",
    )
)
