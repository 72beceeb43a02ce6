"""The Op registry: one entry per Op (ARCHITECTURE: reference, inputs, outputs
with their comparison class, case generator).

Each ``conformance/cases/<op>.py`` module calls ``register(OpSpec(...))`` at
import; ``ops()`` imports every module of that package, so adding an Op touches
no list here.
"""

from __future__ import annotations

import hashlib
import importlib
import pkgutil
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

EXACT = "exact"
REPRESENTED = "represented"
DECISION = "decision"
CLASSES = (EXACT, REPRESENTED, DECISION)

_CASE_ID = re.compile(r"^[a-z0-9_]+/[A-Za-z0-9_.+-]+$")


@dataclass(frozen=True)
class Output:
    """One output of an Op and its comparison class (CONTRACTS C2).

    represented: ``fmt`` is the storage format ("bf16", "fp16", "fp32").
    decision: the reference also returns ``"<name>.margin"`` (same shape; winner
    minus runner-up in score units, inf where no contest) and may return
    ``"<name>.scale"`` (magnitude of the competing scores, for the one-ulp floor).
    exact: integers, compared for equality.
    """

    name: str
    cls: str
    fmt: str | None = None

    def __post_init__(self):
        if self.cls not in CLASSES:
            raise ValueError(f"output {self.name}: class must be one of {CLASSES}, got {self.cls!r}")
        if self.cls == REPRESENTED and self.fmt not in ("bf16", "fp16", "fp32"):
            raise ValueError(f"output {self.name}: represented outputs need fmt bf16/fp16/fp32")


@dataclass(frozen=True)
class Case:
    """One golden case: tensors in their storage dtypes, scalar params, pitfall flags.

    ``masks`` optionally names, per output, the elements that are compared
    (e.g. live columns only); everything else in that output is unspecified.
    """

    id: str
    inputs: Mapping[str, np.ndarray]
    params: Mapping[str, Any] = field(default_factory=dict)
    flags: tuple[str, ...] = ()
    masks: Mapping[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self):
        if not _CASE_ID.match(self.id):
            raise ValueError(f"case id {self.id!r} must look like 'op/what_it_sweeps'")

    @property
    def op(self) -> str:
        return self.id.split("/", 1)[0]

    def kwargs(self) -> dict[str, Any]:
        return {**self.inputs, **self.params}


@dataclass(frozen=True)
class OpSpec:
    name: str
    reference: Callable[..., Mapping[str, np.ndarray]]
    inputs: tuple[str, ...]
    outputs: tuple[Output, ...]
    generate: Callable[[], Iterable[Case]]
    params: tuple[str, ...] = ()
    bf16_intermediates: frozenset = frozenset()
    # Teacher forcing (C2): given a case's kwargs and the implementation's
    # outputs, recompute the reference following the implementation's choice at
    # its first acceptable divergence. None: elements after such a divergence
    # (in the same row) are not compared.
    force: Callable[..., Mapping[str, np.ndarray]] | None = None
    # Outputs that no decision influences (e.g. a tree's shape built before verification):
    # never hidden downstream of a divergence when the Op has no force.
    independent: tuple[str, ...] = ()
    doc: str = ""

    def output(self, name: str) -> Output:
        for o in self.outputs:
            if o.name == name:
                return o
        raise KeyError(f"{self.name} has no output {name!r}")


_REGISTRY: dict[str, OpSpec] = {}


def register(spec: OpSpec) -> OpSpec:
    if spec.name in _REGISTRY and _REGISTRY[spec.name] is not spec:
        raise ValueError(f"Op {spec.name!r} registered twice")
    _REGISTRY[spec.name] = spec
    return spec


def ops() -> dict[str, OpSpec]:
    """All registered Ops, by name (imports every case module once)."""
    from conformance import cases

    for mod in pkgutil.iter_modules(cases.__path__):
        if not mod.name.startswith("_"):
            importlib.import_module(f"{cases.__name__}.{mod.name}")
    return dict(sorted(_REGISTRY.items()))


def get(name: str) -> OpSpec:
    all_ops = ops()
    if name not in all_ops:
        raise KeyError(f"unknown Op {name!r}; known: {', '.join(all_ops)}")
    return all_ops[name]


def case_rng(case_id: str) -> np.random.Generator:
    """A generator seeded from the case id alone: cases are independent and
    regenerating one gives identical bytes whatever else is generated."""
    digest = hashlib.sha256(case_id.encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))
