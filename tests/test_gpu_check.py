"""tools/gpu_check.sh's argument handling and the commands of each part (its --dry-run), on a machine without a GPU:
the parts name existing files and the documented --impl strings, and a bad call is a usage error."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tools" / "gpu_check.sh"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not on PATH")


def _run(*args, cwd=ROOT):
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def test_usage_errors_exit_2(tmp_path):
    for args in ((), ("--dry-run",), ("--dry-run", str(tmp_path), "nope"), ("-x",)):
        r = _run(*args)
        assert r.returncode == 2 and "usage" in r.stderr, (args, r.stderr)


def test_out_under_docs_is_refused(tmp_path):
    r = _run("--dry-run", "docs/gpu-out", "bench")
    assert r.returncode == 2 and "docs" in r.stderr
    assert not (ROOT / "docs" / "gpu-out").exists() or (ROOT / "docs" / "gpu-out").rmdir() is None


def test_dry_run_lists_every_part_in_order(tmp_path):
    r = _run("--dry-run", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    names = [line.split("]")[0][1:] for line in r.stdout.splitlines()]
    assert names == ["tests-a", "tests-b", "suite-exact", "suite-fast", "suite-fast-round", "suite-round",
                     "geometry-35b", "geometry-27b", "geometry-gpu-ref", "bench"]
    out = str((tmp_path / "out").resolve())
    text = r.stdout
    for impl in ("kernels_cu.backend:CudaBackend", "kernels_cu.fast:FastCudaBackend", "kernels_cu.fast_round:FastRound",
                 "kernels_cu.round:CudaRound"):
        assert f"--impl {impl}" in text
    assert f"--json {out}/suite_fast.json" in text and f"--json {out}/bench.json" in text
    assert "-m benchmarks.gpu_bench" in text and "--jobs 4" in text
    assert "--reference-backend cupy" in text  # the timed run with the float64 reference on the GPU
    assert (tmp_path / "out").is_dir() and not any((tmp_path / "out").iterdir())  # a dry run writes no log


def test_parts_select_and_group(tmp_path):
    r = _run("--dry-run", str(tmp_path), "tests", "bench")
    assert [ln.split("]")[0][1:] for ln in r.stdout.splitlines()] == ["tests-a", "tests-b", "bench"]
    big = [w for w in r.stdout.splitlines()[0].split() if w.startswith("tests/gpu/")]
    assert big and all((ROOT / f).is_file() for f in big)  # the split names files that exist
    ignored = [w.split("=", 1)[1] for w in r.stdout.splitlines()[1].split() if w.startswith("--ignore=")]
    assert sorted(ignored) == sorted(big)  # tests-b is every other file
    r = _run("--dry-run", str(tmp_path), "geometry")
    assert [ln.split("]")[0][1:] for ln in r.stdout.splitlines()] == ["geometry-35b", "geometry-27b"]


def test_the_bench_and_the_impl_modules_exist():
    assert (ROOT / "benchmarks" / "gpu_bench.py").is_file()
    import importlib

    for impl in ("kernels_cu.backend:CudaBackend", "kernels_cu.fast:FastCudaBackend", "kernels_cu.fast_round:FastRound",
                 "kernels_cu.round:CudaRound"):
        mod, attr = impl.split(":")
        assert callable(getattr(importlib.import_module(mod), attr)), impl
