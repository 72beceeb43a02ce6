"""Issue 9, outputs: torch tensors, DLPack and array-interface objects, bfloat16 by bit
pattern, and the storage format of represented outputs (a value the format cannot hold
is a FAIL naming the output and the element)."""

from __future__ import annotations

import ctypes
import sys

import ml_dtypes
import numpy as np
import pytest

from conformance import runner
from conformance.compare import Result
from conformance.registry import REPRESENTED, Output
from conformance.runner import run_suite
from conformance.vectors import Vector
from tests.conftest import TOYS, ToyImpl

BF16 = np.dtype(ml_dtypes.bfloat16)


def _results(impl, vectors, pattern="toy/basic"):
    return {r.case: r for r in run_suite(impl, vectors, pattern, timeout=10, specs=TOYS)}


class Wrapped(ToyImpl):
    """The toy implementation with its ``y`` output wrapped by ``wrap``."""

    def __init__(self, wrap):
        super().__init__("float32")
        self.wrap = wrap

    def toy(self, **kw):
        out = ToyImpl.toy(self, **kw)
        out["y"] = self.wrap(out["y"])
        return out


class DLPackOnly:
    """Readable only through __dlpack__ (no __array__)."""

    def __init__(self, arr, device=(1, 0), code=None):
        self.arr, self.device, self.code = np.ascontiguousarray(arr), device, code

    def __dlpack__(self, stream=None, **kw):
        cap = self.arr.__dlpack__()
        if self.code is not None:  # relabel the tensor's dtype (e.g. uint16 bits as DLPack bfloat16)
            api = ctypes.pythonapi
            api.PyCapsule_GetPointer.restype = ctypes.c_void_p
            api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
            managed = runner._DLManagedTensor.from_address(api.PyCapsule_GetPointer(cap, b"dltensor"))
            managed.dl_tensor.dtype.code = self.code
        return cap

    def __dlpack_device__(self):
        return self.device


def test_bfloat16_through_dlpack_is_read_by_its_bit_pattern(toy_vectors):
    # NumPy's DLPack reader refuses bfloat16 ("Unsupported dtype"); the harness reads the capsule itself
    res = _results(Wrapped(lambda y: DLPackOnly(y.view(np.uint16), code=4)), toy_vectors)
    assert res["toy/basic"].result == Result.PASS, res["toy/basic"].detail
    bits = np.arange(12, dtype=np.uint16).reshape(3, 4) * 1000
    got = runner.to_numpy(DLPackOnly(bits[:, ::2], code=4))  # strided views are copied element by element
    assert got.dtype == BF16 and (got.view(np.uint16) == bits[:, ::2]).all()


def test_float_dlpack_objects_are_read_through_numpy(toy_vectors):
    res = _results(Wrapped(lambda y: DLPackOnly(y.astype(np.float32))), toy_vectors)
    assert res["toy/basic"].result == Result.PASS, res["toy/basic"].detail


def test_a_device_dlpack_object_without_cupy_says_what_is_missing(toy_vectors, monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)
    res = _results(Wrapped(lambda y: DLPackOnly(y.astype(np.float32), device=(2, 0))), toy_vectors)
    r = res["toy/basic"]
    assert r.result == Result.ERROR
    assert r.detail.startswith("y: a DLPackOnly on DLPack device (2, 0): reading device memory needs CuPy")


def test_a_cuda_array_interface_object_without_cupy_says_what_is_missing(toy_vectors, monkeypatch):
    class Dev:
        __cuda_array_interface__ = {"shape": (3, 4), "typestr": "<f4", "data": (0, False), "version": 3}

    monkeypatch.setitem(sys.modules, "cupy", None)
    r = _results(Wrapped(lambda y: Dev()), toy_vectors)["toy/basic"]
    assert r.result == Result.ERROR and "__cuda_array_interface__: reading device memory needs CuPy" in r.detail


def test_ml_dtypes_and_uint16_bf16_are_accepted(toy_vectors):
    assert _results(Wrapped(lambda y: y.astype(BF16)), toy_vectors)["toy/basic"].result == Result.PASS
    assert _results(Wrapped(lambda y: y.view(np.uint16)), toy_vectors)["toy/basic"].result == Result.PASS


def test_float64_holding_bf16_values_passes_and_one_that_does_not_fails(toy_vectors):
    assert _results(Wrapped(lambda y: y.astype(np.float64)), toy_vectors)["toy/basic"].result == Result.PASS

    def unrounded(y):
        x = y.astype(np.float64)
        x[1, 2] += x[1, 2] * 2.0**-12  # between two BF16 values
        return x

    r = _results(Wrapped(unrounded), toy_vectors)["toy/basic"]
    assert r.result == Result.FAIL
    assert r.detail.startswith("y: 1 element(s) are not BF16 values (its storage format); first at [1, 2]: ")
    assert "returned as float64" in r.detail


def test_unspecified_masked_elements_are_not_checked(toy_vectors):
    def garbage_in_mask(y):
        x = y.astype(np.float64)
        x[2] = 0.1  # row 2 of toy/masked is not compared
        return x

    assert _results(Wrapped(garbage_in_mask), toy_vectors, "toy/masked")["toy/masked"].result == Result.PASS


def _vec(o: Output, ref) -> Vector:
    return Vector("op", "op/c", {}, [], {o.name: o}, {o.name: {}}, {}, {o.name: np.asarray(ref)}, {})


@pytest.mark.parametrize(("fmt", "value", "ok"), [
    ("fp16", 1 + 2.0**-10, True), ("fp16", 1 + 2.0**-11, False), ("fp16", 70000.0, False), ("fp16", np.inf, True),
    ("fp16", 2.0**-24, True), ("fp32", 1 + 2.0**-23, True), ("fp32", 1 + 2.0**-24, False), ("bf16", np.nan, True),
    ("bf16", -(1 + 2.0**-7), True), ("bf16", 1 + 2.0**-8, False),
])
def test_the_storage_format_is_enforced(fmt, value, ok):
    o = Output("y", REPRESENTED, fmt)
    _, fail = runner.check_outputs(_vec(o, [0.0, 0.0]), {"y": np.array([0.0, value])}, ["y"])
    assert (fail is None) == ok, fail
    if not ok:
        assert fail.startswith(f"y: 1 element(s) are not {fmt.upper()} values (its storage format); first at [1]")


def test_values_narrower_than_storage_are_enforced():
    """Context V: stored FP16, values FP16_RNE(BF16(v)): a float16 array must hold BF16 values."""
    o = Output("v_cache", REPRESENTED, "fp16", "bf16")
    assert runner.value_formats(o) == ("fp16", "bf16")
    ok = np.array([1.0, 1 + 2.0**-7], np.float16)
    assert runner.check_outputs(_vec(o, [0.0, 0.0]), {"v_cache": ok}, ["v_cache"])[1] is None
    bad = np.array([1.0, 1 + 2.0**-10], np.float16)  # an FP16 value, not a BF16 one
    fail = runner.check_outputs(_vec(o, [0.0, 0.0]), {"v_cache": bad}, ["v_cache"])[1]
    assert fail.startswith("v_cache: 1 element(s) are not BF16 values (the format its values follow); first at [1]")


def test_object_arrays_and_unreadable_outputs_are_errors(toy_vectors):
    class Unreadable:
        def __array__(self, *a, **k):
            raise RuntimeError("device lost\nmore")

    r = _results(Wrapped(lambda y: np.array([object()] * 12).reshape(3, 4)), toy_vectors)["toy/basic"]
    assert r.result == Result.ERROR and "dtype object" in r.detail
    r = _results(Wrapped(lambda y: Unreadable()), toy_vectors)["toy/basic"]
    assert r.result == Result.ERROR and r.detail == "y: cannot read a Unreadable as an array (RuntimeError: device " \
                                                    "lost [...])"


# --- torch (skipped without it; CI has none) ---------------------------------------------

def test_torch_tensors_of_every_dtype_are_read(toy_vectors):
    torch = pytest.importorskip("torch", reason="torch is not installed: the torch output paths are not exercised")
    y = np.arange(12, dtype=np.float32).reshape(3, 4) / 8
    for dt, want in ((torch.bfloat16, BF16), (torch.float16, np.float16), (torch.float32, np.float32),
                     (torch.float64, np.float64), (torch.int32, np.int32), (torch.uint8, np.uint8),
                     (torch.bool, np.bool_), (torch.float8_e4m3fn, np.dtype(ml_dtypes.float8_e4m3fn))):
        t = torch.from_numpy(y).to(dt)
        got = runner.to_numpy(t)
        assert got.dtype == want and got.shape == (3, 4)
        assert np.array_equal(got.astype(np.float64), t.to(torch.float64).numpy())
    if hasattr(torch, "uint16"):
        assert runner.to_numpy(torch.tensor([65535], dtype=torch.int32).to(torch.uint16)).tolist() == [65535]
    assert runner.to_numpy(torch.ones(2, 3).t()).shape == (3, 2)  # non-contiguous
    res = _results(Wrapped(lambda y: torch.from_numpy(y.astype(np.float32)).to(torch.bfloat16)), toy_vectors)
    assert res["toy/basic"].result == Result.PASS, res["toy/basic"].detail
