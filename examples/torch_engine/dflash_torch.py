"""A small PyTorch implementation of two DFlash Ops, written the way an engine team wraps
its kernels for the conformance suite (CONTRACTS C9, docs/ops.md).

    dflash-conformance run --impl examples.torch_engine.dflash_torch:TorchEngine \
        --ops 'feature_capture,candidate_topk' --require 'feature_capture,candidate_topk' \
        --junit reports/dflash.xml

The harness calls one method per Op with NumPy arrays (BF16 tensors as ml_dtypes.bfloat16)
and keyword arguments named as the vector's inputs and params; the methods move them to the
engine's device, call the "kernels" (here: plain torch ops standing in for an engine's
fused kernels) and return torch tensors, which the harness reads back itself (bfloat16 by
bit pattern). Every other Op is simply absent: NOT_IMPLEMENTED, not a failure (unless it is
named in --require).

The numerics are those of a production engine, not of the reference: FP32 accumulation
in the GEMMs (cuBLAS BF16 GEMMs accumulate in FP32), the feature GEMM's output stored in
BF16 before the norm kernel, RMSNorm in FP32, a stable descending sort for the top-k
(ties to the lower row, CONTRACTS C4) and the score transform in FP32 after selection.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import torch

_BF16 = np.dtype(ml_dtypes.bfloat16)


class TorchEngine:
    name = "example torch engine"

    def __init__(self, device: str | None = None):
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))

    def environment(self) -> dict:
        env = {"torch": torch.__version__, "device": str(self.device)}
        if self.device.type == "cuda":
            env["gpu"] = torch.cuda.get_device_name(self.device)
        return env

    # -- moving arrays in (the harness hands NumPy; BF16 as ml_dtypes.bfloat16)
    def _t(self, x) -> torch.Tensor:
        x = np.ascontiguousarray(x)
        if x.dtype == _BF16:  # NumPy has no bfloat16: go through the bits
            return torch.from_numpy(x.view(np.int16)).view(torch.bfloat16).to(self.device)
        return torch.from_numpy(x).to(self.device)

    # -- Op: feature_capture  (context = RMSNorm(W_fc . concat(r^l for l in ids)), stored BF16)
    def feature_capture(self, block_outputs, fc_weight, hidden_norm, target_layer_ids, eps):
        r = self._t(block_outputs)
        s = torch.cat([r[int(i)] for i in target_layer_ids], dim=-1)  # [T, n*Ht] bf16, in the recorded order
        projected = (s.float() @ self._t(fc_weight).float().T).to(torch.bfloat16)  # GEMM out: BF16 in memory
        x = projected.float()
        y = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * self._t(hidden_norm).float()
        return {"context": y.to(torch.bfloat16)}

    # -- Op: candidate_topk  (stable top-k of the head logits; u = c tanh(m z / c) after selection)
    def candidate_topk(self, hidden, head, vocab_size, top_k, output_multiplier=0.0, softcap=0.0, shortlist=None):
        z = self._t(hidden).float() @ self._t(head).float().T  # [B, K, Vr] FP32 logits
        rows = z.shape[-1]
        gid = torch.arange(rows, device=self.device) if shortlist is None else self._t(shortlist).long()
        eligible = (gid >= 0) & (gid < int(vocab_size))
        nan = torch.isnan(z)
        key = torch.where(eligible & ~nan, z, torch.tensor(float("-inf"), device=self.device))
        _, order = torch.sort(key, dim=-1, descending=True, stable=True)  # ties: lower row first
        # a NaN logit (inf * 0 after an overflow) ranks after every number, -inf included, and
        # ineligible rows come last (C4; torch.sort alone would put NaN first): a second stable
        # sort by that group keeps the value order inside each group
        group = torch.where(eligible, nan.to(torch.int8), torch.full_like(nan, 2, dtype=torch.int8))
        _, regroup = torch.sort(torch.gather(group, -1, order), dim=-1, stable=True)
        order = torch.gather(order, -1, regroup)[..., : int(top_k)]
        vals = torch.gather(z, -1, order)
        if output_multiplier > 0:
            vals = vals * float(output_multiplier)
        if softcap > 0:
            vals = float(softcap) * torch.tanh(vals / float(softcap))
        return {"scores": vals.float(), "ids": gid[order].to(torch.int32)}
