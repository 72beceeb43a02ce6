"""FlashInfer's kernels wrapped as a conformance implementation (written against flashinfer-python 0.5.3).

    dflash-conformance run --impl examples.flashinfer.adapter:FlashInfer \
        --ops 'draft_attention,context_kv,target_distribution,speculative_accept'

FlashInfer's own kernels do the work wherever FlashInfer has the operation; PyTorch does the glue
(moving arrays, concatenating the ring and the block, GEMMs, penalties, cache writes).

draft_attention: ``flashinfer.single_prefill_with_kv_cache`` (the FA2 prefill kernel, NHD layout,
    ``pos_encoding_mode="NONE"``, ``sm_scale = 1/sqrt(D)``, GQA by FlashInfer's own head grouping,
    which is the Op's h // (Hq / Hk)), one call per batch row, with a packed custom mask: keys are
    the C ring slots then the W block rows, and the mask is examples/torch_sdpa/mask.py's (present
    keys, |p_k - p_q| < S on a local layer, nothing causal), packed as ``flashinfer.packbits(...,
    bitorder="little")`` packs it. FlashInfer's prefill and RoPE kernels are built for head dims
    64, 128, 256 and 512 only; a smaller D (the vectors use 16 and 32) is zero-padded to the next
    one: zeros add nothing to q . k (the scale stays 1/sqrt(D)) and the padded output columns are
    dropped. A query row with no allowed key gives zeros (docs/ops.md). An infinite V at a masked key
    reaches the kernel unchanged (see examples/torch_sdpa/sdpa.py: the library's behaviour is judged).

context_kv: the K head norm is ``flashinfer.norm.rmsnorm`` and RoPE is
    ``flashinfer.apply_rope_with_cos_sin_cache`` (non-interleaved: ``is_neox=True`` rotates the split
    halves x[i], x[i + D/2], the Op's rope_1d).
    - ``flashinfer.norm.rmsnorm`` takes FP16/BF16 input only, so the projected K reaches it rounded to
      BF16 (the BF16 GEMM output an engine feeds it); the Op keeps raw K unrounded into the norm
      (docs/pitfalls.md, k_bf16_before_norm). ``FlashInferTorchNorm`` below keeps K in FP32 and does
      the norm in PyTorch instead, so a run of both separates the norm kernel's effect from the rest.
    - RoPE: FlashInfer's kernels that form their own angles (``apply_rope_pos_ids``) take the
      position as float and use ``__powf`` / ``__sincosf``, which cannot match the Op past 2^24
      (docs/pitfalls.md, positions_2p31); the cos/sin-cache kernel takes the table as given, so the
      table is built here, one row per chunk row, in float64 from the exact integer position and
      stored FP32 (rows indexed 0..T-1). The kernel's head dim is padded as above, with
      ``rotary_dim = D`` (the padding is not rotated). Its input is 16-bit: the normalized K is BF16.
    - V: the BF16 GEMM output converted to FP16 (FP16_RNE(BF16(v))). The cache writes are torch
      index writes: FlashInfer's ``append_paged_kv_cache`` takes one dtype for K and V, and the Op
      stores K in BF16 and V in FP16.

target_distribution: penalties in PyTorch (FP32), then FlashInfer's ``softmax`` kernel with the
    per-row temperature, ``top_k_renorm_probs`` and ``top_p_renorm_probs`` (each applied only to the
    rows whose filter is on: top_k in (0, Vr), top_p < 1), then min-p in PyTorch: FlashInfer 0.5.3 has
    min-p only as ``min_p_sampling_from_probs``, which draws a token, not a distribution. Greedy rows
    (temperature <= 0) are one-hot at the first maximum of the penalized logits.

speculative_accept: not implemented. FlashInfer's ``chain_speculative_sampling`` draws its own
    uniforms (a torch generator's seed and offset); the Op fixes every uniform as
    U(seed, position, purpose, index) (docs/ops.md, C3), which that kernel cannot take, and its
    residual draw is not the Op's race. The method is absent, so the run reports NOT_IMPLEMENTED.

FlashInfer and torch are imported when a class is instantiated: the module imports without them.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from examples.torch_sdpa.mask import allowed_mask, pack_mask_rows
from examples.torch_sdpa.sdpa import import_torch, ring_and_block, to_device, zero_masked_rows

WRITTEN_FOR = "0.5.3"
KERNEL_HEAD_DIMS = (64, 128, 256, 512)  # what FlashInfer's prefill and RoPE kernels are built for


def import_flashinfer():
    try:
        import flashinfer
    except ImportError as exc:
        raise ImportError(f"this adapter needs FlashInfer (pip install flashinfer-python=={WRITTEN_FOR}), "
                          f"which cannot be imported here ({exc})") from None
    return flashinfer


def kernel_head_dim(d: int) -> int:
    """The FlashInfer head dim a head of ``d`` values is padded to."""
    for size in KERNEL_HEAD_DIMS:
        if d <= size:
            return size
    raise ValueError(f"head dim {d} is larger than FlashInfer's largest ({KERNEL_HEAD_DIMS[-1]})")


def pad_last(x, size: int):
    """x zero-padded along its last axis to ``size`` (contiguous)."""
    torch = import_torch()
    if x.shape[-1] == size:
        return x.contiguous()
    return torch.nn.functional.pad(x, (0, size - x.shape[-1])).contiguous()


def rope_table(positions, head_dim: int, theta: float) -> np.ndarray:
    """FP32 [T, D] cos/sin cache rows for the absolute ``positions`` (cos in the first D/2 columns,
    sin in the last D/2, FlashInfer's layout): f_i = theta^(-2i/D), angle = p f_i in float64 from
    the exact integer position, as the Op defines rope_1d."""
    half = head_dim // 2
    inv_freq = float(theta) ** (-np.arange(half, dtype=np.float64) * 2.0 / head_dim)
    angle = np.asarray(positions, dtype=np.int64).astype(np.float64)[:, None] * inv_freq[None, :]
    return np.concatenate([np.cos(angle), np.sin(angle)], axis=1).astype(np.float32)


# --- the kernel calls (module level, so examples/flashinfer/warmup.py compiles exactly these) -------


def prefill_row(fi, q_row, k_row, v_row, packed_mask, sm_scale: float):
    """FlashInfer's FA2 prefill on one batch row: q [W, Hq, Dk], k/v [N, Hk, Dk] BF16 with Dk in
    KERNEL_HEAD_DIMS, ``packed_mask`` the packed [W, N] custom mask (uint8 on the device)."""
    return fi.single_prefill_with_kv_cache(q_row, k_row, v_row, packed_custom_mask=packed_mask, kv_layout="NHD",
                                           pos_encoding_mode="NONE", sm_scale=sm_scale, backend="fa2")


def rmsnorm_rows(fi, x, weight, eps: float):
    """``flashinfer.norm.rmsnorm`` on x [rows, D] BF16 with weight [D] BF16 (BF16 out)."""
    return fi.norm.rmsnorm(x.contiguous(), weight.contiguous(), eps=float(eps))


def rope_split_half(fi, x, cos_sin):
    """FlashInfer's cos/sin-cache RoPE on x [T, H, D] (16-bit), table [T, D] FP32 for rows 0..T-1:
    the split-half rotation of the first D values, the head padded to a FlashInfer head dim."""
    torch = import_torch()
    t, h, d = x.shape
    dk = kernel_head_dim(d)
    flat = pad_last(x, dk).reshape(t, h * dk)
    rows = torch.arange(t, dtype=torch.int64, device=x.device)
    _, k_rot = fi.apply_rope_with_cos_sin_cache(rows, flat, flat, dk, cos_sin.contiguous(), is_neox=True)
    return k_rot.reshape(t, h, dk)[..., :d]


def softmax_rows(fi, z, temperature):
    """FlashInfer's online softmax of z [N, V] FP32 at per-row temperature [N] FP32."""
    return fi.sampling.softmax(z.contiguous(), temperature=temperature.contiguous())


def top_k_renorm(fi, probs, top_k):
    return fi.sampling.top_k_renorm_probs(probs.contiguous(), top_k.contiguous())


def top_p_renorm(fi, probs, top_p):
    return fi.sampling.top_p_renorm_probs(probs.contiguous(), top_p.contiguous())


# --- the implementation object -------------------------------------------------------------------


class FlashInfer:
    """draft_attention, context_kv and target_distribution on FlashInfer's kernels (module docstring)."""

    head_norm_kernel = "flashinfer.norm.rmsnorm (BF16 input)"

    def __init__(self, device: str | None = None):
        self.torch = import_torch()
        self.fi = import_flashinfer()
        self.device = self.torch.device(device or ("cuda" if self.torch.cuda.is_available() else "cpu"))
        # FP32 GEMMs stay FP32 (the FP32-norm variant's projection)
        self.torch.backends.cuda.matmul.allow_tf32 = False

    @property
    def name(self) -> str:
        return f"FlashInfer {self.fi.__version__} (torch {self.torch.__version__}, {self.device})"

    def environment(self) -> dict:
        torch, fi = self.torch, self.fi
        env = {"library": "flashinfer", "flashinfer": fi.__version__, "torch": torch.__version__,
               "cuda": torch.version.cuda, "device": str(self.device), "head_norm": self.head_norm_kernel}
        if self.device.type == "cuda":
            env["gpu"] = torch.cuda.get_device_name(self.device)
        try:
            from flashinfer.jit import env as jit_env

            jit_dir = Path(jit_env.FLASHINFER_JIT_DIR)
            env["jit_dir"] = str(jit_dir)
            env["jit_compiled"] = sorted(p.parent.name for p in jit_dir.glob("*/*.so"))
        except Exception as exc:  # noqa: BLE001 - the list is informative only
            env["jit_compiled"] = f"unknown ({type(exc).__name__}: {exc})"
        return env

    def t(self, x):
        return to_device(x, self.device)

    # --- draft_attention -----------------------------------------------------------------------------

    def draft_attention(self, q, k, v, k_cache, v_cache, frontier, live, window):
        torch = self.torch
        batch, width, _, d = np.shape(q)
        mask_np = allowed_mask(frontier, live, np.shape(k_cache)[1], width, int(window))  # [B, W, C+W]
        qt, keys, vals = ring_and_block(q, k, v, k_cache, v_cache, self.device)
        dk = kernel_head_dim(d)
        qt, keys, vals = pad_last(qt, dk), pad_last(keys, dk), pad_last(vals, dk)
        rows = []
        for b in range(batch):
            packed = torch.from_numpy(pack_mask_rows(mask_np[b])).to(self.device)
            rows.append(prefill_row(self.fi, qt[b], keys[b], vals[b], packed, 1.0 / math.sqrt(d)))
        out = torch.stack(rows)[..., :d]  # [B, W, Hq, D]
        out = zero_masked_rows(out, torch.from_numpy(mask_np).to(self.device))
        return {"out": out.to(torch.bfloat16).contiguous()}

    # --- context_kv ------------------------------------------------------------------------------------

    def normalized_k(self, c, wk, k_norm, eps: float, head_dim: int):
        """[T, Hk, D] BF16: the K projection through FlashInfer's RMSNorm (BF16 in, BF16 out)."""
        t = c.shape[0]
        k_raw = self.torch.nn.functional.linear(c, wk)  # BF16 GEMM output: the 16-bit input rmsnorm takes
        return rmsnorm_rows(self.fi, k_raw.reshape(-1, head_dim), k_norm, eps).reshape(t, -1, head_dim)

    def context_kv(self, context, k_cache, v_cache, wk, wv, k_norm, start, eps, theta, head_dim, storage,
                   page_size=None, page_table=None):
        torch = self.torch
        d, start = int(head_dim), int(start)
        c = self.t(context)
        rows = c.shape[0]
        positions = start + np.arange(rows, dtype=np.int64)
        k = self.normalized_k(c, self.t(wk), self.t(k_norm), float(eps), d)
        table = torch.from_numpy(rope_table(positions, d, float(theta))).to(self.device)
        k = rope_split_half(self.fi, k.to(torch.bfloat16), table).to(torch.bfloat16)
        v = torch.nn.functional.linear(c, self.t(wv)).reshape(rows, -1, d).to(torch.float16)
        k_out, v_out = self.t(k_cache).clone(), self.t(v_cache).clone()
        self.store(k_out, v_out, positions, k, v, storage, page_table, page_size)
        return {"k_cache": k_out, "v_cache": v_out, "frontier": np.asarray(start + rows, dtype=np.int64)}

    def store(self, k_out, v_out, positions, k, v, storage, page_table, page_size) -> None:
        """The chunk's rows into the caches: a ring keeps the last capacity rows at slot p mod capacity;
        pages go through the page table (docs/ops.md, context_kv)."""
        torch = self.torch
        if storage == "ring":
            capacity = k_out.shape[0]
            first = max(0, len(positions) - capacity)
            slots = torch.from_numpy(np.mod(positions[first:], capacity)).to(self.device)
            k_out[slots] = k[first:].to(k_out.dtype)
            v_out[slots] = v[first:].to(v_out.dtype)
        elif storage == "paged":
            size = int(page_size)
            table = np.asarray(page_table, dtype=np.int64)
            pages = torch.from_numpy(table[positions // size]).to(self.device)
            within = torch.from_numpy(positions % size).to(self.device)
            k_out[pages, within] = k.to(k_out.dtype)
            v_out[pages, within] = v.to(v_out.dtype)
        else:
            raise ValueError(f"context_kv: storage must be 'ring' or 'paged', got {storage!r}")

    # --- target_distribution -------------------------------------------------------------------------

    def target_distribution(self, logits, prompt_mask, output_counts, temperature, top_p, min_p, repetition_penalty,
                            frequency_penalty, presence_penalty, top_k, vocab_size):
        torch = self.torch
        z = self.t(logits).float().clone()
        vr = z.shape[1]
        z[:, int(vocab_size):] = float("-inf")
        counts = self.t(output_counts).to(torch.int64)
        seen_out = counts > 0
        rho = self.t(repetition_penalty).float()[:, None]
        seen = (self.t(prompt_mask) != 0) | seen_out
        z = torch.where(seen & (rho != 1), torch.where(z > 0, z / rho, z * rho), z)
        z = z - (self.t(frequency_penalty).float()[:, None] * counts.float()
                 + self.t(presence_penalty).float()[:, None] * seen_out.float())
        temp = self.t(temperature).float()
        greedy = temp <= 0
        probs = softmax_rows(self.fi, z, torch.where(greedy, torch.ones_like(temp), temp))

        k = self.t(top_k).to(torch.int64)
        on = ((k > 0) & (k < vr) & ~greedy).nonzero().flatten()
        if on.numel():
            probs[on] = top_k_renorm(self.fi, probs[on], k[on].to(torch.int32))
        tp = self.t(top_p).float()
        on = ((tp < 1) & ~greedy).nonzero().flatten()
        if on.numel():
            if bool((tp[on] <= 0).any()):
                raise ValueError("top_p <= 0: outside the (0, 1) that flashinfer.sampling.top_p_renorm_probs takes")
            probs[on] = top_p_renorm(self.fi, probs[on], tp[on])
        mp = self.t(min_p).float()
        on = (mp > 0) & ~greedy
        if bool(on.any()):  # min-p in torch: FlashInfer 0.5.3 has no min-p renorm kernel
            keep = ~(probs < mp[:, None] * probs.max(dim=-1, keepdim=True).values)
            kept = torch.where(keep, probs, torch.zeros_like(probs))
            probs = torch.where(on[:, None], kept / kept.sum(dim=-1, keepdim=True), probs)
        if bool(greedy.any()):
            _, order = torch.sort(z, dim=-1, descending=True, stable=True)  # first maximum: lowest id
            hot = torch.zeros_like(z).scatter_(1, order[:, :1], 1.0)
            probs = torch.where(greedy[:, None], hot, probs)
        return {"probs": probs.float().contiguous()}


class FlashInferTorchNorm(FlashInfer):
    """FlashInfer, except that context_kv keeps the K projection in FP32 and does the head norm in
    PyTorch (FP32; the normalized K is rounded to BF16 once, for FlashInfer's RoPE kernel): the Op's
    "no rounding before the norm", which flashinfer.norm.rmsnorm (16-bit input only) cannot give."""

    head_norm_kernel = "torch FP32 (K projection FP32, no BF16 rounding before the norm)"

    def normalized_k(self, c, wk, k_norm, eps: float, head_dim: int):
        torch = self.torch
        t = c.shape[0]
        k_raw = torch.nn.functional.linear(c.float(), wk.float()).reshape(t, -1, head_dim)
        y = k_raw * torch.rsqrt(k_raw.pow(2).mean(dim=-1, keepdim=True) + eps) * k_norm.float()
        return y.to(torch.bfloat16)
