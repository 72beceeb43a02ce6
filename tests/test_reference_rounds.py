"""reference.rounds declares the round-level Ops' outputs without the harness: they must be the
registry's declarations, and the composition must keep exactly them."""

from conformance import registry
from reference import rounds


def test_declared_outputs_are_the_registrys():
    for op in ("proposal_round", "speculative_step"):
        assert rounds.OUTPUTS[op] == tuple(o.name for o in registry.get(op).outputs), op


def test_declared_keeps_only_the_declared_outputs():
    out = {name: i for i, name in enumerate(rounds.OUTPUTS["proposal_round"])}
    out["margins"] = "extra"
    assert rounds.declared("proposal_round", out) == {n: out[n] for n in rounds.OUTPUTS["proposal_round"]}


def test_harness_reexports_the_reference_composition():
    from conformance import rounds as harness_rounds

    assert harness_rounds.ComposedRounds is rounds.ComposedRounds
    assert harness_rounds.composed is rounds.composed
