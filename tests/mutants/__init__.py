"""Mutation testing of the conformance suite: implementations with one planted bug each."""
