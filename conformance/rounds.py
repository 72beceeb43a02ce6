"""The round-level Ops composed from an implementation's own Op methods: reference/rounds.py
(re-exported here for the harness's users; implementations import it from the reference)."""

from __future__ import annotations

from reference.rounds import OUTPUTS, RUNS, ComposedRounds, composed, declared

__all__ = ["OUTPUTS", "RUNS", "ComposedRounds", "composed", "declared"]
