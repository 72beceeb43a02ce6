"""FastOptions: the fast mode's tunables as one frozen object that the backend, the round and their engines read."""

from __future__ import annotations

import dataclasses

import pytest

from kernels_cu.fast import DEFAULT_OPTIONS, FastCudaBackend, FastOptions
from kernels_cu.fast.block import CudaEngine
from kernels_cu.fast.round import FastRound


def test_default_is_frozen_and_documented():
    assert DEFAULT_OPTIONS == FastOptions()
    with pytest.raises(dataclasses.FrozenInstanceError):
        DEFAULT_OPTIONS.fused_head = False  # type: ignore[misc]
    src = __import__("inspect").getsource(FastOptions)
    for f in dataclasses.fields(FastOptions):  # every field carries its one-line reason
        line = next(ln for ln in src.splitlines() if ln.strip().startswith(f"{f.name}:"))
        assert "#" in line, f.name


def test_replace_and_lookups():
    o = DEFAULT_OPTIONS.replace(attention_splits=3, gemm_splits=(((64, 64), 4),))
    assert o.attention_splits == 3 and DEFAULT_OPTIONS.attention_splits is None
    assert o.splits_for(64, 64) == 4 and o.splits_for(64, 65) == 1
    assert DEFAULT_OPTIONS.splits_for(1280, 5120) == 4
    assert o.describe()["attention_splits"] == 3 and set(o.describe()) == {f.name for f in dataclasses.fields(o)}


def test_objects_carry_their_options_down():
    o = FastOptions(fused_head=False, gemv=False)
    be = FastCudaBackend(options=o)
    assert be.options is o and be._fb_engine().options is o
    rnd = FastRound(options=o)
    assert rnd.options is o and rnd._round_eng.options is o
    assert FastCudaBackend().options is DEFAULT_OPTIONS
    assert CudaEngine(attention=(None, "none")).options is DEFAULT_OPTIONS


def test_a_backend_refuses_anything_but_fast_options():
    with pytest.raises(TypeError, match="FastOptions"):
        FastCudaBackend(options={"fused_head": False})
