"""The fuzz strategies, one per Op (``conformance/strategies/<op>.py``), for ``dflash-conformance fuzz``.

Each draws an Op's *parameters* (shapes, head counts, positions, seeds, temperatures, filters,
layouts and the pitfall designs of the case generators) and builds the example with the case
generators' own building blocks. ``STRATEGIES`` maps each Op to its strategy; its order is the
order in which ``fuzz`` and the reports walk the Ops.
"""

from __future__ import annotations

from conformance.strategies import (
    candidate_selector,
    candidate_topk,
    context_kv,
    draft_attention,
    draft_layer,
    feature_capture,
    grouped_conv,
    masked_block,
    preview_commit,
    proposal_head,
    proposal_round,
    speculative_accept,
    speculative_step,
    target_distribution,
    tree_verify,
)
from conformance.strategies.base import (
    FLAG,
    HAVE_HYPOTHESIS,
    MISSING,
    Reject,
    Strategy,
    _need,
    case_id,
)

STRATEGIES: dict[str, Strategy] = {s.op: s for s in [
    candidate_selector.STRATEGY,
    candidate_topk.STRATEGY,
    context_kv.STRATEGY,
    draft_attention.STRATEGY,
    draft_layer.STRATEGY,
    feature_capture.STRATEGY,
    grouped_conv.STRATEGY,
    masked_block.STRATEGY,
    preview_commit.STRATEGY,
    proposal_head.STRATEGY,
    proposal_round.STRATEGY,
    speculative_step.STRATEGY,
    speculative_accept.STRATEGY,
    target_distribution.STRATEGY,
    tree_verify.STRATEGY,
]}


def strategy(op: str) -> Strategy:
    _need()
    if op not in STRATEGIES:
        raise KeyError(f"no fuzz strategy for Op {op!r}")
    return STRATEGIES[op]


__all__ = ["FLAG", "HAVE_HYPOTHESIS", "MISSING", "STRATEGIES", "Reject", "Strategy", "case_id", "strategy"]
