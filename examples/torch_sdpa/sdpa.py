"""draft_attention on PyTorch's ``F.scaled_dot_product_attention``, one SDPA backend forced per class.

    dflash-conformance run --impl examples.torch_sdpa.sdpa:Math --ops draft_attention
    (likewise :Flash, :Efficient, :Cudnn)

Each class pins one backend with ``torch.nn.attention.sdpa_kernel`` (``SDPBackend.MATH``,
``FLASH_ATTENTION``, ``EFFICIENT_ATTENTION``, ``CUDNN_ATTENTION``), so the run judges that kernel
and nothing else: no fallback to another backend. The glue is what an engine writes around SDPA:

- keys and values: the C ring slots then the W block rows, ``[B, C+W, Hk, D]`` in BF16 (the FP16
  V cache converted to BF16: SDPA takes one dtype for q, k and v);
- the boolean mask ``[B, 1, W, C+W]`` (True: attend) from examples/torch_sdpa/mask.py: present
  ring slots and block rows < live, and for a local layer |p_k - p_q| < S; nothing causal.
  Where every entry is True the call passes ``attn_mask=None`` (what an engine does when no key is
  masked; it lets the flash backend, which takes no mask, run those cases);
- GQA through ``enable_gqa=True`` (KV head h // (Hq / Hk)). A backend that refuses GQA but would
  take the call with K/V heads repeated (``repeat_interleave``, the same mapping) is run that way,
  and the case's output says so;
- scale 1/sqrt(D) (SDPA's default), output BF16 as SDPA returns it;
- a query row with no allowed key gives zeros (docs/ops.md: only rows >= live, unspecified there),
  where SDPA would give NaN or whatever its backend leaves.

Nothing else is corrected: an infinite V (FP16 overflow) at a masked key reaches the kernel as it is,
so a backend that multiplies a zero weight by it returns NaN and the case FAILs; that is the
library's behaviour an engine must guard against (docs/pitfalls.md, fp16_overflow).

A backend that refuses the mask, the shape or the dtype raises ``BackendRefused``, whose one-line
message (the case's ERROR detail) names the backend and PyTorch's reasons.
Imports torch only when a class is instantiated: the module imports without it.
"""

from __future__ import annotations

import re
import warnings

import numpy as np

from examples.torch_sdpa.mask import allowed_mask

BACKENDS = ("MATH", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION")

_NOISE = re.compile(r"\s*\(Triggered internally at [^)]*\)\.?|^\s*(User)?Warning:\s*")


def import_torch():
    try:
        import torch
    except ImportError as exc:
        raise ImportError(f"this adapter needs PyTorch, which cannot be imported here ({exc})") from None
    return torch


def to_device(x, device):
    """A NumPy input as a torch tensor on ``device``: BF16 (ml_dtypes) by its bit pattern."""
    torch = import_torch()
    a = np.ascontiguousarray(x)
    if a.dtype.name == "bfloat16":
        t = torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    else:
        t = torch.from_numpy(a.copy())
    return t.to(device)


def ring_and_block(q, k, v, k_cache, v_cache, device):
    """(q [B,W,Hq,D], keys [B,C+W,Hk,D], values [B,C+W,Hk,D]), all BF16 on ``device``: the C ring
    slots first, then the W block rows (the column order of examples/torch_sdpa/mask.py)."""
    torch = import_torch()
    if np.ndim(q) != 4 or np.ndim(k) != 4 or np.ndim(k_cache) != 4:
        raise ValueError(f"draft_attention: expected 4-d q, k, k_cache, got {np.shape(q)}, {np.shape(k)}, "
                         f"{np.shape(k_cache)}")
    hq, hk = np.shape(q)[2], np.shape(k)[2]
    if hk == 0 or hq % hk:
        raise ValueError(f"draft_attention: {hq} query heads are not a multiple of {hk} KV heads")
    bf = torch.bfloat16
    qt = to_device(q, device).to(bf)
    keys = torch.cat([to_device(k_cache, device).to(bf), to_device(k, device).to(bf)], dim=1)
    vals = torch.cat([to_device(v_cache, device).to(bf), to_device(v, device).to(bf)], dim=1)
    return qt, keys.contiguous(), vals.contiguous()


def zero_masked_rows(out, mask):
    """out [B, W, H, D]; rows whose mask row [B, W, N] allows no key become 0 (docs/ops.md)."""
    torch = import_torch()
    has_key = mask.any(-1)[:, :, None, None]
    return torch.where(has_key, out, torch.zeros((), dtype=out.dtype, device=out.device))


def refusal_reasons(messages) -> list[str]:
    """PyTorch's warnings and error text cut to distinct one-line reasons (its 'not used because'
    headers and 'Triggered internally' suffixes dropped)."""
    reasons: list[str] = []
    for message in messages:
        for line in str(message).splitlines():
            line = _NOISE.sub("", line).strip()
            if line and "not used because" not in line and line not in reasons:
                reasons.append(line)
    return reasons


class BackendRefused(RuntimeError):
    """The forced SDPA backend cannot run this call (mask, shape, dtype or GQA)."""

    def __init__(self, backend: str, reasons: list[str], call: str):
        self.backend, self.reasons, self.call = backend, reasons, call
        why = " | ".join(reasons) or "no reason given"
        super().__init__(f"SDPBackend.{backend} refused the call: {why} [{call}]")


class SdpaAttention:
    """draft_attention with ``backend`` (an ``SDPBackend`` member name) forced."""

    backend = "MATH"

    def __init__(self, device: str | None = None):
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown SDPA backend {self.backend!r}; known: {', '.join(BACKENDS)}")
        torch = import_torch()
        from torch.nn.attention import SDPBackend, sdpa_kernel

        self.torch = torch
        self.sdpa_kernel = sdpa_kernel
        self.sdp_backend = getattr(SDPBackend, self.backend)
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))

    @property
    def name(self) -> str:
        return f"torch SDPA {self.backend} (torch {self.torch.__version__}, {self.device})"

    def environment(self) -> dict:
        torch = self.torch
        env = {"library": "torch", "torch": torch.__version__, "sdpa_backend": self.backend,
               "device": str(self.device), "cuda": torch.version.cuda}
        if self.device.type == "cuda":
            env["gpu"] = torch.cuda.get_device_name(self.device)
            env["cudnn"] = torch.backends.cudnn.version()
        return env

    def _call(self, query, key, value, attn_mask, gqa: bool):
        F = self.torch.nn.functional
        kwargs = {"enable_gqa": True} if gqa else {}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                with self.sdpa_kernel(self.sdp_backend):
                    return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, **kwargs)
            except RuntimeError as exc:
                mask = "None" if attn_mask is None else f"{str(attn_mask.dtype)[6:]}{list(attn_mask.shape)}"
                call = (f"q {list(query.shape)} k/v {list(key.shape)} {str(query.dtype)[6:]}, attn_mask {mask}, "
                        f"enable_gqa {gqa}")
                raise BackendRefused(self.backend, refusal_reasons([w.message for w in caught] + [exc]),
                                     call) from None

    def attend(self, query, key, value, attn_mask):
        """SDPA on [B, H, L, D] tensors with the forced backend; GQA natively, else K/V repeated."""
        gqa = query.shape[1] != key.shape[1]
        try:
            return self._call(query, key, value, attn_mask, gqa)
        except BackendRefused as native:
            if not gqa:
                raise
            rep = query.shape[1] // key.shape[1]
            key, value = key.repeat_interleave(rep, dim=1), value.repeat_interleave(rep, dim=1)
            try:
                out = self._call(query, key, value, attn_mask, False)
            except BackendRefused as repeated:
                extra = [f"(with enable_gqa: {r})" for r in native.reasons if r not in repeated.reasons]
                raise BackendRefused(self.backend, repeated.reasons + extra, repeated.call) from None
            print(f"SDPBackend.{self.backend} refused enable_gqa ({' | '.join(native.reasons)}); "
                  f"ran with the K/V heads repeated {rep}x")
            return out

    def draft_attention(self, q, k, v, k_cache, v_cache, frontier, live, window):
        torch = self.torch
        width = np.shape(q)[1]
        mask_np = allowed_mask(frontier, live, np.shape(k_cache)[1], width, int(window))  # [B, W, C+W]
        qt, keys, vals = ring_and_block(q, k, v, k_cache, v_cache, self.device)
        mask = torch.from_numpy(mask_np).to(self.device)
        attn_mask = None if bool(mask_np.all()) else mask[:, None].contiguous()  # [B, 1, W, C+W]
        out = self.attend(qt.transpose(1, 2).contiguous(), keys.transpose(1, 2).contiguous(),
                          vals.transpose(1, 2).contiguous(), attn_mask)  # [B, Hq, W, D]
        out = zero_masked_rows(out.transpose(1, 2), mask)
        return {"out": out.to(torch.bfloat16).contiguous()}


class Math(SdpaAttention):
    backend = "MATH"


class Flash(SdpaAttention):
    backend = "FLASH_ATTENTION"


class Efficient(SdpaAttention):
    backend = "EFFICIENT_ATTENTION"


class Cudnn(SdpaAttention):
    backend = "CUDNN_ATTENTION"
