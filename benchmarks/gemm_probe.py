"""Where feature_capture's time goes at a prefill chunk (H200 probe, issue 12): our BF16 gemmEx
with FP32 output against PyTorch's BF16-output GEMM and an FP32-output torch.mm, and the gather
of the chosen blocks, at the 27B and 35B feature widths. CUDA events, median, L2 flushed.

    python -m benchmarks.gemm_probe
"""

from __future__ import annotations

import json


def main() -> int:
    import cupy as cp
    import torch
    import torch.nn.functional as F

    from benchmarks.gpu_bench import Timer, bits
    from kernels_cu.fast_gemm import gemm_bf16

    timer = Timer(cp, torch)
    for name, h, n in [("27B", 5120, 5), ("35B", 2048, 8)]:
        for t in (128, 4096):
            x = torch.randn(t, n * h, dtype=torch.bfloat16, device="cuda")
            w = torch.randn(h, n * h, dtype=torch.bfloat16, device="cuda") * 0.01
            blocks = torch.randn(n, t, h, dtype=torch.bfloat16, device="cuda")
            xb, wb, bb = bits(cp, x), bits(cp, w), bits(cp, blocks)
            out = cp.empty((t, h), dtype=cp.float32)
            ids = cp.arange(n, dtype=cp.int64)
            r = {"shape": f"{name} T{t} K{n * h} N{h}",
                 "gemmEx_f32out": timer(lambda: gemm_bf16(xb, wb, out)),
                 "torch_linear_bf16out": timer(lambda: F.linear(x, w)),
                 "gather_transpose": timer(lambda: cp.ascontiguousarray(bb[ids].transpose(1, 0, 2).reshape(t, -1)))}
            try:
                r["torch_mm_f32out"] = timer(lambda: torch.mm(x, w.T, out_dtype=torch.float32))
            except Exception as exc:  # noqa: BLE001
                r["torch_mm_f32out"] = f"{type(exc).__name__}: {exc}"[:120]
            r["torch_linear_then_float"] = timer(lambda: F.linear(x, w).float())
            print(json.dumps(r), flush=True)
            del x, w, blocks
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
