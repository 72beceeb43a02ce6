"""Cases for candidate_topk (stable top-k of the proposal head, CONTRACTS C4; docs/ops.md
sweep: ties at the k boundary, shortlist head).

Two kinds of input:
- random heads (shapes, multiplier, softcap, shortlist), redrawn until every rank is
  decided by a gap far above float32 rounding;
- planted heads for ties, padding and remap: each position's hidden is one-hot on its
  own channel, so its logits are one column of the head. In every column the planted
  rows take distinct rungs of a ladder (in a per-column random order); the rows of a
  tie group are copies of one another (or, per_position, equal in that column only)
  pinned to a chosen rank, and padding rows
  (global id >= vocab_size) sit above everything. Planted values are BF16 numbers
  (even integers below 256, or k/16 near 0), so every logit that can reach the top
  k + 1, and so every tie, is exact in BF16, FP32 and float64 alike.

topk_unstable: ties decided by the higher row, by an unstable sort, by the global id
instead of the shortlist row, or created by applying multiplier and softcap in BF16
before selection. Tie groups hold their rows in scrambled order, and the softcap
cases give higher raw logits to higher rows, so each of those orders differs.
"""

from __future__ import annotations

import numpy as np

from conformance.registry import DECISION, FP32_OUTPUT, REPRESENTED, Case, OpSpec, Output, case_rng, register
from reference import scales
from reference.backend import portable
from reference.candidate_topk import candidate_topk
from reference.numerics import storage

OP = "candidate_topk"
TOP_K = 16
MIN_RANDOM_MARGIN = 1e-3  # in units of the logit scale; float32 logit error is ~1e-6 of it


def _case(case_id, hidden, head, params, flags=(), shortlist=None) -> Case:
    inputs = {"hidden": storage(hidden, "bf16"), "head": storage(head, "bf16")}
    if shortlist is not None:
        inputs["shortlist"] = np.asarray(shortlist, dtype=np.int32)
    params = {"top_k": TOP_K, "output_multiplier": 0.0, "softcap": 0.0, **params}
    return Case(id=case_id, inputs=inputs, params=params, flags=tuple(flags))


def _random(case_id, b, k, h, vr, *, vocab_size=None, scale=1.0, shortlist_vocab=None, flags=(), **params) -> Case:
    """Gaussian hidden and head (logits ~ N(0, scale^2)), redrawn until clear."""
    rng = case_rng(case_id)
    shortlist = None
    if shortlist_vocab is not None:
        shortlist = rng.choice(shortlist_vocab, size=vr, replace=False)
    vocab_size = vr if vocab_size is None else vocab_size
    for _ in range(100):
        hidden = rng.standard_normal((b, k, h))
        head = rng.standard_normal((vr, h)) * (scale / np.sqrt(h))
        case = _case(case_id, hidden, head, {"vocab_size": vocab_size, **params}, flags, shortlist)
        margin = candidate_topk(**case.kwargs())["ids.margin"]
        if margin.min() >= MIN_RANDOM_MARGIN * scale:
            return case
    raise RuntimeError(f"{case_id}: no clear draw")


def _onehot_hidden(b: int, k: int, h: int) -> np.ndarray:
    hidden = np.zeros((b, k, h))
    for p in range(b * k):
        hidden[p // k, p % k, p % h] = 1.0
    return hidden


def _planted(
    case_id,
    b,
    k,
    h,
    vr,
    *,
    vocab_size=None,
    groups=(),
    n_free=24,
    top=100.0,
    step=2.0,
    floor=0.0,
    free_order="random",
    per_column_groups=False,
    shortlist=None,
    flags=(),
    **params,
) -> Case:
    """Planted ladder (see the module doc). groups: (start rank, size) pairs; their rows
    are drawn at random among eligible rows, so row order is scrambled against rank.
    per_column_groups: every column ties its own rows (equal in that column only), so
    each position holds independent ties; otherwise tied rows are whole-row copies."""
    rng = case_rng(case_id)
    vocab_size = vr if vocab_size is None else vocab_size
    gid = np.arange(vr) if shortlist is None else np.asarray(shortlist)
    eligible = np.flatnonzero((gid >= 0) & (gid < vocab_size))
    n_group_rows = sum(size for _, size in groups)
    chosen = rng.choice(eligible, size=n_free + n_group_rows, replace=False)
    free = chosen[n_group_rows:]

    def draw_groups(pool):
        rows, at = [], 0
        for _, size in groups:
            rows.append(pool[at : at + size])
            at += size
        return rows

    group_rows = draw_groups(chosen)
    spare = np.setdiff1d(eligible, free)
    head = floor + rng.integers(-8, 9, (vr, h)) / 16.0  # unplanted rows: within 1/2 of floor
    for col in range(h):
        if per_column_groups:
            group_rows = draw_groups(rng.choice(spare, size=n_group_rows, replace=False))
        if free_order == "random":
            order = list(rng.permutation(free))
        else:  # higher rows get higher logits: row order disagrees with rank order everywhere
            order = sorted(free, reverse=True)
        units, placed = [], 0
        for (start, _), rows in sorted(zip(groups, group_rows), key=lambda t: t[0][0]):
            while placed < start:
                units.append([order.pop(0)])
                placed += 1
            units.append(list(rows))
            placed += len(rows)
        units += [[r] for r in order]
        for u, rows in enumerate(units):
            head[rows, col] = top - step * u
    if not per_column_groups:
        for rows in group_rows:
            head[rows] = head[rows[0]]  # exact copies: equal logits whatever the hidden
    head[np.flatnonzero(~((gid >= 0) & (gid < vocab_size)))] = top + 50.0  # padding rows lead
    return _case(case_id, _onehot_hidden(b, k, h), head, {"vocab_size": vocab_size, **params}, flags, shortlist)


def _all_equal(case_id, b, k, h, vr) -> Case:
    rng = case_rng(case_id)
    hidden = rng.integers(-8, 9, (b, k, h)) / 8.0
    head = np.broadcast_to(rng.integers(-8, 9, h) / 16.0, (vr, h))
    return _case(case_id, hidden, head, {"vocab_size": vr}, ("topk_unstable", "exact_tie"))


def _shortlist(rng_id: str, vr: int, vocab: int, n_pad: int) -> np.ndarray:
    """Distinct global ids in a random (non-monotone) order; n_pad of them >= vocab."""
    rng = case_rng(rng_id + "#shortlist")
    ids = np.concatenate([rng.choice(vocab, vr - n_pad, replace=False), vocab + rng.choice(64, n_pad, replace=False)])
    return rng.permutation(ids)


def generate() -> list[Case]:
    op = OP
    tie = ("topk_unstable", "exact_tie")
    sl = _shortlist(f"{op}/shortlist", 256, 2900, 12)
    cases = [
        _random(f"{op}/Vr64_H16_K1_B1", 1, 1, 16, 64),
        _random(f"{op}/Vr256_H32_K3_B2", 2, 3, 32, 256),
        _random(f"{op}/Vr512_H64_K15_B1", 1, 15, 64, 512),
        _random(f"{op}/Vr300_H48_K7_B3", 3, 7, 48, 300),
        _random(f"{op}/top_k1_Vr128_H32_K4", 1, 4, 32, 128, top_k=1),
        _random(f"{op}/top_k4_Vr128_H32_K4", 1, 4, 32, 128, top_k=4),
        _random(f"{op}/multiplier_0.25_Vr256_H32_K3", 1, 3, 32, 256, scale=4.0, output_multiplier=0.25),
        _random(f"{op}/softcap_15_Vr256_H32_K3", 2, 3, 32, 256, scale=20.0, softcap=15.0),
        _random(
            f"{op}/multiplier_2_softcap_30_Vr256_H64_K4", 1, 4, 64, 256, scale=8.0, output_multiplier=2.0, softcap=30.0
        ),
        _random(
            f"{op}/vocab_padding__random_Vr384_vocab300_H32_K3", 1, 3, 32, 384, vocab_size=300, flags=("vocab_padding",)
        ),
        _random(
            f"{op}/shortlist_remap__random_Vr256_H32_K3",
            2,
            3,
            32,
            256,
            shortlist_vocab=4000,
            vocab_size=4000,
            flags=("shortlist_remap",),
        ),
        _planted(f"{op}/all_logits_negative_Vr128_H32_K3", 1, 3, 32, 128, top=-10.0, floor=-120.0),
        _planted(
            f"{op}/vocab_padding__pad_rows_largest_Vr512_vocab500",
            2,
            3,
            32,
            512,
            vocab_size=500,
            flags=("vocab_padding",),
        ),
        _planted(
            f"{op}/vocab_padding__exactly_k_eligible_Vr64_vocab16",
            1,
            3,
            16,
            64,
            vocab_size=16,
            n_free=16,
            flags=("vocab_padding",),
        ),
        _planted(
            f"{op}/shortlist_remap__pad_entries_largest_Vr256",
            1,
            4,
            32,
            256,
            vocab_size=2900,
            shortlist=sl,
            flags=("shortlist_remap", "vocab_padding"),
        ),
        _planted(f"{op}/topk_unstable__tie_at_k_boundary", 2, 3, 32, 256, groups=[(15, 2)], flags=tie),
        _planted(
            f"{op}/topk_unstable__tie_at_k_boundary_per_position",
            2,
            4,
            32,
            256,
            groups=[(15, 2)],
            per_column_groups=True,
            flags=tie,
        ),
        _planted(f"{op}/topk_unstable__tie4_straddling_k_boundary", 1, 4, 32, 256, groups=[(14, 4)], flags=tie),
        _planted(f"{op}/topk_unstable__ties_inside_topk", 1, 3, 32, 256, groups=[(0, 2), (3, 3), (9, 5)], flags=tie),
        _planted(f"{op}/topk_unstable__tie_at_k_boundary_top_k4", 1, 3, 16, 128, groups=[(2, 4)], top_k=4, flags=tie),
        _all_equal(f"{op}/topk_unstable__all_rows_equal", 1, 2, 16, 64),
        _planted(
            f"{op}/topk_unstable__shortlist_tie_row_order",
            1,
            3,
            32,
            256,
            vocab_size=2900,
            shortlist=sl,
            groups=[(4, 3), (15, 3)],
            flags=(*tie, "shortlist_remap"),
        ),
        # m z in [50, 100]: c tanh(m z / c) near 29..30, where BF16's spacing 0.125 exceeds the
        # transformed gaps (0.005..0.1) while raw gaps are 2: BF16 ties, FP32 distinct
        _planted(
            f"{op}/bf16_tie__softcap_transformed_ties",
            1,
            3,
            32,
            256,
            top=200.0,
            step=2.0,
            n_free=40,
            free_order="descending_rows",
            output_multiplier=0.5,
            softcap=30.0,
            flags=("bf16_tie",),
        ),
        # z / c in [10, 25]: tanh is 1 in FP32 too, so every score is exactly c; the ids keep raw order
        _planted(
            f"{op}/bf16_tie__softcap_saturated_fp32_ties",
            1,
            2,
            16,
            128,
            top=100.0,
            step=2.0,
            free_order="descending_rows",
            softcap=4.0,
            flags=("bf16_tie",),
        ),
        _nan_scores(f"{op}/nan_scores__inf_hidden_times_zero_head_Vr32_K2"),
        _vocab_boundary(f"{op}/vocab_pad_boundary__last_public_and_first_pad_lead_Vr64_vocab40"),
        _nan_order(f"{op}/nan_order__nan_rows_below_inf_rows_Vr48_K2"),
    ]
    return cases


def _vocab_boundary(case_id) -> Case:
    """The last public row (vocab_size - 1) leads every column among the public rows, the padding rows
    (the first of them, vocab_size, included) lead overall: a vocabulary bound off by one either way
    changes the top-k."""
    vr, vocab = 64, 40
    case = _planted(case_id, 1, 3, 16, vr, vocab_size=vocab, flags=("vocab_pad_boundary",))
    head = np.array(case.inputs["head"], np.float64)
    head[vocab - 1] = 120.0  # above the ladder (top 100), below the padding rows (150)
    return _case(case_id, _onehot_hidden(1, 3, 16), head, case.params, case.flags)


def _nan_order(case_id) -> Case:
    """As _nan_scores, with at most 12 rows +inf, the rest -inf and eight NaN rows, the lowest
    rows among them: top-16 holds every +inf row and the first -inf rows. NaN read as -inf, as +inf,
    or placed between the numbers and -inf each puts NaN rows into the top-16 or reorders it."""
    rng = case_rng(case_id)
    vr, h = 48, 16
    hidden = rng.standard_normal((1, 2, h))
    hidden[0, 0, 0] = np.inf
    head = rng.standard_normal((vr, h)) / np.sqrt(h)
    sign = np.where(np.arange(vr) % 4 == 1, 1.0, -1.0)  # 12 rows +inf, before the NaN rows below
    head[:, 0] = sign * rng.uniform(0.5, 1.5, vr)
    head[[0, 1, 3, 4, 7, 9, 20, 30], 0] = 0.0  # NaN rows (inf * 0)
    return _case(case_id, hidden, head, {"vocab_size": vr}, ("nan_order", "nan_scores"))


def _nan_scores(case_id) -> Case:
    """FP16 overflow upstream: one position's hidden holds +inf, so its logits are +inf, -inf, or NaN
    (inf * 0) where a head row's weight on that element is 0. The C4 order (docs/contracts.md): NaN
    ranks after every number, -inf included, ties by lower row; the other position is ordinary."""
    rng = case_rng(case_id)
    vr, h = 32, 16
    hidden = rng.standard_normal((1, 2, h))
    hidden[0, 0, 0] = np.inf
    head = rng.standard_normal((vr, h)) / np.sqrt(h)
    head[:, 0] = np.where(rng.random(vr) < 0.5, 1.0, -1.0) * rng.uniform(0.5, 1.5, vr)
    head[[0, 1, 2, 5, 11], 0] = 0.0  # NaN rows, among them the first ones
    return _case(case_id, hidden, head, {"vocab_size": vr}, ("nan_scores",))


@portable
def force(kwargs, impl):
    """Teacher forcing (C2): the reference's scores at the implementation's ids."""
    return candidate_topk(**kwargs, forced_ids=impl["ids"])


SPEC = register(
    OpSpec(
        name=OP,
        reference=candidate_topk,
        inputs=("hidden", "head", "shortlist"),
        params=("vocab_size", "top_k", "output_multiplier", "softcap"),
        outputs=(Output("scores", REPRESENTED, "fp32"), Output("ids", DECISION)),
        generate=generate,
        force=force,
        envelope={"scores": FP32_OUTPUT},
        scales=scales.candidate_topk,
        decision_k=FP32_OUTPUT.k,
        doc="DFlash2 unary candidates: stable top-k of raw head logits, then multiplier/softcap in FP32",
    )
)
