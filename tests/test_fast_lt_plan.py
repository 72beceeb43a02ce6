"""kernels_cu/fast/lt.py's per-shape cache (``tuned``), without a GPU.

The head GEMM's algorithm is chosen by timing at a shape's first call and reused after, so one owner
(a FastRound, a FastCudaBackend) keeps one algorithm per shape; a cuBLASLt failure leaves the shape on
gemmEx, says why, and is not retried; at most ``max_shapes`` tuned shapes are kept (32 MiB of
workspace each), the oldest freed first. LtGemm and CuPy are replaced by recording fakes here.
"""

from __future__ import annotations

import numpy as np
import pytest


class _Arr:
    def __init__(self, *shape):
        self.shape = shape


class _FakeCp:
    class cuda:
        class device:
            @staticmethod
            def get_cublas_handle():
                return 1


@pytest.fixture
def lt(monkeypatch):
    from kernels_cu.fast import lt as fast_lt

    log = {"tune": [], "call": [], "free": []}

    class FakeLt:
        fail = False

        def __init__(self, M, N, K, fallback):
            self.key, self.fallback = (M, N, K), fallback

        def tune(self, x, w, out, margin):
            log["tune"].append(self.key)
            if FakeLt.fail:
                raise RuntimeError("status 7")
            out.append(("lt", self.key))
            return self

        def __call__(self, x, w, out):
            log["call"].append(self.key)
            out.append(("lt", self.key))

        def free(self):
            log["free"].append(self.key)

    monkeypatch.setattr(fast_lt, "cp", lambda: _FakeCp)
    monkeypatch.setattr(fast_lt, "LtGemm", FakeLt)
    return fast_lt, FakeLt, log


def _gemmex(x, w, out):
    out.append(("gemmEx", (x.shape[0], w.shape[0], x.shape[1])))


def test_first_call_tunes_later_calls_reuse(lt):
    fast_lt, _, log = lt
    cache, out = {}, []
    x, w = _Arr(7, 64), _Arr(1000, 64)
    for _ in range(3):
        fast_lt.tuned(cache, x, w, out, _gemmex)
    assert log["tune"] == [(7, 1000, 64)] and log["call"] == [(7, 1000, 64)] * 2
    assert out == [("lt", (7, 1000, 64))] * 3  # every call computed its output once


def test_a_failure_stays_on_gemmex_records_why_and_is_not_retried(lt):
    fast_lt, fake, log = lt
    fake.fail = True
    cache, out = {}, []
    for _ in range(3):
        fast_lt.tuned(cache, _Arr(3, 64), _Arr(1000, 64), out, _gemmex)
    assert log["tune"] == [(3, 1000, 64)]
    assert cache[(3, 1000, 64)] is None and "status 7" in cache[("error", 3, 1000, 64)]
    assert out == [("gemmEx", (3, 1000, 64))] * 3


def test_at_most_max_shapes_kept_oldest_freed(lt):
    fast_lt, _, log = lt
    cache, out = {}, []
    for m in range(1, 6):
        fast_lt.tuned(cache, _Arr(m, 64), _Arr(1000, 64), out, _gemmex, max_shapes=3)
    kept = [k for k in cache if len(k) == 3]
    assert kept == [(3, 1000, 64), (4, 1000, 64), (5, 1000, 64)]
    assert log["free"] == [(1, 1000, 64), (2, 1000, 64)]
    assert len(out) == 5 and all(tag == "lt" for tag, _ in out)
    assert np.array_equal([k[0] for _, k in out], [1, 2, 3, 4, 5])


def test_loaded_library_finds_what_the_process_loaded_and_names_what_it_cannot():
    """fast_gemm.loaded_library (CaptureGemm's libcublas, LtGemm's libcublasLt): a library this process
    already mapped is found (libm: Python's own); an absent one is a RuntimeError naming it."""
    import sys
    from kernels_cu.fast.gemm import loaded_library

    if not sys.platform.startswith("linux"):
        pytest.skip("reads /proc/self/maps (Linux)")
    assert loaded_library("libm").cos is not None
    with pytest.raises(RuntimeError, match="libno_such_cuda_library"):
        loaded_library("libno_such_cuda_library")
