"""Every kernel source under kernels_cu/ (exact/*.cu, fast/*.cu) compiles with nvcc for sm_90 with the NVRTC
options (kernels_cu.loader).

Runs in CI where nvcc exists (no GPU needed) and skips with a reason elsewhere. Each source is
built twice: as NVRTC will see it on a machine with the CUDA headers, and with
DFLASH_NO_CUDA_FP_HEADERS (common.cuh's inline-PTX conversions, the path NVRTC takes when it
cannot find cuda_bf16.h). All compiles run in parallel once per session; a failure prints
nvcc's command line and stderr.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from kernels_cu import loader

pytestmark = pytest.mark.nvcc

NVCC = shutil.which("nvcc")
NVDISASM = shutil.which("nvdisasm")
VARIANTS = {"headers": (), "ptx_fallback": ("-DDFLASH_NO_CUDA_FP_HEADERS",)}
SOURCES = loader.sources()
# the fallback macro only changes sources that include common.cuh; building the others twice
# would only double the CI time
JOBS = [(src, v) for src in SOURCES for v in VARIANTS if v == "headers" or '"common.cuh"' in src.read_text()]


def _name(src: Path) -> str:
    """A source's path under kernels_cu/ (exact/attention.cu and fast/attention.cu are two sources); a file elsewhere
    (a test's own source) by its name."""
    return src.relative_to(loader.KERNEL_DIR).as_posix() if loader.KERNEL_DIR in src.parents else src.name


def _build(src: Path, variant: str, out_dir: Path):
    cmd = [*loader.nvcc_command(src, out_dir / f"{_name(src).replace('/', '_')}.{variant}.cubin"), *VARIANTS[variant]]
    try:
        proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired as exc:
        return cmd, -1, f"timed out after {exc.timeout} s"
    return cmd, proc.returncode, proc.stderr


@pytest.fixture(scope="session")
def builds(tmp_path_factory):
    if NVCC is None:
        pytest.skip("nvcc is not on PATH (the CUDA toolkit is not installed here)")
    out_dir = tmp_path_factory.mktemp("cubin")
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        results = pool.map(lambda job: _build(*job, out_dir), JOBS)
        return {(_name(src), v): r for (src, v), r in zip(JOBS, results)}


def test_kernel_sources_exist():
    """sources() lists every .cu of every folder (both modes), so the compile test below builds them all."""
    assert SOURCES, f"no .cu files under {loader.KERNEL_DIR}"
    assert SOURCES == sorted(loader.KERNEL_DIR.rglob("*.cu"))
    folders = {src.parent.name for src in SOURCES}
    assert {"exact", "fast"} <= folders, folders
    assert len({_name(src) for src in SOURCES}) == len(SOURCES)


def test_every_include_resolves_in_the_device_folder():
    """Every #include "x.cuh" of a kernel source names a header of kernels_cu/device/ (the one include path)."""
    for src in SOURCES + sorted(loader.DEVICE_DIR.glob("*.cuh")):
        for inc in re.findall(r'#include "([^"]+)"', src.read_text()):
            assert (loader.DEVICE_DIR / inc).is_file(), f"{_name(src)} includes {inc}, not in {loader.DEVICE_DIR}"


@pytest.mark.parametrize(("source", "variant"), [(_name(src), v) for src, v in JOBS])
def test_kernel_compiles(builds, source, variant):
    cmd, rc, stderr = builds[(source, variant)]
    assert rc == 0, f"nvcc failed ({rc}) on {source}:\n$ {' '.join(cmd)}\n{stderr}"


def test_nvcc_command_mirrors_nvrtc_options():
    """The CI build must be the build NVRTC does: same -std, FTZ and FMA choices, sm_90."""
    cmd = loader.nvcc_command(Path("x.cu"), Path("x.cubin"))
    for opt in loader.NVRTC_OPTIONS:
        assert opt in cmd
    assert f"-arch={loader.NVCC_ARCH}" in cmd and loader.NVCC_ARCH == "sm_90"


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH (the CUDA toolkit is not installed here)")
def test_a_compile_error_is_reported(tmp_path):
    """The check can fail: a source with a type error gives a nonzero status and nvcc's message."""
    bad = tmp_path / "broken.cu"
    bad.write_text('#include "common.cuh"\nextern "C" __global__ void k(float* x) { x[0] = dfl::no_such(); }\n')
    _, rc, stderr = _build(bad, "headers", tmp_path)
    assert rc != 0 and "no_such" in stderr


CLUSTER_SOURCES = ("fast/block.cu", "fast/selector.cu")  # thread-block clusters (sm_90+), guarded


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH (the CUDA toolkit is not installed here)")
@pytest.mark.parametrize("source", CLUSTER_SOURCES)
def test_cluster_sources_still_build_below_sm90(tmp_path, source):
    """fast/block.cu (fb_resid_norm_cluster) and fast/selector.cu use __cluster_dims__, which sm_80
    rejects: their cluster code sits behind __CUDA_ARCH__ >= 900, so NVRTC on an A100 or L40 still
    builds the module (fast_block.cluster_capable() keeps Python off the missing kernels). Without
    the guard this build fails."""
    src = loader.KERNEL_DIR / source
    assert "__cluster_dims__" in src.read_text()
    cmd = [c if not c.startswith("-arch=") else "-arch=sm_80" for c in loader.nvcc_command(src, tmp_path / "x.cubin")]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"nvcc failed on {source} for sm_80:\n$ {' '.join(cmd)}\n{proc.stderr}"


def _sm_90a_frames(tmp_path, name: str, text: str, extra: tuple[str, ...] = ()) -> list[tuple[str, str, str]]:
    """Build ``text`` (a module's NVRTC source) with nvcc for sm_90a and the loader's options (and ``extra``); assert
    it compiles, with no unused variable, and ptxas names no C7515 serialization of a wgmma chain; return ptxas's
    (stack frame, spill stores, spill loads) per kernel. The cubin is left at tmp_path / f"{name}.cubin"."""
    src = tmp_path / f"{name}.cu"
    src.write_text(text)
    opts = [o for o in loader.NVRTC_OPTIONS if o != "-std=c++17"] + list(extra)
    cmd = [NVCC, "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a", "-cubin", *opts, "-Xptxas", "-v", "-I",
           str(loader.DEVICE_DIR), "-o", str(tmp_path / f"{name}.cubin"), str(src)]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"$ {' '.join(cmd)}\n{proc.stderr}"
    assert "C7515" not in proc.stderr, proc.stderr
    # a variable declared and never used: a shadowing bug (a u64 named like the lane's accumulator row offset g, so
    # the staging indexed shared memory by a threshold) shows only as this warning on the outer g
    assert "declared but never referenced" not in proc.stderr, proc.stderr
    frames = re.findall(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", proc.stderr)
    assert frames, proc.stderr
    return frames


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH (the CUDA toolkit is not installed here)")
@pytest.mark.parametrize("n", [8, 120, 128])
def test_fast_head_builds_for_sm_90a_without_local_memory(tmp_path, n):
    """kernels_cu/fast/head.cu as fast/head.py hands it to NVRTC for N hidden rows (the generated m64nNk16 wrapper
    prepended, sm_90a, the loader's options), built by nvcc: it compiles, ptxas names no C7515 serialization of the
    wgmma chains, and for both kernels (fast_head_topk, fast_head_topk_pp; 2 x N / 2 accumulators a thread and the
    selection) ptxas reports no spill and no stack frame, which would put accumulators in local memory."""
    from kernels_cu.fast import head as fast_head

    frames = _sm_90a_frames(tmp_path, f"fast_head_n{n}", fast_head.source(n))
    assert len(frames) == 2 and all(v == "0" for f in frames for v in f), frames  # one line a kernel


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH (the CUDA toolkit is not installed here)")
@pytest.mark.parametrize("stages", [2, 3])
def test_fast_attention_wgmma_form_builds_for_sm_90a_without_local_memory(tmp_path, stages):
    """kernels_cu/fast/attention.cu's wgmma form with the options fast/attention.py gives NVRTC for it (FA_SINGLE at
    D 128, 4 m-tiles, BF16 bits, -DFA_WG=1; sm_90a): it compiles, no C7515, no spill or stack frame in the main kernel
    and the combine kernels, one a batch of fast_attention.COMBINE_BATCHES (the 64 + 32 accumulators stay in
    registers), and (where nvdisasm is here) the main
    kernel's SASS holds the warpgroup MMAs: 8 k16 steps of QK and 4 of PV a context tile, 8 + 8 for the block tile's
    QK and its two PV passes = 28 HGMMA. The same options without -DFA_WG=1 build the mma.sync kernel (no HGMMA)."""
    from kernels_cu.fast import attention as fa

    text = (loader.KERNEL_DIR / "fast" / "attention.cu").read_text()
    counts = {}
    for wg in (True, False):
        opts = tuple(o for o in fa.module_options(128, 4, False, stages, wg)
                     if o not in loader.NVRTC_OPTIONS and not o.startswith("-I"))
        name = f"fast_attention_{'wg' if wg else 'mma'}_s{stages}"
        frames = _sm_90a_frames(tmp_path, name, text, opts)
        assert len(frames) == 1 + len(fa.COMBINE_BATCHES) and all(v == "0" for f in frames for v in f), frames
        if NVDISASM:
            sass = subprocess.run([NVDISASM, str(tmp_path / f"{name}.cubin")], check=True, capture_output=True,
                                  text=True, timeout=120).stdout
            counts[wg] = len(re.findall(r"\bHGMMA\.", sass))
    if NVDISASM:
        assert counts == {True: 28, False: 0}, counts
