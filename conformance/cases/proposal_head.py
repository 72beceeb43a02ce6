"""Cases for proposal_head: full head with padded vocabulary rows, indexed head with shortlist remap,
exact duplicate rows (tie rule C4) and distinct winners per column (next-token shift).

Each column's hidden is planted near one head row (hidden = row + noise), so its logit wins by about
|row|^2 - |row| |other|: margins are tens of logit units, never near the baseline's error. Planted
traps sit on top: padded rows at twice a winner (they would win if not masked), exact duplicates of
a winner at another row (lowest row must win), shortlist ids out of order around a tie.
"""

from __future__ import annotations

import numpy as np

from conformance.registry import DECISION, FP32_OUTPUT, Case, OpSpec, Output, case_rng, register
from reference import scales
from reference.backend import portable
from reference import numerics
from reference.numerics import storage
from reference.proposal_head import proposal_head


def bf16_near_ties(rng, head, hidden, winners, free) -> None:
    """For each column, a rival row below the winner's whose logit is one BF16 ulp of one head
    element lower: far outside the FP32 band of the logits, but both logits round to the same
    BF16 value, so an engine that rounds logits to BF16 ties them and (lowest row wins) picks the
    rival. Edits ``head`` in place (BF16 values); ``free`` are eligible rows no winner uses."""
    hid = numerics.to_bf16(hidden.reshape(len(winners), -1))
    for col, w in enumerate(winners):
        below = free[free < w]
        if below.size == 0:
            continue
        r = int(below[-1])
        free = free[free != r]
        for j in np.argsort(-np.abs(hid[col])):
            row = head[w].copy()
            row[j] -= np.sign(hid[col, j]) * numerics.quantum(row[j], "bf16")
            lw, lr = float(hid[col] @ head[w]), float(hid[col] @ row)
            if lw - lr > 0 and numerics.to_bf16(lw) == numerics.to_bf16(lr):
                head[r] = row
                break


def make(cid, flags, *, b, k, h, rows, vocab, indexed=False, pad_traps=False, ties=0, shortlist_traps=False,
         near_ties=False) -> Case:
    rng = case_rng(cid)
    head = rng.standard_normal((rows, h))
    eligible_ids = np.arange(rows)
    shortlist = None
    if indexed:
        shortlist = rng.choice(vocab, rows, replace=False)
        if shortlist_traps:  # a few shortlist ids past the public vocabulary (never chosen)
            shortlist[rng.choice(rows, 4, replace=False)] = vocab + np.arange(4)
        eligible_ids = shortlist
    eligible = np.flatnonzero(eligible_ids < vocab)
    # distinct winners per column (reading a neighbour column gives another token)
    winners = rng.choice(eligible, b * k, replace=False)
    traps = np.flatnonzero(eligible_ids >= vocab)
    if pad_traps or shortlist_traps:
        for t, w in zip(traps, winners):
            head[t] = 2.0 * head[w]
    if ties:
        # duplicate some winners at a spare row; which copy has the lower row index varies
        spare = rng.choice(np.setdiff1d(eligible, winners), ties, replace=False)
        for s, w in zip(spare, winners[:ties]):
            head[s] = head[w]
    hidden = head[winners].reshape(b, k, h) + 0.15 * rng.standard_normal((b, k, h))
    if near_ties:
        head = numerics.to_bf16(head)
        bf16_near_ties(rng, head, hidden, winners, np.setdiff1d(eligible, winners))
    inputs = {"hidden": storage(hidden, "bf16"), "head": storage(head, "bf16")}
    if indexed:
        inputs["shortlist"] = shortlist.astype(np.int32)
    return Case(id=cid, inputs=inputs, params={"vocab_size": int(vocab)}, flags=tuple(flags))


def generate() -> list[Case]:
    return [
        make("proposal_head/full_V64_vocab64_B1_K1_H16", [], b=1, k=1, h=16, rows=64, vocab=64),
        make("proposal_head/full_V128_vocab120_B3_K15_H32", [], b=3, k=15, h=32, rows=128, vocab=120),
        make("proposal_head/full_V512_vocab500_B2_K15_H64", [], b=2, k=15, h=64, rows=512, vocab=500),
        make("proposal_head/vocab_padding__full_V256_vocab200_B2_K7_H32", ["vocab_padding"], b=2, k=7, h=32,
             rows=256, vocab=200, pad_traps=True),
        make("proposal_head/vocab_padding__full_V96_vocab64_B1_K15_H32", ["vocab_padding"], b=1, k=15, h=32,
             rows=96, vocab=64, pad_traps=True),
        make("proposal_head/exact_tie__full_V128_vocab128_B1_K6_H32", ["exact_tie"], b=1, k=6, h=32, rows=128,
             vocab=128, ties=6),
        make("proposal_head/exact_tie__full_V200_vocab190_B2_K5_H48", ["exact_tie", "vocab_padding"], b=2, k=5, h=48,
             rows=200, vocab=190, ties=5, pad_traps=True),
        make("proposal_head/shortlist_remap__indexed_V96_vocab512_B2_K5_H32", ["shortlist_remap"], b=2, k=5, h=32,
             rows=96, vocab=512, indexed=True),
        make("proposal_head/shortlist_remap__exact_tie__indexed_V64_vocab300_B1_K8_H32",
             ["shortlist_remap", "exact_tie"], b=1, k=8, h=32, rows=64, vocab=300, indexed=True, ties=8),
        make("proposal_head/shortlist_remap__vocab_padding__indexed_V80_vocab256_B2_K4_H32",
             ["shortlist_remap", "vocab_padding"], b=2, k=4, h=32, rows=80, vocab=256, indexed=True,
             shortlist_traps=True),
        make("proposal_head/next_token_shift__full_V256_vocab256_B2_K8_H64", ["next_token_shift"], b=2, k=8, h=64,
             rows=256, vocab=256),
        make("proposal_head/next_token_shift__indexed_V128_vocab400_B1_K15_H32", ["next_token_shift",
             "shortlist_remap"], b=1, k=15, h=32, rows=128, vocab=400, indexed=True),
        make("proposal_head/full_V300_vocab256_B8_K3_H128", [], b=8, k=3, h=128, rows=300, vocab=256),
        make("proposal_head/bf16_logits__near_ties_V256_vocab256_B2_K6_H64", ["bf16_logits"], b=2, k=6, h=64,
             rows=256, vocab=256, near_ties=True),
    ]


@portable
def force(kwargs, impl):
    """Teacher forcing (C2): columns are independent, so an acceptable divergence in one changes no
    other; the reference itself describes the implementation's run."""
    return proposal_head(**kwargs, forced_tokens=impl["tokens"])


SPEC = register(
    OpSpec(
        name="proposal_head",
        reference=proposal_head,
        inputs=("hidden", "head", "shortlist"),
        params=("vocab_size",),
        outputs=(Output("tokens", DECISION),),
        generate=generate,
        bf16_intermediates=frozenset(),
        force=force,
        scales=scales.proposal_head,
        decision_k=FP32_OUTPUT.k,
        doc="DFlash per-column argmax over public head rows (lowest row wins ties), indexed head remapped",
    )
)
