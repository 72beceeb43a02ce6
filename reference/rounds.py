"""The round-level Ops (CONTRACTS C10) composed from an implementation's own Op methods.

``composed(op, ops, **kw)`` runs ``proposal_round`` or ``speculative_step`` the reference's way
(reference.proposal_round.run, reference.speculative_step.run) over any object with the Op methods
and keeps the Op's declared outputs (``OUTPUTS``). ``ComposedRounds`` gives an implementation both
methods from its per-Op methods; ``_round_ops`` (the object whose Op methods are composed) and
``_round_inputs`` (the arguments as the composition should see them) are its two hooks.

It lives beside the reference (not in the harness) so that an implementation, the CUDA kernels
included, can compose its rounds without importing the harness.
"""

from __future__ import annotations

from collections.abc import Mapping

from reference import proposal_round as pr
from reference import speculative_step as ss

RUNS = {"proposal_round": pr.run, "speculative_step": ss.run}

# The declared outputs of each round-level Op, in the registry's order (a CPU test checks them against
# conformance.registry's declarations).
OUTPUTS: dict[str, tuple[str, ...]] = {
    "proposal_round": ("tokens", "q", "q_ids", "k_cache", "v_cache"),
    "speculative_step": tuple(ss.OUTPUTS),
}


def declared(op: str, out: Mapping) -> dict:
    """The Op's declared outputs of a composition's result (margins and extras dropped)."""
    return {name: out[name] for name in OUTPUTS[op]}


def composed(op: str, ops, **kw) -> dict:
    return declared(op, RUNS[op](ops, **kw))


class ComposedRounds:
    """proposal_round and speculative_step from the object's own Op methods (the step's target
    verify is the case's toy target, standing in for the engine's target model)."""

    def _round_ops(self):
        return self

    def _round_inputs(self, kw: dict) -> dict:
        return kw

    def proposal_round(self, **kw):
        return composed("proposal_round", self._round_ops(), **self._round_inputs(kw))

    def speculative_step(self, **kw):
        return composed("speculative_step", self._round_ops(), **self._round_inputs(kw))
