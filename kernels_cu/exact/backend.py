"""The CUDA implementation object (CONTRACTS C9): ``CudaBackend``.

One method per Op, named as the Op, keyword arguments named as docs/ops.md's inputs and
params, a dict of outputs back. Inputs may be CuPy or NumPy arrays; outputs are CuPy
arrays. BF16 tensors travel as uint16 bit patterns both ways, FP16 as float16, FP32 as
float32, integers as integers (see kernels_cu/exact/attention.py). The attention path comes
from ``AttentionOps``, proposal_head from ``ProposalHeadOps`` (kernels_cu/exact/proposal_head.py); the selection
path (``SelectionOps``, kernels_cu/exact/select.py) is
composed when that module imports, and otherwise its Ops are simply absent, which the
harness reports as NOT_IMPLEMENTED rather than a failed run.
"""

from __future__ import annotations

import os
import platform
import sys

from kernels_cu.exact.attention import AttentionOps
from kernels_cu.exact.proposal_head import ProposalHeadOps
from kernels_cu.loader import compile_record, load_module

try:
    from kernels_cu.exact.select import SelectionOps

    _SELECT_STATUS = "composed"
except Exception as exc:  # noqa: BLE001 - absent or broken, the attention Ops must still run
    _SELECT_STATUS = f"unavailable ({type(exc).__name__}: {exc})"

    class SelectionOps:  # a placeholder with no Op methods
        pass


class CudaBackend(ProposalHeadOps, AttentionOps, SelectionOps):
    array_module = "cupy"
    name = "kernels_cu"

    def environment(self) -> dict:
        """What a report must record: compile options, GPU, driver, CUDA, CuPy, NumPy."""
        import ml_dtypes
        import numpy

        rec = compile_record()
        rec.update(
            backend=self.name,
            python=sys.version.split()[0],
            platform=platform.platform(),
            numpy=numpy.__version__,
            ml_dtypes=ml_dtypes.__version__,
            selection_ops=_SELECT_STATUS,
            cupy_tf32=os.environ.get("CUPY_TF32", "unset (fp32 GEMMs without TF32)"),
        )
        try:
            import cupy

            flag = cupy.zeros(1, dtype=cupy.int32)
            load_module("exact/norm_rope").get_function("fp_conversion_path")((1,), (1,), (flag,))
            rec["fp_conversion_path"] = "cuda_bf16.h/cuda_fp16.h intrinsics" if int(flag[0]) else "inline PTX cvt.rn"
            rec["cuda_runtime_version"] = _cuda_version(cupy.cuda.runtime.runtimeGetVersion())
            rec["cuda_driver_version"] = _cuda_version(cupy.cuda.runtime.driverGetVersion())
            try:
                import pynvml

                pynvml.nvmlInit()
                rec["nvidia_driver"] = _text(pynvml.nvmlSystemGetDriverVersion())
            except Exception as exc:  # noqa: BLE001 - NVML is optional; the CUDA driver version is recorded
                rec["nvidia_driver"] = f"unknown ({type(exc).__name__})"
        except Exception as exc:  # noqa: BLE001 - no CuPy or no GPU: the record says so
            rec["cuda_unavailable"] = f"{type(exc).__name__}: {exc}"
        return rec


def _cuda_version(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10}"


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)
