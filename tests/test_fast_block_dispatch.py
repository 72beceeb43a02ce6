"""Which fb_resid_norm kernel kernels_cu.fast.block.resid_norm_path picks (CPU: the choice reads
only shapes and pointer alignments; the kernels themselves are compared on the GPU in
tests/gpu/test_fast_block.py)."""

from __future__ import annotations

import pytest

from kernels_cu.fast import block as fb
from kernels_cu.fast.options import DEFAULT_OPTIONS, FastOptions


class _Ptr:
    def __init__(self, ptr):
        self.ptr = ptr


class _Arr:
    def __init__(self, ptr):
        self.data = _Ptr(ptr)


def test_auto_takes_the_cluster_kernel_for_few_aligned_rows():
    rows = DEFAULT_OPTIONS.resid_norm_cluster_max_rows
    assert DEFAULT_OPTIONS.resid_norm_path == "auto"
    f32, bits = (_Arr(4096), None), (_Arr(8),)
    sm90 = {"capable": True}
    assert fb.resid_norm_path(8, 5120, f32, bits, **sm90) == "cluster"
    assert fb.resid_norm_path(rows, 2048, f32, bits, **sm90) == "cluster"
    assert fb.resid_norm_path(rows + 1, 2048, f32, bits, **sm90) == "block"  # many rows
    assert fb.resid_norm_path(8, 5120 + 16, f32, bits, **sm90) == "block"  # H not a multiple of 32
    assert fb.resid_norm_path(8, 8192 + 32, f32, bits, **sm90) == "block"  # wider than the register slices
    assert fb.resid_norm_path(8, 5120, (_Arr(4104),), bits, **sm90) == "block"  # fp32 row not 16-byte aligned
    assert fb.resid_norm_path(8, 5120, f32, (_Arr(4),), **sm90) == "block"  # BF16 row not 8-byte aligned
    assert fb.resid_norm_path(8, 5120, f32, bits, capable=False) == "block"  # below sm_90: no clusters
    fewer = FastOptions(resid_norm_cluster_max_rows=4)
    assert fb.resid_norm_path(8, 5120, f32, bits, options=fewer, **sm90) == "block"


def test_cluster_capable_reads_the_compute_capability(monkeypatch):
    class _Dev:
        def __init__(self, cc):
            self.id, self.compute_capability = 0, cc

    for cc, want in (("80", False), ("89", False), ("90", True), ("100", True)):
        fb._compute_capability.cache_clear()
        monkeypatch.setattr(fb, "cp", lambda cc=cc: type("C", (), {"cuda": type("D", (), {
            "Device": staticmethod(lambda i=0, cc=cc: _Dev(cc))})}))
        assert fb.cluster_capable() is want, cc

    def broken():
        raise ImportError("no cupy")

    fb._compute_capability.cache_clear()
    monkeypatch.setattr(fb, "cp", broken)
    assert fb.cluster_capable() is False  # no CuPy / no device: no clusters
    fb._compute_capability.cache_clear()


def test_forced_paths():
    for path in ("block", "strided"):
        assert fb.resid_norm_path(128, 5120 + 16, options=FastOptions(resid_norm_path=path)) == path
    cluster = FastOptions(resid_norm_path="cluster")
    assert fb.resid_norm_path(128, 5120, capable=True, options=cluster) == "cluster"
    with pytest.raises(ValueError, match="H 5136"):
        fb.resid_norm_path(8, 5136, capable=True, options=cluster)
    with pytest.raises(ValueError, match="clusters: False"):
        fb.resid_norm_path(8, 5120, capable=False, options=cluster)
    with pytest.raises(ValueError, match="auto, cluster, block or strided"):
        fb.resid_norm_path(8, 5120, options=FastOptions(resid_norm_path="fastest"))
