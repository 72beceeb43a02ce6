"""proposal_head in the exact mode: the head GEMM in fp32 (cuBLAS through ``cupy.matmul``, FP32 accumulation on fp32
copies of the BF16 operands) and exact/head.cu's argmax_rows (the largest logit, the lowest head row on ties, global
ids through the shortlist)."""

from __future__ import annotations

import numpy as np

from kernels_cu.exact.attention import _NULL, _fn, cp, device, f32, linear


class ProposalHeadOps:
    """The proposal_head Op (CONTRACTS C9 signature), composed into CudaBackend."""

    def proposal_head(self, *, hidden, head, vocab_size, shortlist=None):
        h = f32(hidden)
        hw = f32(head)
        vr = hw.shape[0]
        sl = None if shortlist is None else device(shortlist).astype(np.int32)
        ids = cp().arange(vr) if sl is None else sl
        if not bool((ids < int(vocab_size)).any()):
            raise ValueError("proposal_head: no head row has a global id below vocab_size")
        logits = cp().ascontiguousarray(linear(h.reshape(-1, h.shape[-1]), hw))
        rows = logits.shape[0]
        tokens = cp().empty(rows, dtype=np.int32)
        _fn("exact/head", "argmax_rows")(
            (rows,), (256,),
            (logits, np.int32(rows), np.int32(vr), _NULL if sl is None else sl, np.int64(vocab_size), tokens),
        )
        return {"tokens": tokens.reshape(h.shape[:-1])}
