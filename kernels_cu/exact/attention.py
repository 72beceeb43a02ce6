"""CuPy implementations of the attention-path Ops (docs/ops.md; CONTRACTS C1, C2, C7, C9).

Array convention with the harness: CuPy has no bfloat16 dtype, so a BF16 tensor travels as
its uint16 bit pattern (same shape) in both directions; FP16 as float16, FP32 as float32,
integers as integers. NumPy inputs are accepted too (ml_dtypes.bfloat16 is read as its bits).
A uint16 array is always BF16 bits: FP16 never travels as uint16.

Arithmetic is fp32 throughout (cuBLAS GEMMs through ``cupy.matmul`` on fp32 copies of the
BF16 operands, FP32 accumulation; the custom kernels in kernels_cu/*.cu). BF16/FP16 appear
only at the represented points of reference/*.py, rounded once from fp32 with the CUDA
intrinsics. Intermediates the reference keeps at float64 stay fp32 here, which the C2
baseline bound (BF16 at the registry's named intermediates, fp32 elsewhere) covers.
"""

from __future__ import annotations

import math

import numpy as np

from kernels_cu.loader import load_module

_THREADS = 256
_NULL = np.uint64(0)  # a null pointer argument: kernels test it before use
_MAX_HEAD_DIM = 256  # attention.cu ATT_MAXC * 32
_MAX_GRID = 65535 * 8


def cp():
    import cupy

    return cupy


def _fn(module: str, name: str):
    return load_module(module).get_function(name)


def _grid(n: int) -> tuple[int]:
    return (max(1, min((n + _THREADS - 1) // _THREADS, _MAX_GRID)),)


def device(a):
    """A C-contiguous CuPy array; NumPy bfloat16 arrives as its uint16 bits."""
    if isinstance(a, np.ndarray) and a.dtype.name == "bfloat16":
        a = a.view(np.uint16)
    return cp().ascontiguousarray(cp().asarray(a))


def f32(a):
    """fp32 CuPy array of a BF16 (uint16 bits), FP16 or float tensor; exact for BF16/FP16."""
    a = device(a)
    if a.dtype == np.uint16:
        out = cp().empty(a.shape, dtype=np.float32)
        _fn("exact/norm_rope", "bf16_to_f32_kernel")(_grid(a.size), (_THREADS,), (a, out, np.int64(a.size)))
        return out
    return a.astype(np.float32, copy=False)


def bf16_bits(a):
    """uint16 BF16 bits: uint16 passes through; floats are rounded RNE from fp32."""
    a = device(a)
    return a if a.dtype == np.uint16 else round_bf16(a.astype(np.float32, copy=False))


def f16_bits(a):
    """uint16 FP16 bits of an FP16 tensor (a uint16 input is BF16 bits, rounded to FP16)."""
    a = device(a)
    if a.dtype == np.float16:
        return a.view(np.uint16)
    x = f32(a)
    out = cp().empty(x.shape, dtype=np.uint16)
    _fn("exact/norm_rope", "f32_to_f16_kernel")(_grid(x.size), (_THREADS,), (x, out, np.int64(x.size)))
    return out


def round_bf16(x):
    """The represented BF16 point of an fp32 CuPy array, as uint16 bits (RNE, once)."""
    x = cp().ascontiguousarray(x, dtype=np.float32)
    out = cp().empty(x.shape, dtype=np.uint16)
    _fn("exact/norm_rope", "f32_to_bf16_kernel")(_grid(x.size), (_THREADS,), (x, out, np.int64(x.size)))
    return out


def bf16_value(bits):
    """fp32 values of BF16 bits (the represented value, for the next fp32 stage)."""
    return f32(bits)


def linear(x, w):
    """x [..., in] @ w[out, in].T in fp32 (cuBLAS, FP32 accumulation; CuPy uses no TF32
    unless CUPY_TF32=1, which environment() records)."""
    lead = x.shape[:-1]
    y = cp().matmul(x.reshape(-1, x.shape[-1]), w.T)
    return y.reshape(*lead, w.shape[0])


def inv_freq(head_dim: int, theta: float):
    """RoPE frequencies theta^(-2i/D), i < D/2, in float64 (spec rope_1d)."""
    if head_dim % 2:
        raise ValueError(f"RoPE needs an even head_dim, got {head_dim}")
    i = np.arange(head_dim // 2, dtype=np.float64)
    return cp().asarray(float(theta) ** (-i * 2.0 / head_dim))


def rmsnorm(x, w, eps: float, *, f32_out=True, bf16_out=False):
    """plain_rmsnorm over the last axis of fp32 x; returns (fp32 or None, bf16 bits or None)."""
    x = cp().ascontiguousarray(x, dtype=np.float32)
    h = x.shape[-1]
    rows = x.size // h
    of = cp().empty(x.shape, dtype=np.float32) if f32_out else None
    ob = cp().empty(x.shape, dtype=np.uint16) if bf16_out else None
    _fn("exact/norm_rope", "rmsnorm_rows")(
        (rows,), (_THREADS,),
        (x, w, np.int32(rows), np.int32(h), np.float32(eps), _NULL if of is None else of, _NULL if ob is None else ob),
    )
    return of, ob


def head_norm_rope(x, w, eps: float, positions, freqs, head_dim: int, *, rope=True):
    """Head RMSNorm (+ RoPE) of fp32 x [rows, heads*D] at int64 positions [rows] -> fp32."""
    rows = positions.size
    x = cp().ascontiguousarray(x.reshape(rows, -1), dtype=np.float32)
    heads = x.shape[1] // head_dim
    out = cp().empty(x.shape, dtype=np.float32)
    block = 32 * math.ceil(head_dim / 32)
    _fn("exact/norm_rope", "head_norm_rope_rows")(
        (rows * heads,), (block,),
        (x, w, freqs, cp().ascontiguousarray(positions, dtype=np.int64), np.int32(rows), np.int32(heads),
         np.int32(head_dim), np.float32(eps), np.int32(1 if rope else 0), out, _NULL),
        shared_mem=4 * head_dim,
    )
    return out


def silu_mul(gate, up):
    out = cp().empty(gate.shape, dtype=np.float32)
    _fn("exact/norm_rope", "silu_mul")(_grid(gate.size), (_THREADS,), (gate, up, out, np.int64(gate.size)))
    return out


_GQA_WARPS, _GQA_GMAX, _GQA_MAX_GD = 4, 8, 1024  # attention.cu draft_attention_gqa limits


# None: choose per geometry (attention_kernel); a kernel name forces it everywhere (tests run both)
ATTENTION_KERNEL: str | None = None


def attention_kernel(hq: int, hk: int, d: int) -> str:
    """draft_attention_gqa (K/V read once per KV head) where its register tiles fit and its
    8-byte shared-memory slots stay aligned (even D), else draft_attention_fwd."""
    g = hq // hk
    fits = g <= _GQA_GMAX and g * d <= _GQA_MAX_GD and d % 2 == 0
    return "draft_attention_gqa" if fits else "draft_attention_fwd"


def attention(q, k, v, kc_bits, vc_bits, frontier, live, window: int, *, f32_out=True, bf16_out=False, kernel=None):
    """fp32 q [B,W,Hq,D], k/v [B,W,Hk,D]; caches [B,C,Hk,D] as BF16 / FP16 bits.
    ``kernel`` forces draft_attention_fwd or draft_attention_gqa (tests run both)."""
    b, w, hq, d = q.shape
    hk, c = k.shape[2], kc_bits.shape[1]
    if d > _MAX_HEAD_DIM:
        raise ValueError(f"draft_attention: head_dim {d} > {_MAX_HEAD_DIM} is not supported by attention.cu")
    if hq % hk:
        raise ValueError(f"draft_attention: {hq} query heads are not a multiple of {hk} KV heads")
    if c < 1:
        raise ValueError("draft_attention: the context cache needs capacity >= 1 (slot p mod C)")
    of = cp().zeros(q.shape, dtype=np.float32) if f32_out else None
    ob = cp().zeros(q.shape, dtype=np.uint16) if bf16_out else None
    kernel = kernel or ATTENTION_KERNEL or attention_kernel(hq, hk, d)
    if kc_bits.data.ptr % 16:  # the gqa kernel reads K rows as 16-byte vectors: a caller's offset view is copied
        kc_bits = kc_bits.copy()
    args = (cp().ascontiguousarray(q, dtype=np.float32), cp().ascontiguousarray(k, dtype=np.float32),
            cp().ascontiguousarray(v, dtype=np.float32), cp().ascontiguousarray(kc_bits),
            cp().ascontiguousarray(vc_bits), cp().ascontiguousarray(frontier, dtype=np.int64),
            cp().ascontiguousarray(live, dtype=np.int32), np.int32(w), np.int32(hq), np.int32(hk), np.int32(d),
            np.int64(c), np.int64(window), np.float32(1.0 / math.sqrt(d)), _NULL if of is None else of,
            _NULL if ob is None else ob)
    if kernel == "draft_attention_fwd":
        _fn("exact/attention", kernel)((b * w * hq,), (256,), args)
    elif kernel == "draft_attention_gqa":
        g = hq // hk
        if attention_kernel(hq, hk, d) != kernel:
            raise ValueError(f"draft_attention_gqa needs Hq/Hk <= {_GQA_GMAX}, Hq/Hk * D <= {_GQA_MAX_GD}, even D")
        # exact-group specialisations (compile-time G, D <= 128) where one exists, else the generic one
        name = f"draft_attention_gqa_g{g}_c4" if g in (1, 2, 4, 8) and d <= 128 else kernel
        floats = g * d + _GQA_WARPS * g * 32 + 2 * _GQA_WARPS * 32 + 2 * _GQA_WARPS * g + _GQA_WARPS * g * d
        _fn("exact/attention", name)((b * w * hk,), (32 * _GQA_WARPS,), args, shared_mem=4 * floats)
    else:
        raise ValueError(f"unknown attention kernel {kernel!r}")
    return of, ob


def conv_prepare(x, base, proj):
    """DFlash2 input side on fp32 x [B,W,H]: (prepared bits, prepared fp32 value, finish_delta bits)."""
    b, w, h = x.shape
    if h % 16:
        raise ValueError(f"grouped_conv: hidden width {h} is not a multiple of 16")
    delta = cp().ascontiguousarray(linear(x, proj))  # [B, W, 4G] fp32
    pb = cp().empty(x.shape, dtype=np.uint16)
    pf = cp().empty(x.shape, dtype=np.float32)
    fd = cp().empty((b, w, 2, h // 16), dtype=np.uint16)
    x = cp().ascontiguousarray(x, dtype=np.float32)
    _fn("exact/grouped_conv", "conv_prepare")(
        _grid(x.size), (_THREADS,), (x, delta, base, np.int32(w), np.int64(b * w), np.int32(h), pb, pf, fd)
    )
    return pb, pf, fd


def conv_finish(z, base, finish_delta, residual=None, *, bf16_out=True):
    """DFlash2 output side: (residual + BF16(Conv_1(z)) fp32, its BF16 bits)."""
    b, w, h = z.shape
    of = cp().empty(z.shape, dtype=np.float32)
    ob = cp().empty(z.shape, dtype=np.uint16) if bf16_out else None
    _fn("exact/grouped_conv", "conv_finish")(
        _grid(z.size), (_THREADS,),
        (cp().ascontiguousarray(z, dtype=np.float32), finish_delta, base, np.int32(w), np.int64(b * w), np.int32(h),
         _NULL if residual is None else cp().ascontiguousarray(residual, dtype=np.float32), of,
         _NULL if ob is None else ob),
    )
    return of, ob


def _layer_weights(kw: dict, variant: str) -> dict:
    names = ["input_norm", "wq", "wk", "wv", "q_norm", "k_norm", "wo", "post_norm", "w_gate", "w_up", "w_down"]
    if variant == "dflash2":
        names += ["attn_conv_base", "mlp_conv_base", "attn_conv_proj", "mlp_conv_proj"]
    missing = [n for n in names if kw.get(n) is None]
    if missing:
        raise ValueError(f"draft_layer ({variant}): missing inputs {missing}")
    return {n: f32(kw[n]) for n in names}


def layer_forward(x, kc_bits, vc_bits, frontier, live, wt: dict, eps, theta, head_dim, window, variant):
    """One draft layer on fp32 x [B,W,H] -> fp32 x_next before its represented rounding
    (reference/draft_layer.py forward; DFlash2 finish outputs are BF16 before the residual)."""
    if variant not in ("dflash", "dflash2"):
        raise ValueError(f"draft_layer: variant must be 'dflash' or 'dflash2', got {variant!r}")
    conv = variant == "dflash2"
    b, w, _ = x.shape
    pos = (frontier[:, None] + cp().arange(w, dtype=np.int64)[None, :]).reshape(-1)
    freqs = inv_freq(head_dim, theta)

    n, _ = rmsnorm(x, wt["input_norm"], eps)
    if conv:
        _, n, finish_a = conv_prepare(n, wt["attn_conv_base"], wt["attn_conv_proj"])
    q = head_norm_rope(linear(n, wt["wq"]), wt["q_norm"], eps, pos, freqs, head_dim).reshape(b, w, -1, head_dim)
    k = head_norm_rope(linear(n, wt["wk"]), wt["k_norm"], eps, pos, freqs, head_dim).reshape(b, w, -1, head_dim)
    v = linear(n, wt["wv"]).reshape(b, w, -1, head_dim)
    a, _ = attention(q, k, v, kc_bits, vc_bits, frontier, live, int(window))
    o = linear(a.reshape(b, w, -1), wt["wo"])
    y = conv_finish(o, wt["attn_conv_base"], finish_a, x, bf16_out=False)[0] if conv else x + o

    m, _ = rmsnorm(y, wt["post_norm"], eps)
    if conv:
        _, m, finish_m = conv_prepare(m, wt["mlp_conv_base"], wt["mlp_conv_proj"])
    z = linear(silu_mul(linear(m, wt["w_gate"]), linear(m, wt["w_up"])), wt["w_down"])
    if conv:
        return conv_finish(z, wt["mlp_conv_base"], finish_m, y, bf16_out=False)[0]
    return y + z


def capture_ids(blocks, target_layer_ids) -> list[int]:
    """feature_capture's block ids as ints, each naming one of the blocks (one-line error otherwise)."""
    lt = blocks.shape[0]
    ids = [int(i) for i in target_layer_ids]
    if not ids or any(not 0 <= i < lt for i in ids):
        raise ValueError(f"feature_capture: block ids {ids} outside 0..{lt - 1}")
    return ids


class AttentionOps:
    """Methods for feature_capture, context_kv, draft_attention, draft_layer, masked_block,
    proposal_head and grouped_conv (CONTRACTS C9: keyword arguments named as docs/ops.md,
    a dict of outputs back)."""

    def feature_capture(self, *, block_outputs, fc_weight, hidden_norm, target_layer_ids, eps):
        blocks = bf16_bits(block_outputs)
        _, t, ht = blocks.shape
        ids = capture_ids(blocks, target_layer_ids)
        s = cp().empty((t, len(ids) * ht), dtype=np.float32)
        _fn("exact/norm_rope", "gather_concat_bf16")(
            _grid(s.size), (_THREADS,),
            (blocks, cp().asarray(ids, dtype=np.int32), np.int32(len(ids)), np.int64(t), np.int32(ht), s),
        )
        projected = linear(s, f32(fc_weight))
        _, context = rmsnorm(projected, f32(hidden_norm), eps, f32_out=False, bf16_out=True)
        return {"context": context}

    def context_kv(self, *, context, k_cache, v_cache, wk, wv, k_norm, start, eps, theta, head_dim,
                   storage="ring", page_size=None, page_table=None):
        c = f32(context)
        t = c.shape[0]
        start = int(start)
        if start < 0:
            raise ValueError(f"context_kv: start {start} < 0")
        kc = bf16_bits(k_cache).copy()  # outputs are new arrays: the caller's caches stay as given
        vc = f16_bits(v_cache).copy()
        first, paged, psize, hk, capacity, table = cache_layout(storage, kc, start, t, page_size, page_table)
        if t > first:
            # K feeds RoPE, whose split-half rotation cancels deeply at some elements of a 4096-row
            # chunk: a plain FP32 GEMM over H = 2048 left 5 FP32 ulps of absolute error there (157
            # BF16 ulps at one element against a 37-ulp bound, H200 2026-11-29). FP64 accumulation
            # costs ~17 GFLOP at the 35B geometry (well under a millisecond on the H200) and leaves
            # only the final FP32 rounding, as the contract's unrounded raw K asks (C1).
            k_raw = cp().ascontiguousarray(linear(c[first:].astype(np.float64), f32(wk).astype(np.float64)),
                                           dtype=np.float32)
            v_raw = cp().ascontiguousarray(linear(c[first:], f32(wv)))
            # rows before `first` are not projected; the kernel's row index is offset back
            _fn("exact/context_kv", "context_kv_write")(
                ((t - first) * hk,), (32 * math.ceil(head_dim / 32),),
                (k_raw, v_raw, f32(k_norm), inv_freq(head_dim, theta), np.float32(eps), np.int64(start + first),
                 np.int32(0), np.int32(hk), np.int32(head_dim), np.int32(paged), np.int64(capacity),
                 np.int32(psize), table, kc, vc),
                shared_mem=4 * head_dim,
            )
        return {"k_cache": kc, "v_cache": vc.view(np.float16), "frontier": cp().asarray(start + t, dtype=np.int64)}

    def draft_attention(self, *, q, k, v, k_cache, v_cache, frontier, live, window=0):
        _, out = attention(f32(q), f32(k), f32(v), bf16_bits(k_cache), f16_bits(v_cache), device(frontier),
                           device(live), int(window), f32_out=False, bf16_out=True)
        return {"out": out}

    def draft_layer(self, *, x, k_cache, v_cache, frontier, live, eps, theta, head_dim, window=0,
                    variant="dflash", **weights):
        wt = _layer_weights(weights, variant)
        x_next = layer_forward(f32(x), bf16_bits(k_cache), f16_bits(v_cache), device(frontier).astype(np.int64),
                               device(live), wt, eps, theta, int(head_dim), int(window), variant)
        return {"x_next": round_bf16(x_next)}

    def masked_block(self, *, anchor, embed, frontier, live, context_k, context_v, final_norm, mask_token_id,
                     windows, eps, theta, head_dim, variant="dflash", num_drafts, **weights):
        stacked = _layer_weights(weights, variant)
        n_layers = len(windows)
        ck, cv = bf16_bits(context_k), f16_bits(context_v)
        if ck.shape[0] != n_layers or stacked["wq"].shape[0] != n_layers:
            raise ValueError(f"masked_block: {n_layers} windows, {ck.shape[0]} rings, {stacked['wq'].shape[0]} layers")
        anchor = device(anchor).astype(np.int64)
        bsz, width = anchor.shape[0], int(num_drafts) + 1
        tokens = cp().full((bsz, width), int(mask_token_id), dtype=np.int64)
        tokens[:, 0] = anchor
        # gather the bits first: the embedding table may be far larger than the block
        x = f32(device(embed)[tokens])  # [B, W, H]; the anchor column is the committed token, not MASK
        frontier = device(frontier).astype(np.int64)
        # DFlash attends only the live columns; DFlash2 computes all W (spec extent table)
        attn_live = device(live).astype(np.int32) if variant == "dflash" else cp().full(bsz, width, dtype=np.int32)
        for layer, window in enumerate(windows):
            wt = {name: w[layer] for name, w in stacked.items()}
            # the residual stream stays fp32 between layers: the reference rounds only `hidden`
            x = layer_forward(x, ck[layer], cv[layer], frontier, attn_live, wt, eps, theta, int(head_dim),
                              int(window), variant)
        _, hidden = rmsnorm(cp().ascontiguousarray(x[:, 1:]), f32(final_norm), eps, f32_out=False, bf16_out=True)
        return {"hidden": hidden}

    def grouped_conv(self, *, x, z, base, proj):
        bw = f32(base)
        prepared, _, finish_delta = conv_prepare(f32(x), bw, f32(proj))
        _, finished = conv_finish(f32(z), bw, finish_delta)
        return {"prepared": prepared, "finish_delta": finish_delta, "finished": finished}


def cache_layout(storage: str, kc, start: int, t: int, page_size, page_table):
    """context_kv's cache geometry, checked: (first row written, paged flag, page size, K heads, ring
    capacity, device page table or null). A ring keeps only the final C of t rows (C7)."""
    if storage == "ring":
        capacity, hk = kc.shape[0], kc.shape[1]
        return max(0, t - capacity), 0, 1, hk, capacity, _NULL
    if storage != "paged":
        raise ValueError(f"context_kv: storage must be 'ring' or 'paged', got {storage!r}")
    if page_size is None or page_table is None:
        raise ValueError("context_kv: paged storage needs page_size and page_table")
    psize, hk = int(page_size), kc.shape[2]
    if kc.shape[1] != psize:
        raise ValueError(f"context_kv: cache pages hold {kc.shape[1]} rows, page_size is {psize}")
    table = device(page_table).astype(np.int32, copy=False)
    if t and (start + t - 1) // psize >= table.size:
        raise ValueError(f"context_kv: positions up to {start + t - 1} exceed the page table ({table.size})")
    return 0, 1, psize, hk, 0, table
