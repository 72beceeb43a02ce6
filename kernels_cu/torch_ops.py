"""PyTorch entry points of the fast kernels: torch custom ops in the namespace ``dflash``.

    import kernels_cu.torch_ops  # registers torch.ops.dflash.*
    out = torch.ops.dflash.draft_attention(q, k, v, k_cache, v_cache, frontier, live, 0)

Each op takes and returns torch tensors on a CUDA device and runs the fast mode's Op (``FastCudaBackend``,
kernels_cu/fast/) on the caller's current torch stream (CuPy's ``ExternalStream`` of
``torch.cuda.current_stream()``): no host synchronisation, so an op can sit inside an engine's own
``torch.cuda.graph`` capture. Tensors cross without copies: an input becomes a CuPy array over the tensor's own
memory (BF16 tensors as their uint16 bits, since CuPy has no bfloat16; FP16 / FP32 / integers as they are;
non-contiguous inputs are made contiguous first, a copy), and the outputs, CuPy allocations, reach torch through
DLPack: fresh arrays, aliasing no input and no buffer of the backend. ``register_fake`` gives every op its output shapes, so the ops trace under FakeTensorMode / torch.compile.

Ops (the C9 contracts of docs/ops.md, same inputs in the same units):

- ``draft_attention(q, k, v, k_cache, v_cache, frontier, live, window) -> out`` (BF16 q/k/v [B,W,H*,D], BF16 K
  ring and FP16 V ring [B,C,Hk,D], int64 frontier [B], int32 live [B]);
- ``masked_block(anchor, embed, frontier, live, context_k, context_v, final_norm, <11 layer weights>,
  <4 DFlash2 conv weights or None>, mask_token_id, windows, eps, theta, head_dim, variant, num_drafts) -> hidden``
  and ``draft_layer(x, k_cache, v_cache, frontier, live, <weights>, eps, theta, head_dim, window, variant) -> x_next``;
- ``proposal_head(hidden, head, vocab_size, shortlist=None) -> tokens`` (int32);
- ``candidate_topk(hidden, head, vocab_size, top_k, output_multiplier, softcap, shortlist=None) -> (scores, ids)``;
- ``target_distribution(logits, prompt_mask, output_counts, temperature, top_p, min_p, repetition_penalty,
  frequency_penalty, presence_penalty, top_k, vocab_size) -> probs``.

Identity of weights and rings. The fast mode keeps device-resident derived weights (the concatenated [Wq; Wk; Wv],
[Wgate; Wup]) and masked_block / draft_layer's per-shape CUDA graphs keyed by the identity of the arrays they read
in place. A view is a new CuPy object each call, so the weight and ring arguments are converted through a
cache of views keyed by (address, shape, strides, dtype, device) (``_VIEWS_KEEP`` entries, LRU): the same torch
tensor gives the same CuPy object, and its derived weights and graphs are found again. A cached view holds its
tensor alive until the entry leaves the cache. As for the CuPy Ops, a weight must not be written in place after its
first call (its derived copies would not see it); the rings may be written between calls (they are read in place).

Under a ``torch.cuda.graph`` capture the ops launch their kernels into the capture (masked_block / draft_layer then
take the plain launches, not their own graph). Everything CuPy allocates inside an op (outputs, scratch, plans)
comes from torch's caching allocator (``_torch_malloc``), so a capture draws from the graph's private pool: keep the
captured output tensors alive as long as the graph (as torch's static-output idiom does), and replay graphs that
contain these ops on one stream at a time.

torch is optional for kernels_cu: only this module imports it, and importing it without torch raises an ImportError
that says so.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Optional

import numpy as np

try:
    import torch
except ImportError as exc:  # pragma: no cover - exercised where torch is missing
    raise ImportError("kernels_cu.torch_ops needs PyTorch (pip install torch); the CuPy Ops in kernels_cu.fast "
                      "do not") from exc

NAMESPACE = "dflash"
_VIEWS_KEEP = 512

LAYER_NAMES = ("input_norm", "wq", "wk", "wv", "q_norm", "k_norm", "wo", "post_norm", "w_gate", "w_up", "w_down")
CONV_NAMES = ("attn_conv_base", "mlp_conv_base", "attn_conv_proj", "mlp_conv_proj")

_state: dict = {"backend": None, "views": OrderedDict()}


def backend():
    """The FastCudaBackend the ops run on (made at the first call; ``set_backend`` replaces it)."""
    if _state["backend"] is None:
        from kernels_cu.fast import FastCudaBackend

        _state["backend"] = FastCudaBackend()
    return _state["backend"]


def set_backend(b) -> None:
    """Run the ops on ``b`` (a FastCudaBackend, e.g. with other FastOptions); clears the view cache."""
    _state["backend"] = b
    _state["views"].clear()


def _cupy():
    import cupy

    return cupy


# torch dtypes as the CuPy Ops take them (BF16 as its uint16 bits, bool as uint8)
_AS_NUMPY = {torch.bfloat16: np.uint16, torch.float16: np.float16, torch.float32: np.float32,
             torch.float64: np.float64, torch.int64: np.int64, torch.int32: np.int32, torch.int16: np.int16,
             torch.int8: np.int8, torch.uint8: np.uint8, torch.bool: np.uint8}


def _dl(t: torch.Tensor):
    """A CuPy view of a CUDA tensor (BF16 as uint16 bits), zero-copy: an ndarray over the tensor's memory, the
    tensor held as the memory's owner. (DLPack gives the same view at about 20 us a tensor on an H100 host, four
    times this: benchmarks/gpu_bench.py's torch-op rows; it remains the path for an empty tensor or another
    dtype.)"""
    if not t.is_cuda:
        raise ValueError(f"dflash ops take CUDA tensors, got one on {t.device}")
    if not t.is_contiguous():
        t = t.contiguous()
    dtype = _AS_NUMPY.get(t.dtype)
    n = t.numel()
    c = _cupy()
    if dtype is None or n == 0:
        return c.from_dlpack(t)
    mem = c.cuda.UnownedMemory(t.data_ptr(), n * t.element_size(), t, t.get_device())
    return c.ndarray(tuple(t.shape), dtype, c.cuda.MemoryPointer(mem, 0))


def _held(t: Optional[torch.Tensor]):
    """_dl through the view cache (weights and rings: the same tensor, the same CuPy object)."""
    if t is None:
        return None
    key = (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype, t.device.index)
    views = _state["views"]
    v = views.get(key)
    if v is None:
        v = views[key] = _dl(t)
        while len(views) > _VIEWS_KEEP:
            views.popitem(last=False)
    else:
        views.move_to_end(key)
    return v


def _out(a, bf16: bool = False) -> torch.Tensor:
    """A CuPy result as a torch tensor, zero-copy (uint16 BF16 bits as bfloat16)."""
    c = _cupy()
    if bf16:
        return torch.from_dlpack(a.view(c.int16)).view(torch.bfloat16)
    return torch.from_dlpack(a)


def _torch_malloc(size: int):
    """CuPy's allocations inside an op taken from torch's caching allocator (on torch's current stream): one memory
    pool for the engine, and under a ``torch.cuda.graph`` capture the graph's private pool, where a cudaMalloc of
    CuPy's own pool would invalidate the capture. The torch tensor owns the memory until CuPy drops it."""
    c = _cupy()
    dev = torch.cuda.current_device()
    t = torch.empty((max(int(size), 1),), dtype=torch.uint8, device=dev)
    return c.cuda.MemoryPointer(c.cuda.UnownedMemory(t.data_ptr(), int(size), t, dev), 0)


_streams: dict = {}


def _cupy_stream(device: int, handle: int):
    """CuPy's view of torch's stream ``handle`` on ``device``, made once a stream (CuPy 14 deprecates
    ExternalStream with a warning each time one is made; a view of a stream owns nothing)."""
    key = (device, handle)
    s = _streams.get(key)
    if s is None:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            s = _streams[key] = _cupy().cuda.ExternalStream(handle)
    return s


class _on_stream:
    """CuPy's current device and stream set to the tensor's device and torch's current stream there, and CuPy's
    allocator to torch's (``_torch_malloc``)."""

    def __init__(self, t: torch.Tensor):
        self.dev = t.device

    def __enter__(self):
        c = _cupy()
        index = self.dev.index if self.dev.index is not None else torch.cuda.current_device()
        self._d = c.cuda.Device(index)
        self._d.__enter__()
        self._s = _cupy_stream(index, torch.cuda.current_stream(index).cuda_stream)
        self._s.__enter__()
        self._a = c.cuda.using_allocator(_torch_malloc)
        self._a.__enter__()
        return self

    def __exit__(self, *exc):
        self._a.__exit__(*exc)
        self._s.__exit__(*exc)
        self._d.__exit__(*exc)
        return False


def _weights(ts: dict) -> dict:
    return {n: _held(t) for n, t in ts.items() if t is not None}


# --- draft_attention -------------------------------------------------------------------------------------------


@torch.library.custom_op(f"{NAMESPACE}::draft_attention", mutates_args=(), device_types="cuda")
def draft_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    frontier: torch.Tensor, live: torch.Tensor, window: int) -> torch.Tensor:
    with _on_stream(q):
        out = backend().draft_attention(q=_dl(q), k=_dl(k), v=_dl(v), k_cache=_held(k_cache), v_cache=_held(v_cache),
                                        frontier=_dl(frontier), live=_dl(live), window=int(window))["out"]
        return _out(out, bf16=True)


@draft_attention.register_fake
def _(q, k, v, k_cache, v_cache, frontier, live, window):
    return torch.empty(q.shape, dtype=torch.bfloat16, device=q.device)


# --- masked_block / draft_layer ----------------------------------------------------------------------------------


# a draft layer's weight arguments, in the order the ops take them (the conv ones None for DFlash)
LAYER_WEIGHTS = ("input_norm", "wq", "wk", "wv", "q_norm", "k_norm", "wo", "post_norm", "w_gate", "w_up", "w_down",
                 "attn_conv_base", "mlp_conv_base", "attn_conv_proj", "mlp_conv_proj")


@torch.library.custom_op(f"{NAMESPACE}::masked_block", mutates_args=(), device_types="cuda")
def masked_block(anchor: torch.Tensor, embed: torch.Tensor, frontier: torch.Tensor, live: torch.Tensor,
                 context_k: torch.Tensor, context_v: torch.Tensor, final_norm: torch.Tensor,
                 input_norm: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor, wv: torch.Tensor, q_norm: torch.Tensor,
                 k_norm: torch.Tensor, wo: torch.Tensor, post_norm: torch.Tensor, w_gate: torch.Tensor,
                 w_up: torch.Tensor, w_down: torch.Tensor, attn_conv_base: Optional[torch.Tensor],
                 mlp_conv_base: Optional[torch.Tensor], attn_conv_proj: Optional[torch.Tensor],
                 mlp_conv_proj: Optional[torch.Tensor], mask_token_id: int, windows: list[int], eps: float,
                 theta: float, head_dim: int, variant: str, num_drafts: int) -> torch.Tensor:
    args = locals()
    w = _weights({k: args[k] for k in LAYER_WEIGHTS})
    with _on_stream(anchor):
        out = backend().masked_block(anchor=_dl(anchor), embed=_held(embed), frontier=_dl(frontier), live=_dl(live),
                                     context_k=_held(context_k), context_v=_held(context_v),
                                     final_norm=_held(final_norm), mask_token_id=int(mask_token_id),
                                     windows=[int(s) for s in windows], eps=float(eps), theta=float(theta),
                                     head_dim=int(head_dim), variant=variant, num_drafts=int(num_drafts), **w)["hidden"]
        return _out(out, bf16=True)


@masked_block.register_fake
def _(anchor, embed, frontier, live, context_k, context_v, final_norm, input_norm, wq, wk, wv, q_norm, k_norm, wo,
      post_norm, w_gate, w_up, w_down, attn_conv_base, mlp_conv_base, attn_conv_proj, mlp_conv_proj, mask_token_id,
      windows, eps, theta, head_dim, variant, num_drafts):
    if num_drafts < 1:
        raise ValueError(f"masked_block: num_drafts {num_drafts} < 1")
    return torch.empty((anchor.shape[0], num_drafts, embed.shape[1]), dtype=torch.bfloat16, device=anchor.device)


@torch.library.custom_op(f"{NAMESPACE}::draft_layer", mutates_args=(), device_types="cuda")
def draft_layer(x: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, frontier: torch.Tensor,
                live: torch.Tensor, input_norm: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor, wv: torch.Tensor,
                q_norm: torch.Tensor, k_norm: torch.Tensor, wo: torch.Tensor, post_norm: torch.Tensor,
                w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor,
                attn_conv_base: Optional[torch.Tensor], mlp_conv_base: Optional[torch.Tensor],
                attn_conv_proj: Optional[torch.Tensor], mlp_conv_proj: Optional[torch.Tensor], eps: float,
                theta: float, head_dim: int, window: int, variant: str) -> torch.Tensor:
    args = locals()
    w = _weights({k: args[k] for k in LAYER_WEIGHTS})
    with _on_stream(x):
        out = backend().draft_layer(x=_dl(x), k_cache=_held(k_cache), v_cache=_held(v_cache), frontier=_dl(frontier),
                                    live=_dl(live), eps=float(eps), theta=float(theta), head_dim=int(head_dim),
                                    window=int(window), variant=variant, **w)["x_next"]
        return _out(out, bf16=True)


@draft_layer.register_fake
def _(x, k_cache, v_cache, frontier, live, input_norm, wq, wk, wv, q_norm, k_norm, wo, post_norm, w_gate, w_up,
      w_down, attn_conv_base, mlp_conv_base, attn_conv_proj, mlp_conv_proj, eps, theta, head_dim, window, variant):
    return torch.empty(x.shape, dtype=torch.bfloat16, device=x.device)


# --- the head ------------------------------------------------------------------------------------------------


@torch.library.custom_op(f"{NAMESPACE}::proposal_head", mutates_args=(), device_types="cuda")
def proposal_head(hidden: torch.Tensor, head: torch.Tensor, vocab_size: int,
                  shortlist: Optional[torch.Tensor] = None) -> torch.Tensor:
    with _on_stream(hidden):
        out = backend().proposal_head(hidden=_dl(hidden), head=_held(head), vocab_size=int(vocab_size),
                                      shortlist=_held(shortlist))["tokens"]
        return _out(out)


@proposal_head.register_fake
def _(hidden, head, vocab_size, shortlist=None):
    return torch.empty(hidden.shape[:-1], dtype=torch.int32, device=hidden.device)


@torch.library.custom_op(f"{NAMESPACE}::candidate_topk", mutates_args=(), device_types="cuda")
def candidate_topk(hidden: torch.Tensor, head: torch.Tensor, vocab_size: int, top_k: int,
                   output_multiplier: float = 0.0, softcap: float = 0.0,
                   shortlist: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    with _on_stream(hidden):
        r = backend().candidate_topk(hidden=_dl(hidden), head=_held(head), vocab_size=int(vocab_size),
                                     top_k=int(top_k), output_multiplier=float(output_multiplier),
                                     softcap=float(softcap), shortlist=_held(shortlist))
        return _out(r["scores"]), _out(r["ids"])


@candidate_topk.register_fake
def _(hidden, head, vocab_size, top_k, output_multiplier=0.0, softcap=0.0, shortlist=None):
    shape = (*hidden.shape[:-1], int(top_k))
    return (torch.empty(shape, dtype=torch.float32, device=hidden.device),
            torch.empty(shape, dtype=torch.int32, device=hidden.device))


# --- target_distribution ---------------------------------------------------------------------------------------


@torch.library.custom_op(f"{NAMESPACE}::target_distribution", mutates_args=(), device_types="cuda")
def target_distribution(logits: torch.Tensor, prompt_mask: torch.Tensor, output_counts: torch.Tensor,
                        temperature: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor,
                        repetition_penalty: torch.Tensor, frequency_penalty: torch.Tensor,
                        presence_penalty: torch.Tensor, top_k: torch.Tensor, vocab_size: int) -> torch.Tensor:
    with _on_stream(logits):
        out = backend().target_distribution(
            logits=_dl(logits), prompt_mask=_dl(prompt_mask), output_counts=_dl(output_counts),
            temperature=_dl(temperature), top_p=_dl(top_p), min_p=_dl(min_p),
            repetition_penalty=_dl(repetition_penalty), frequency_penalty=_dl(frequency_penalty),
            presence_penalty=_dl(presence_penalty), top_k=_dl(top_k), vocab_size=int(vocab_size))["probs"]
        return _out(out)


@target_distribution.register_fake
def _(logits, prompt_mask, output_counts, temperature, top_p, min_p, repetition_penalty, frequency_penalty,
      presence_penalty, top_k, vocab_size):
    return torch.empty(logits.shape, dtype=torch.float32, device=logits.device)


OPS = ("draft_attention", "masked_block", "draft_layer", "proposal_head", "candidate_topk", "target_distribution")
