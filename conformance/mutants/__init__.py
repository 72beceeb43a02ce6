"""The mutant catalog (CONTRACTS C9): implementations that each carry one bug of the pitfall catalog.

One module per Op (``conformance/mutants/<op>.py``) holds that Op's mutants; ``base`` holds the
``Mutant`` class and the helpers several Ops share. ``MUTANTS`` lists every Op-level mutant in the
catalog's order (diagnosis breaks ties and the reports list rows in that order, so a new mutant goes
at the end); ``ROUND_MUTANTS`` the round-level ones (``proposal_round`` and ``speculative_step``),
whose bugs no single Op receives.
"""

from __future__ import annotations

import numpy as np

from conformance import registry
from conformance.mutants import proposal_round as _round
from conformance.mutants import speculative_step as _step
from conformance.mutants.base import ROWS, Mutant
from conformance.mutants.candidate_selector import (
    SelectorBranchesSwapped,
    SelectorEngineSeed,
    SelectorPositions32,
    SelectorPredecessorRow,
    SelectorRngBatchRow,
    SelectorRngKey,
    SelectorTemperatureIgnored,
    SelectorTiesToHighest,
)
from conformance.mutants.candidate_topk import (
    TopkNanFirst,
    TopkShortlistNoRemap,
    TopkSoftcapBeforeSelection,
    TopkTiesToHighest,
    TopkVocabPadding,
)
from conformance.mutants.context_kv import (
    ChunkFirstRows,
    Fp32Positions,
    Fp32Positions2p32,
    KBf16BeforeNorm,
    KvRopeBf16Positions,
    KvRopeInterleaved,
    RingSlot,
    RingWriteNoWrap,
    VFp16WithoutBf16,
    VFtz,
    VSaturating,
)
from conformance.mutants.draft_attention import (
    Bf16TruncationAttention,
    CausalDraftAttention,
    DecodeRowsSharedLength,
    GqaInterleaved,
    Int32Positions,
    LeftOnlyWindow,
    LiveIgnored,
    RingReadUnwrapped,
    VInfTimesZero,
    WindowDropped,
    WindowLeS,
    WindowNarrow,
)
from conformance.mutants.draft_layer import (
    CausalDraftLayer,
    LayerGqaInterleaved,
    LayerInt32Positions,
    LayerLiveIgnored,
    LayerRingReadUnwrapped,
    LayerRopeInterleaved,
    LayerWindowNarrow,
    WindowLeSLayer,
)
from conformance.mutants.feature_capture import (
    Bf16TruncationFeatures,
    BoundaryIndex,
    CaptureBeforeLayer,
    LastBlockFinalNorm,
)
from conformance.mutants.grouped_conv import (
    ConvCol0Tap,
    ConvDeltaPerChannel,
)
from conformance.mutants.masked_block import (
    AnchorAsMask,
    BlockGqaInterleaved,
    BlockInt32Positions,
    BlockLiveIgnored,
    BlockRingReadUnwrapped,
    BlockRopeInterleaved,
    BlockWindowNarrow,
    Dflash2AllColumns,
    WindowLeSBlock,
)
from conformance.mutants.preview_commit import (
    MaskTokenStripped,
    PreviewCutBeforeEos,
)
from conformance.mutants.proposal_head import (
    Bf16Logits,
    HeadShortlistNoRemap,
    HeadTiesToHighest,
    HeadVocabPadding,
    NextTokenShift,
)
from conformance.mutants.speculative_accept import (
    AcceptEngineSeed,
    AcceptPositions32,
    AcceptPQSwapped,
    AcceptRngBatchRow,
    AcceptRngKey,
    AcceptTailExtent,
    AcceptVocabPadding,
    BonusFromWrongRow,
    CoinLeRatio,
    FiltersOnlyOnBonus,
    GreedyTiesLastWins,
    HistoryNotUpdated,
    PenaltiesLastTokenOnly,
    ResidualNoClamp,
    ResidualSumZeroNan,
    RngAdvancedP0,
    RngPurposeShared,
    SameDrawReused,
)
from conformance.mutants.target_distribution import (
    MinPMissing,
    MinPOnLogits,
    PenaltiesMissing,
    TargetTiesToHighest,
    TargetVocabPadding,
    TemperatureAfterFilters,
)
from conformance.mutants.tree_verify import (
    TreePositions32,
    TreeRngBatchRow,
    TreeRngKey,
    TreeSiblingResidual,
)

MUTANTS = [
    WindowLeS(),
    WindowLeSLayer(),
    WindowLeSBlock(),
    CausalDraftAttention(),
    CausalDraftLayer(),
    BoundaryIndex(),
    LastBlockFinalNorm(),
    RingSlot(),
    KBf16BeforeNorm(),
    Fp32Positions(),
    Fp32Positions2p32(),
    Bf16TruncationAttention(),
    Bf16TruncationFeatures(),
    VFp16WithoutBf16(),
    ConvCol0Tap(),
    ConvDeltaPerChannel(),
    TopkTiesToHighest(),
    TopkSoftcapBeforeSelection(),
    SelectorRngBatchRow(),
    SelectorPredecessorRow(),
    AcceptRngBatchRow(),
    AcceptPQSwapped(),
    HistoryNotUpdated(),
    BonusFromWrongRow(),
    ResidualNoClamp(),
    PreviewCutBeforeEos(),
    MaskTokenStripped(),
    AnchorAsMask(),
    Dflash2AllColumns(),
    NextTokenShift(),
    Bf16Logits(),
    LeftOnlyWindow(),
    DecodeRowsSharedLength(),
    WindowDropped(),
    WindowNarrow(),
    RingReadUnwrapped(),
    LiveIgnored(),
    Int32Positions(),
    VInfTimesZero(),
    GqaInterleaved(),
    LayerWindowNarrow(),
    LayerRingReadUnwrapped(),
    LayerLiveIgnored(),
    LayerInt32Positions(),
    LayerRopeInterleaved(),
    LayerGqaInterleaved(),
    BlockWindowNarrow(),
    BlockRingReadUnwrapped(),
    BlockLiveIgnored(),
    BlockInt32Positions(),
    BlockRopeInterleaved(),
    BlockGqaInterleaved(),
    RingWriteNoWrap(),
    ChunkFirstRows(),
    VSaturating(),
    VFtz(),
    KvRopeInterleaved(),
    KvRopeBf16Positions(),
    CaptureBeforeLayer(),
    HeadTiesToHighest(),
    HeadShortlistNoRemap(),
    HeadVocabPadding(),
    TopkShortlistNoRemap(),
    TopkVocabPadding(),
    TopkNanFirst(),
    SelectorRngKey(),
    SelectorEngineSeed(),
    SelectorTemperatureIgnored(),
    SelectorBranchesSwapped(),
    SelectorPositions32(),
    SelectorTiesToHighest(),
    AcceptRngKey(),
    AcceptEngineSeed(),
    AcceptVocabPadding(),
    AcceptTailExtent(),
    AcceptPositions32(),
    ResidualSumZeroNan(),
    CoinLeRatio(),
    GreedyTiesLastWins(),
    SameDrawReused(),
    RngPurposeShared(),
    RngAdvancedP0(),
    FiltersOnlyOnBonus(),
    PenaltiesLastTokenOnly(),
    TreeRngKey(),
    TreeRngBatchRow(),
    TreePositions32(),
    TreeSiblingResidual(),
    TemperatureAfterFilters(),
    MinPOnLogits(),
    PenaltiesMissing(),
    MinPMissing(),
    TargetVocabPadding(),
    TargetTiesToHighest(),
]

_seen: set = set()
for _m in MUTANTS:  # one key per mutant: a pitfall shared by several Ops takes the Op as its variant
    if _m.key in _seen:
        _m.variant = _m.op
    if _m.key in _seen:
        raise ValueError(f"two mutants with the key {_m.key}")
    _seen.add(_m.key)

ROUND_MUTANTS = [_round.ContextRoleWeights(), _round.LayerIdOrigin(), _round.CaptureBeforeLayer(),
                 _round.DraftTemperatureIgnored(), _step.FirstDraftUnverified(), _step.RngZeroProposal()]


def flags_of(mutant) -> tuple:
    """The case flags a mutant answers for: its pitfall and ``also``."""
    return (mutant.pitfall, *mutant.also)


def for_op(op: str) -> list:
    return [m for m in MUTANTS if m.op == op]


def for_flag(op: str, flag: str) -> list:
    """The mutants of ``op`` that a case of ``op`` flagged ``flag`` must FAIL."""
    return [m for m in MUTANTS if m.op == op and flag in flags_of(m)]


def decisions_differ(case, flags=None) -> bool:
    """At generation: does every mutant named by ``flags`` (default: the case's flags) change an exact or
    decision output of ``case``? Judged against the float64 reference; the case generator's own
    clearness test makes such a change a FAIL, which tests/mutants/test_bites.py then checks."""
    spec = registry.get(case.op)
    kinds = {o.name for o in spec.outputs if o.cls != registry.REPRESENTED}
    ref = spec.reference(**case.kwargs())
    for f in case.flags if flags is None else flags:
        for m in for_flag(case.op, f):
            out = getattr(m, case.op)(**case.kwargs())
            if not any(not np.array_equal(np.asarray(out[n]), np.asarray(ref[n])) for n in kinds):
                return False
    return True


__all__ = [
    "MUTANTS",
    "ROUND_MUTANTS",
    "ROWS",
    "AcceptEngineSeed",
    "AcceptPQSwapped",
    "AcceptPositions32",
    "AcceptRngBatchRow",
    "AcceptRngKey",
    "AcceptTailExtent",
    "AcceptVocabPadding",
    "AnchorAsMask",
    "Bf16Logits",
    "Bf16TruncationAttention",
    "Bf16TruncationFeatures",
    "BlockGqaInterleaved",
    "BlockInt32Positions",
    "BlockLiveIgnored",
    "BlockRingReadUnwrapped",
    "BlockRopeInterleaved",
    "BlockWindowNarrow",
    "BonusFromWrongRow",
    "BoundaryIndex",
    "CaptureBeforeLayer",
    "CausalDraftAttention",
    "CausalDraftLayer",
    "ChunkFirstRows",
    "CoinLeRatio",
    "ConvCol0Tap",
    "ConvDeltaPerChannel",
    "DecodeRowsSharedLength",
    "Dflash2AllColumns",
    "FiltersOnlyOnBonus",
    "Fp32Positions",
    "Fp32Positions2p32",
    "GqaInterleaved",
    "GreedyTiesLastWins",
    "HeadShortlistNoRemap",
    "HeadTiesToHighest",
    "HeadVocabPadding",
    "HistoryNotUpdated",
    "Int32Positions",
    "KBf16BeforeNorm",
    "KvRopeBf16Positions",
    "KvRopeInterleaved",
    "LastBlockFinalNorm",
    "LayerGqaInterleaved",
    "LayerInt32Positions",
    "LayerLiveIgnored",
    "LayerRingReadUnwrapped",
    "LayerRopeInterleaved",
    "LayerWindowNarrow",
    "LeftOnlyWindow",
    "LiveIgnored",
    "MaskTokenStripped",
    "MinPMissing",
    "MinPOnLogits",
    "Mutant",
    "NextTokenShift",
    "PenaltiesLastTokenOnly",
    "PenaltiesMissing",
    "PreviewCutBeforeEos",
    "ResidualNoClamp",
    "ResidualSumZeroNan",
    "RingReadUnwrapped",
    "RingSlot",
    "RingWriteNoWrap",
    "RngAdvancedP0",
    "RngPurposeShared",
    "SameDrawReused",
    "SelectorBranchesSwapped",
    "SelectorEngineSeed",
    "SelectorPositions32",
    "SelectorPredecessorRow",
    "SelectorRngBatchRow",
    "SelectorRngKey",
    "SelectorTemperatureIgnored",
    "SelectorTiesToHighest",
    "TargetTiesToHighest",
    "TargetVocabPadding",
    "TemperatureAfterFilters",
    "TopkNanFirst",
    "TopkShortlistNoRemap",
    "TopkSoftcapBeforeSelection",
    "TopkTiesToHighest",
    "TopkVocabPadding",
    "TreePositions32",
    "TreeRngBatchRow",
    "TreeRngKey",
    "TreeSiblingResidual",
    "VFp16WithoutBf16",
    "VFtz",
    "VInfTimesZero",
    "VSaturating",
    "WindowDropped",
    "WindowLeS",
    "WindowLeSBlock",
    "WindowLeSLayer",
    "WindowNarrow",
    "decisions_differ",
    "flags_of",
    "for_flag",
    "for_op",
]
