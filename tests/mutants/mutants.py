"""The mutant catalog lives in the package (``conformance.catalog``) so that the runner's
``diagnose`` can use it without tests/; this module re-exports it for the tests and tools that
import ``from tests.mutants.mutants import MUTANTS``."""

from conformance.catalog import *
from conformance.catalog import MUTANTS, Mutant  # noqa: F401
