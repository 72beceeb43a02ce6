"""Round-only mutants of proposal_round: bugs that no Op-level implementation can carry, because no
single Op receives what they confuse. Each is the float32 baseline whose ``proposal_round`` runs the
round with one planted bug (reference.proposal_round.run's ``bug`` switches); ``control()`` is the
same code with the bug off, which must conform. The case ids that catch each one carry its pitfall.
"""

from __future__ import annotations

from typing import ClassVar

from conformance import registry
from conformance.baseline import Float32Baseline, storage_outputs
from reference import precision
from reference import proposal_round as pr


class RoundMutant(Float32Baseline):
    op = "proposal_round"
    pitfall = ""
    variant = ""
    family = ""  # as Mutant.family
    BUG: ClassVar[dict] = {}
    expect = "fail"

    def __init__(self, bug: dict | None = None):
        super().__init__()
        self.bug = dict(self.BUG) if bug is None else bug

    def control(self) -> RoundMutant:
        return type(self)(bug={})

    @property
    def key(self) -> str:
        return f"{self.pitfall}-{self.variant}" if self.variant else self.pitfall

    @property
    def name(self) -> str:
        return f"round mutant {self.key} ({self.op})"

    def proposal_round(self, **kw):
        spec = registry.get("proposal_round")  # a step mutant's bug switches are not the round's: none bite here
        with precision.baseline(spec.bf16_intermediates):
            return storage_outputs(spec, pr.run(pr.ReferenceOps, bug=self.bug, **kw))


class ContextRoleWeights(RoundMutant):
    """Context K/V projected with the draft block's own k_proj / v_proj, not the context role's."""

    pitfall, BUG = "context_role_weights", {"context_role": True}
    family = "context_role_weights"


class LayerIdOrigin(RoundMutant):
    """target_layer_ids counted from the embedding boundary: block l + 1 read for id l."""

    pitfall, BUG = "layer_id_origin", {"layer_shift": 1}
    family = "capture"


class CaptureBeforeLayer(RoundMutant):
    """The capture hook at the layer's input: block l - 1's output read for block l."""

    pitfall, BUG = "capture_before_layer", {"layer_shift": -1}
    family = "capture"


class DraftTemperatureIgnored(RoundMutant):
    """The DFlash2 selector walks greedily whatever the request's temperature."""

    pitfall, BUG = "draft_temperature", {"ignore_temperature": True}
    family = "filters"
