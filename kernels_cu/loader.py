"""Compile options and module loading, shared by every kernel family.

Options are chosen deliberately and recorded with every report (Vulkan-CTS
habit): CuPy always appends ``-ftz=true`` to NVRTC compiles, and FMA
contraction is on unless ``--fmad=false``. The CI compile test
(tests/test_nvcc_compile.py) builds every .cu under kernels_cu/ (exact/, fast/)
with nvcc and the same options, for sm_90.

Layout: device/ holds the shared device headers (.cuh, on the include path of
every build), exact/ and fast/ the kernels of each mode. A module is named by
its path under kernels_cu/ without the suffix: ``load_module("exact/select")``.
"""

from __future__ import annotations

import functools
from pathlib import Path

KERNEL_DIR = Path(__file__).resolve().parent
DEVICE_DIR = KERNEL_DIR / "device"  # the shared .cuh headers: every build's include path

# NVRTC options passed by us. -ftz=true is appended by CuPy anyway; stating it
# keeps the record honest and makes the nvcc compile test build the same code.
# FMA contraction stays on: production kernels run with it, and the comparison
# bounds (C2) absorb its effect; exact contracts (RNG, representation rounding)
# are written with explicit intrinsics that contraction cannot change.
NVRTC_OPTIONS: tuple[str, ...] = ("-std=c++17", "--fmad=true", "-ftz=true")
NVCC_ARCH = "sm_90"


def nvcc_command(source: Path, output: Path) -> list[str]:
    """The nvcc command line that mirrors the NVRTC options for one source."""
    opts = [o for o in NVRTC_OPTIONS if o != "-std=c++17"]
    return ["nvcc", "-std=c++17", f"-arch={NVCC_ARCH}", "-cubin", *opts, "-I", str(DEVICE_DIR),
            "-o", str(output), str(source)]


def include_options() -> tuple[str, ...]:
    """The NVRTC include option of every build (the shared device headers)."""
    return (f"-I{DEVICE_DIR}",)


def sources() -> list[Path]:
    """Every kernel source under kernels_cu/ (exact/, fast/ and any other folder), sorted by path."""
    return sorted(KERNEL_DIR.rglob("*.cu"))


def source_path(name: str) -> Path:
    """kernels_cu/<name>.cu for a module name such as "exact/select" or "fast/block"."""
    path = KERNEL_DIR / f"{name}.cu"
    if not path.is_file():
        raise FileNotFoundError(f"no kernel source {path} (module names are paths under kernels_cu/, e.g. 'fast/block')")
    return path


@functools.cache
def load_module(name: str):
    """cupy.RawModule for kernels_cu/<name>.cu (compiled once per process)."""
    import cupy

    code = source_path(name).read_text()
    return cupy.RawModule(code=code, options=(*NVRTC_OPTIONS, *include_options()), name_expressions=None)


def nvrtc_arch_module(src: str, name: str, options: list[str]):
    """A cupy.cuda.function.Module of ``src`` compiled by NVRTC with exactly ``options`` (which name the
    architecture: CuPy's RawModule picks plain sm_90 on an H200, which has no wgmma; sm_90a needs this). A compile
    error raises RuntimeError with NVRTC's log."""
    import cupy
    from cupy_backends.cuda.libs import nvrtc

    prog = nvrtc.createProgram(src, name, (), ())
    try:
        try:
            nvrtc.compileProgram(prog, list(options))
        except Exception as exc:  # the log says why
            raise RuntimeError(f"NVRTC {name} ({' '.join(options)}): {exc}\n{nvrtc.getProgramLog(prog)}") from exc
        cubin = nvrtc.getCUBIN(prog)
    finally:
        nvrtc.destroyProgram(prog)
    mod = cupy.cuda.function.Module()
    mod.load(cubin)
    return mod


class ModuleFunction:
    """A function of an ``nvrtc_arch_module`` in the shape CuPy's RawKernel has where the kernels use it: the call
    ``(grid, block, args, shared_mem=)``, ``.kernel.ptr`` (kernels_cu.pdl.launch, the occupancy query), ``.name`` and
    ``.attributes["num_regs"]``. ``smem``: the dynamic shared memory it may launch with, raised once here."""

    def __init__(self, fn, name: str, smem: int = 0):
        self.kernel, self.name = fn, name
        if smem > 48 * 1024:
            import cupy

            cupy.cuda.driver.funcSetAttribute(fn.ptr, cupy.cuda.driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                              int(smem))

    def __call__(self, grid, block, args, shared_mem=0):
        self.kernel(grid, block, args, shared_mem=shared_mem)

    @property
    def attributes(self) -> dict:
        import cupy

        return {"num_regs": cupy.cuda.driver.funcGetAttribute(cupy.cuda.driver.CU_FUNC_ATTRIBUTE_NUM_REGS,
                                                               self.kernel.ptr)}


_SMEM_ALLOWED: dict[int, tuple] = {}  # id(kernel) -> (kernel, dynamic shared memory it may launch with)


def allow_dynamic_shared_memory(fn, nbytes: int):
    """Let the CuPy RawKernel ``fn`` launch with ``nbytes`` of dynamic shared memory: above the default
    48 KiB a kernel must opt in (cuFuncSetAttribute). Set once per kernel and size; returns ``fn``."""
    import warnings

    _, allowed = _SMEM_ALLOWED.get(id(fn), (None, 48 * 1024))
    if nbytes > allowed:
        with warnings.catch_warnings():  # some CuPy versions deprecate the RawKernel spelling; it still sets it
            warnings.simplefilter("ignore", DeprecationWarning)
            fn.max_dynamic_shared_size_bytes = int(nbytes)
        _SMEM_ALLOWED[id(fn)] = (fn, int(nbytes))  # the kernel is held, so its id is not reused
    return fn


def compile_record() -> dict:
    """What a report must carry about how the kernels were built."""
    rec = {"nvrtc_options": list(NVRTC_OPTIONS), "cupy_appends": ["-ftz=true"], "arch_ci": NVCC_ARCH}
    try:
        import cupy

        rec["cupy"] = cupy.__version__
        rec["cuda_runtime"] = cupy.cuda.runtime.runtimeGetVersion()
        rec["cuda_driver"] = cupy.cuda.runtime.driverGetVersion()
        rec["nvrtc"] = ".".join(map(str, cupy.cuda.nvrtc.getVersion()))
        props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
        rec["device"] = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        rec["compute_capability"] = f"{props['major']}.{props['minor']}"
    except Exception as exc:  # noqa: BLE001 - no CuPy or no GPU: the record says so
        rec["cuda_unavailable"] = f"{type(exc).__name__}: {exc}"
    return rec
