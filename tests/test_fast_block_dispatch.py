"""Which fb_resid_norm kernel kernels_cu.fast_block.resid_norm_path picks (CPU: the choice reads
only shapes and pointer alignments; the kernels themselves are compared on the GPU in
tests/gpu/test_fast_block.py)."""

from __future__ import annotations

import pytest

import kernels_cu.fast_block as fb


class _Ptr:
    def __init__(self, ptr):
        self.ptr = ptr


class _Arr:
    def __init__(self, ptr):
        self.data = _Ptr(ptr)


def test_auto_takes_the_cluster_kernel_for_few_aligned_rows(monkeypatch):
    monkeypatch.setattr(fb, "RESID_NORM_PATH", "auto")
    f32, bits = (_Arr(4096), None), (_Arr(8),)
    assert fb.resid_norm_path(8, 5120, f32, bits) == "cluster"
    assert fb.resid_norm_path(fb.RESID_NORM_CLUSTER_MAX_ROWS, 2048, f32, bits) == "cluster"
    assert fb.resid_norm_path(fb.RESID_NORM_CLUSTER_MAX_ROWS + 1, 2048, f32, bits) == "block"  # many rows
    assert fb.resid_norm_path(8, 5120 + 16, f32, bits) == "block"  # H not a multiple of 32
    assert fb.resid_norm_path(8, 8192 + 32, f32, bits) == "block"  # wider than the register slices
    assert fb.resid_norm_path(8, 5120, (_Arr(4104),), bits) == "block"  # fp32 row not 16-byte aligned
    assert fb.resid_norm_path(8, 5120, f32, (_Arr(4),)) == "block"  # BF16 row not 8-byte aligned


def test_forced_paths(monkeypatch):
    for path in ("block", "strided"):
        monkeypatch.setattr(fb, "RESID_NORM_PATH", path)
        assert fb.resid_norm_path(128, 5120 + 16) == path
    monkeypatch.setattr(fb, "RESID_NORM_PATH", "cluster")
    assert fb.resid_norm_path(128, 5120) == "cluster"
    with pytest.raises(ValueError, match="H 5136"):
        fb.resid_norm_path(8, 5136)
    monkeypatch.setattr(fb, "RESID_NORM_PATH", "fastest")
    with pytest.raises(ValueError, match="auto, cluster, block or strided"):
        fb.resid_norm_path(8, 5120)
