"""The Op registry: one entry per Op (docs/architecture.md: reference, inputs, outputs
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
# U q(d) = p(d) exactly: the contract's accept test is strict, so the token is rejected (C3)
ACCEPT_TIE = "the strict accept test U*q(d) < p(d) (C3: equality rejects)"

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
    # the format the values must be exact in when it is narrower than the storage format
    # (context V: stored FP16, values FP16_RNE(BF16(v)), i.e. BF16 values; CONTRACTS C1)
    values: str | None = None
    # what decides a decision whose margin is exactly 0 (named in a FAIL's message): a ranking's
    # tie rule, or for an accept test its strict comparison
    tie_rule: str = "the C4 tie rule"

    @property
    def value_fmt(self) -> str | None:
        return self.values or self.fmt

    def __post_init__(self):
        if self.cls not in CLASSES:
            raise ValueError(f"output {self.name}: class must be one of {CLASSES}, got {self.cls!r}")
        if self.cls == REPRESENTED and self.fmt not in ("bf16", "fp16", "fp32"):
            raise ValueError(f"output {self.name}: represented outputs need fmt bf16/fp16/fp32")


@dataclass(frozen=True)
class Envelope:
    """The accuracy envelope of one represented output (CONTRACTS C2 v2): ACCEPTABLE while
    |out_i - ref_i| <= k * u * s_i for every element and ||out - ref|| <= n * u * ||s||, u the
    unit roundoff of the output's value format, s from ``OpSpec.scales``. ``why`` is the
    reasoning that sets k (the number of roundings a legitimate chain may stack on one term of s)."""

    k: float
    n: float
    why: str
    # whether the bias check (BIAS_*) applies: not where a legitimate chain rounds sums of two BF16
    # values (the conv's base + delta), whose exact ties make round-to-nearest-even one-sided on
    # structured data (measured under fuzzing: -0.275 u*s for conv_coef_bf16_first)
    bias: bool = True


# Bias (C2 v2): over at least BIAS_MIN_ELEMENTS compared, finite, nonzero reference elements,
# the mean signed scaled error sign(ref) * (out - ref) / (u s), each clipped to +-2, beyond
# BIAS_LIMIT in magnitude and BIAS_Z standard errors from zero FAILs. Round-to-nearest of any
# legitimate chain is symmetric: mean 0 up to errors several elements share (a BF16 cos/sin table
# entry multiplies every head at its position). Truncation toward zero moves each element half
# a quantum on average, between u |ref| / 2 and u |ref|, so its mean is -(1/2 .. 1) |ref| / s: at
# least 0.2 wherever the output's own rounding dominates (s <= 2.5 |ref|). Measured (all 25
# legitimate variants over every vector and the fuzzed case below): |mean| <= 0.095; the
# truncating mutants: 0.39 .. 0.63. (In quanta of ref instead, shared table errors reached
# 0.43 for a legitimate eager BF16 conv and 0.30 under fuzzing: not a test of rounding direction.)
BIAS_MIN_ELEMENTS = 64
# The elements of one row (a vector along the last axis) may share an error: attention's BF16
# P weights multiply every value of a row, and a row whose rounded weights sum below 1 moves
# all its elements toward zero at once (measured under fuzzing: 4 rows of 32 gave a mean of
# -0.216 for a legitimate HF eager engine). Rows are the independent samples: the standard
# error is that of the row means, over at least BIAS_MIN_ROWS rows, and BIAS_Z is set for a
# t statistic with 15 degrees of freedom (P(|t| > 6) ~ 2e-5 per output for a legitimate engine).
BIAS_MIN_ROWS = 16
# Only for outputs narrower than FP32: there an element's error is its own rounding (FP32 work
# below is far inside one quantum), so signs are independent. FP32 outputs here are normalized
# rows (softmax) whose errors share one factor per row (the sum), which no mean can test.
BIAS_FORMATS = ("bf16", "fp16")
# Flushing FP32/BF16 subnormals to zero is legitimate (CuPy compiles every kernel with -ftz=true,
# as --use_fast_math does): every envelope admits an absolute error of the smallest normal, 2^-126.
# FP16 subnormals (context V, C1) are far above it and stay checked.
FTZ_FLOOR = 2.0**-126
# The envelopes the Ops share; an Op with another chain writes its own.
BF16_CHAIN = Envelope(8, 4, "s sums one rounding per term, but a legitimate chain may round three times where the "
                      "reference's term stands (the kernel's FP32 result, a BF16 store between kernels, the next "
                      "kernel's BF16 operand): 3, doubled for second-order terms and ties of rounding, rounded up "
                      "to 8; normwise, independent roundings add in quadrature: half of it")
BF16_CONV_CHAIN = Envelope(BF16_CHAIN.k, BF16_CHAIN.n, BF16_CHAIN.why + "; no bias check: the conv's (base + delta) "
                           "is a sum of two BF16 values, an exact tie half the time, and ties to even lean one "
                           "way on structured inputs", bias=False)
FP32_OUTPUT = Envelope(8, 4, "s counts each FP32 operation once (a long dot product's term once per rounding it "
                       "passes through: reference.scales.accumulation_weights, the tensor-core tile chain plus "
                       "the split-K tree; another sum log2(n) times; exp's argument by its "
                       "magnitude, which covers fast-math __expf's 2 + 1.17|x| ulp); a libm within 2 ulp doubles "
                       "a term: 2, times 2 for the order of the sum and 2 to spare")
BIAS_LIMIT = 0.2
BIAS_Z = 6.0
BIAS_CLIP = 2.0


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
    # C2 v2: per represented output its Envelope; ``scales(kwargs, ref_outputs)`` gives s per
    # represented output (and ``<decision>.scale``, the magnitude of a decision's competing
    # scores, in FP32 units, whose ambiguity band is ``decision_k`` * 2^-24 * scale).
    envelope: Mapping[str, Envelope] = field(default_factory=dict)
    scales: Callable[..., Mapping[str, np.ndarray]] | None = None
    decision_k: float = 0.0
    # Represented intermediates an implementation hands on inside the Op (the conv's finish
    # delta, the selector's g): ``follow(kwargs, impl)`` recomputes the reference from the
    # implementation's values of them, so that downstream outputs are judged on their own chain.
    follow: Callable[..., Mapping[str, np.ndarray]] | None = None
    followed: tuple[str, ...] = ()
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
