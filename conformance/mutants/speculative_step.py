"""Step-only mutants of speculative_step: bugs of the whole step (draft, verify, commit) that no
single Op receives. Each is the float32 baseline whose ``speculative_step`` runs the step with one
planted bug (reference.speculative_step.run's ``bug`` switches); ``control()`` turns it off.
"""

from __future__ import annotations

from conformance import registry
from conformance.baseline import storage_outputs
from conformance.mutants.proposal_round import RoundMutant
from reference import precision
from reference import speculative_step as ss


class StepMutant(RoundMutant):
    """A float32 baseline whose ``speculative_step`` runs the step with one planted bug
    (reference.speculative_step.run's ``bug`` switches)."""

    op = "speculative_step"

    def speculative_step(self, **kw):
        spec = registry.get(self.op)
        with precision.baseline(spec.bf16_intermediates):
            return storage_outputs(spec, ss.run(ss.ReferenceOps, bug=self.bug, **kw))


class FirstDraftUnverified(StepMutant):
    """d_1 committed without its accept test; verification starts at d_2 (lattice #243)."""

    pitfall, BUG = "first_draft_unverified", {"commit_first_unverified": True}
    family = "first_draft_unverified"


class RngZeroProposal(StepMutant):
    """A request with P = 0 draws its target sample one position late, as if a proposal's draw had
    advanced its generator (vllm-ascend #13608)."""

    pitfall, BUG = "rng_zero_proposal", {"rng_zero_proposal_offset": True}
    family = "rng"
