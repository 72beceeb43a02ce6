"""GPU test gate: every test under tests/gpu is marked ``gpu`` and skips, with the reason, when
CuPy cannot be imported or no CUDA device answers (CI has neither)."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@functools.cache
def gpu_unavailable() -> str | None:
    """None when a CUDA device is usable through CuPy, else why not."""
    try:
        import cupy
    except Exception as exc:  # noqa: BLE001 - any import failure means no GPU tests, with its reason
        return f"CuPy is not importable ({type(exc).__name__}: {exc})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001 - a driver/runtime error is reported as the skip reason
        return f"no CUDA device ({type(exc).__name__}: {exc})"
    return None if count > 0 else "no CUDA device (count 0)"


def pytest_collection_modifyitems(config, items):
    mine = [it for it in items if HERE in Path(str(it.path)).resolve().parents]
    for item in mine:
        item.add_marker(pytest.mark.gpu)
    reason = gpu_unavailable()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"gpu: {reason}")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def cupy():
    reason = gpu_unavailable()
    if reason is not None:
        pytest.skip(f"gpu: {reason}")
    import cupy

    return cupy


@pytest.fixture(scope="session")
def backend(cupy):
    from kernels_cu.exact.backend import CudaBackend

    return CudaBackend()
