"""The reference's array backend switch (reference.backend), without a GPU.

A stand-in device module (``fake``) wraps NumPy the way CuPy behaves where it matters: its arrays
are a type of their own, and a host (NumPy) array handed to one of its functions, or one of its
arrays handed to a NumPy function, raises (CuPy refuses both). Running every portable Op of the
committed vectors through it proves that the portable reference does all its array math through
``xp`` and meets no host array on the way; since the stand-in computes with NumPy, the whole case
(reference, float32 baseline, magnitudes, bounds) must come out byte-identical to the committed
vector. tests/gpu/test_reference_backend.py runs the same Ops on CuPy itself.
"""

from __future__ import annotations

import types
from fractions import Fraction
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from conformance import generate, registry, vectors
from reference import backend, numerics

ROOT = Path(__file__).resolve().parents[1]
VECTORS = ROOT / "vectors"


class Dev(np.ndarray):
    """An array of the stand-in device."""

    __cuda_array_interface__ = property(lambda self: {})

    def get(self):
        return np.asarray(self).view(np.ndarray).copy()

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        host = [x for x in inputs if type(x) is np.ndarray and x.ndim > 0]
        if host:
            raise TypeError(f"host array {host[0].shape} in device ufunc {ufunc.__name__}")
        plain = [x.view(np.ndarray) if isinstance(x, Dev) else x for x in inputs]
        if "out" in kwargs:
            kwargs["out"] = tuple(o.view(np.ndarray) for o in kwargs["out"])
        return _dev(getattr(ufunc, method)(*plain, **kwargs))

    def __array_function__(self, func, types_, args, kwargs):
        raise TypeError(f"numpy.{func.__name__} called on a device array")


def _dev(x):
    if isinstance(x, tuple):
        return tuple(_dev(v) for v in x)
    return x.view(Dev) if type(x) is np.ndarray else x


def _check_no_host(args):
    for a in args:
        if isinstance(a, list | tuple):
            _check_no_host(a)
        elif type(a) is np.ndarray and a.ndim > 0:
            raise TypeError(f"host array {a.shape} passed to a device function")


def _plain(args):
    if isinstance(args, list | tuple):
        return type(args)(_plain(a) for a in args)
    return args.view(np.ndarray) if isinstance(args, Dev) else args


def _wrap(name, fn):
    def device_fn(*args, **kwargs):
        if name not in ("asarray", "array"):  # CuPy copies host arrays in only through these
            _check_no_host(args)
            _check_no_host(list(kwargs.values()))
        return _dev(fn(*_plain(args), **{k: _plain(v) for k, v in kwargs.items()}))

    return device_fn


class _Fake(types.ModuleType):
    ndarray = Dev

    def __getattr__(self, name):
        attr = getattr(np, name)
        if isinstance(attr, type) or not callable(attr):
            return attr
        return _wrap(name, attr)


fake = _Fake("fake")


def _portable_cases():
    specs = registry.ops()
    manifest = vectors.read_manifest(VECTORS)
    for op in sorted({e["op"] for e in manifest["files"]}):
        spec = specs[op]
        if not getattr(spec.reference, "array_portable", False):
            continue
        cases = {c.id: c for c in generate.cases_of(spec)}
        for e in manifest["files"]:
            if e["op"] == op:
                yield spec, cases[e["case"]], VECTORS / e["path"]


PORTABLE = list(_portable_cases())


def test_the_geometry_path_ops_are_portable():
    """The Ops the full-geometry run spends its time in run on the selected backend (the selector's
    walk stays on NumPy: a loop over vectors of 16, launch-bound on a GPU)."""
    specs = registry.ops()
    for op in ("masked_block", "context_kv", "proposal_head", "candidate_topk"):
        assert getattr(specs[op].reference, "array_portable", False), op
        assert getattr(specs[op].scales, "array_portable", False), op
    assert {spec.name for spec, _, _ in PORTABLE} >= {"masked_block", "context_kv", "proposal_head",
                                                       "candidate_topk", "draft_layer", "draft_attention"}


@pytest.mark.parametrize("spec,case,path", PORTABLE, ids=[c.id for _, c, _ in PORTABLE])
def test_portable_case_on_a_device_stand_in_is_the_committed_vector(spec, case, path):
    with backend.use(fake):
        data = generate.case_bytes(spec, case)
    assert data == path.read_bytes()


def test_the_stand_in_catches_a_host_array():
    """The check above can fail: a NumPy array meeting a device one raises, as on CuPy."""
    with backend.use(fake), backend._active(fake):
        with pytest.raises(TypeError):
            backend.xp.where(np.array([True]), backend.xp.zeros(1), 1.0)
        with pytest.raises(TypeError):
            np.concatenate([backend.xp.zeros(1), backend.xp.zeros(1)])


def test_reuse_inputs_moves_an_input_once_and_hands_out_copies():
    """Inside reuse_inputs the same host array goes to the device once; every call gets its own copy,
    so a call writing into its input changes nothing the next call sees. Outside, every call moves it."""
    moves = []

    class Counting(_Fake):
        def __getattr__(self, name):
            fn = super().__getattr__(name)
            if name == "asarray":
                def counted(*a, **k):
                    moves.append(name)
                    return fn(*a, **k)
                return counted
            return fn

    dev = Counting("counting")

    @backend.portable
    def scribble(x):
        y = x * 1.0
        x[...] = -1.0  # a reference that wrote into its input
        return {"y": y}

    x = np.arange(4.0)
    with backend.use(dev), backend.reuse_inputs():
        first = backend.call(scribble, x)["y"]
        second = backend.call(scribble, x)["y"]
    assert len(moves) == 1
    np.testing.assert_array_equal(first, np.arange(4.0))
    np.testing.assert_array_equal(second, np.arange(4.0))  # the first call's write did not reach it
    np.testing.assert_array_equal(x, np.arange(4.0))  # nor the host array
    with backend.use(dev):
        backend.call(scribble, x)
        backend.call(scribble, x)
    assert len(moves) == 3


def test_reference_inputs_are_read_only_views():
    """generate.fresh_kwargs hands the reference read-only views of the case's arrays (no copy of a
    full-width case's weights per call): a reference writing into one raises instead of changing the
    case; params stay independent copies."""
    spec = registry.ops()["context_kv"]
    case = next(iter(generate.cases_of(spec)))
    kw = generate.fresh_kwargs(case)
    arrays = [k for k, v in kw.items() if isinstance(v, np.ndarray)]
    assert arrays
    for k in arrays:
        assert not kw[k].flags.writeable and np.shares_memory(kw[k], case.inputs[k])
        with pytest.raises(ValueError):
            kw[k].flat[0] = 0


def test_outside_call_xp_is_numpy_and_results_come_back_as_numpy():
    with backend.use(fake):
        assert backend.module() is np  # the harness around call never meets a device array
        out = backend.call(backend.portable(lambda x: {"y": backend.xp.asarray(x) * 2}), np.arange(3.0))
    assert type(out["y"]) is np.ndarray and out["y"].tolist() == [0.0, 2.0, 4.0]


def test_an_unknown_backend_is_one_line():
    with pytest.raises(backend.BackendError, match="numpy, cupy"):
        backend.load("torch")


# --- storage rounding: the same on any array module ------------------------------------------------


def _float32_probe() -> np.ndarray:
    """float32 values where rounding to BF16/FP16 is delicate: exact ties (even and odd), one ulp
    either side, subnormals of both targets and of float32, overflow edges, inf, nan, signed zeros."""
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32)
    ties = []
    for keep in (16, 13):  # bits below a BF16 / FP16 (normal) significand
        base = rng.integers(0, 2**32, 20_000, dtype=np.uint64).astype(np.uint32) & ~np.uint32(2**keep - 1)
        half = np.uint32(2 ** (keep - 1))
        ties += [base | half, (base | half) + np.uint32(1), (base | half) - np.uint32(1)]
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, 65519.99, 65520.0, 65536.0, 2.0**-24,
                         2.0**-25, 3 * 2.0**-26, 2.0**-14, 2.0**-126, 2.0**-149, 2.0**-133, 3.3895314e38,
                         3.4028235e38, -3.4028235e38, 1 + 2.0**-8, 1 + 3 * 2.0**-8, 1 + 2.0**-11], np.float32)
    x = np.concatenate([bits.view(np.float32), *(t.view(np.float32) for t in ties), specials])
    return x


@pytest.mark.parametrize("fmt", ["bf16", "fp16"])
def test_round_to_matches_ml_dtypes_on_float32_values(fmt):
    """From float32, ml_dtypes / NumPy cast once (RNE, subnormals kept, overflow to inf): the
    reference's rounding of the same values must agree bit for bit, NaN as NaN."""
    x = _float32_probe()
    dtype = ml_dtypes.bfloat16 if fmt == "bf16" else np.float16
    with np.errstate(over="ignore", invalid="ignore"):  # the casts of inf and NaN themselves
        want = x.astype(dtype).astype(np.float64)
        got = numerics.round_to(x.astype(np.float64), fmt)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    fin = ~np.isnan(want)
    assert np.array_equal(got[fin], want[fin])
    assert np.array_equal(np.signbit(got[fin]), np.signbit(want[fin]))


def test_round_to_rounds_float64_once():
    """From float64 the reference rounds once; ml_dtypes goes through float32 and may round twice.
    Checked against exact rational rounding (half to even) on values just above a BF16 tie."""
    def exact_bf16(v: float) -> float:
        f = Fraction(v)
        q = Fraction(2) ** (int(np.frexp(v)[1]) - 8)  # BF16 spacing in v's binade (normal range)
        n = f / q
        lo = n.numerator // n.denominator
        r = n - lo
        up = r > Fraction(1, 2) or (r == Fraction(1, 2) and lo % 2 == 1)
        return float((lo + up) * q)

    vals = [1 + 2.0**-8 + 2.0**-40, 1 + 2.0**-8 - 2.0**-40, 1 + 3 * 2.0**-8 + 2.0**-30, 3.0 + 2.0**-7 + 2.0**-45,
            -(1 + 2.0**-8 + 2.0**-40), 1 + 2.0**-8]
    got = numerics.round_to(np.array(vals), "bf16")
    assert got.tolist() == [exact_bf16(v) for v in vals]
    assert got[0] == 1.0078125  # where float32 first would give 1.0
