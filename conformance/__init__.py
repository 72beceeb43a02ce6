"""Conformance harness: Op registry, case generators, golden vectors, comparison,
runner, reports, CLI and pytest plugin. Imports ``reference``; never the reverse."""

CONTRACT_VERSION = "v3"
GENERATOR_VERSION = "2"
