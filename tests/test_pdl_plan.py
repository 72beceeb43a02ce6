"""kernels_cu/pdl.py without a GPU: the launch structures match cuda.h's layout, kernel arguments keep
their widths, and a launch that may not use PDL is the ordinary CuPy call (tests/gpu/test_pdl.py runs
the real one)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from kernels_cu import pdl


def test_structures_match_cuda_h():
    # CUlaunchAttribute: a 4-byte id, 4 bytes of pad, a 64-byte union; CUlaunchConfig: 7 uints, the
    # stream at 32, attrs at 40, numAttrs at 48 (cuda.h, CUDA 12 and 13)
    assert ctypes.sizeof(pdl._Attr) == 72 and pdl._Attr.value.offset == 8
    assert ctypes.sizeof(pdl._Config) == 56
    assert (pdl._Config.hStream.offset, pdl._Config.attrs.offset, pdl._Config.numAttrs.offset) == (32, 40, 48)


def test_config_fields():
    cfg, attrs = pdl.config((4, 2), 128, 4096, 0xABC0, True)
    assert (cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ, cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ) == (4, 2, 1, 128, 1, 1)
    assert cfg.sharedMemBytes == 4096 and cfg.hStream == 0xABC0 and cfg.numAttrs == 1
    raw = ctypes.string_at(ctypes.addressof(attrs[0]), 16)  # id 6 (..._STREAM_SERIALIZATION), value 1 at 8
    assert raw == (6).to_bytes(4, "little") + bytes(4) + (1).to_bytes(4, "little") + bytes(4)
    assert pdl.config(7, (32, 4), 0, 0, False)[0].numAttrs == 0
    with pytest.raises(ValueError, match="4 dimensions"):
        pdl.config((1, 1, 1, 1), 1, 0, 0, True)


def test_kernel_arguments_keep_their_widths():
    cases = {np.int32(-3): (ctypes.c_int32, -3), np.int64(2**40): (ctypes.c_int64, 2**40),
             np.uint64(2**63): (ctypes.c_uint64, 2**63), np.float32(1.5): (ctypes.c_float, 1.5),
             np.float64(0.25): (ctypes.c_double, 0.25), np.uint32(7): (ctypes.c_uint32, 7)}
    for a, (kind, value) in cases.items():
        got = pdl.kernel_arg(a)
        assert type(got) is kind and got.value == value

    class FakeDeviceArray:  # what CuPy's ndarray offers: .data.ptr and .device
        device = 0

        class data:
            ptr = 0x7F0000001000

    assert pdl.kernel_arg(FakeDeviceArray()).value == 0x7F0000001000
    for bad in (3, 1.0, np.zeros(3)):  # no width / a host array: refused, never guessed
        with pytest.raises(TypeError, match="pdl.launch"):
            pdl.kernel_arg(bad)


def test_without_pdl_the_launch_is_the_ordinary_call(monkeypatch):
    calls = []

    def fn(grid, block, args, shared_mem=0):
        calls.append((grid, block, args, shared_mem))

    monkeypatch.setattr(pdl, "ENABLED", False)
    assert not pdl.active()
    pdl.launch(fn, (2,), (64,), [np.int32(1)], 128)
    monkeypatch.setattr(pdl, "ENABLED", True)
    pdl.launch(fn, (3,), (32,), (np.int32(2),), pdl=False)
    assert calls == [((2,), (64,), (np.int32(1),), 128), ((3,), (32,), (np.int32(2),), 0)]


def test_graph_edges_relaxed_are_the_programmatic_ones_only():
    assert ctypes.sizeof(pdl._EdgeData) == 8  # cuda.h CUgraphEdgeData: three bytes and five reserved
    edges = [(0, 0, 0),  # an ordinary edge (full completion): kept
             (1, 0, 1),  # programmatic port, programmatic type (a PDL launch as captured): relaxed
             (2, 0, 1),  # already launch order: kept
             (0, 0, 1)]  # programmatic type from the completion port: kept
    assert pdl.relax_edges(edges, [True] * 4) == [1]
    assert pdl.relax_edges(edges, [True, False, True, True]) == []  # a downstream kernel not launched by us
    assert pdl.relax_edges([], []) == []
