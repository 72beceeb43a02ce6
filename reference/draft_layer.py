"""One draft layer (spec: "Each layer uses plain RMSNorm, full-head Q/K normalization and scalar
RoPE" and "Each DFlash2 layer performs"; CONTRACTS C1, C2, C7).

DFlash, block columns at positions F + i:

    n = plain_rmsnorm(x, input_norm)
    q = rope_1d(plain_head_rmsnorm(W_query n, query_norm), positions)
    k = rope_1d(plain_head_rmsnorm(W_key n, key_norm), positions)
    v = W_value n
    a = attention(q, concat(K_ctx,k), concat(V_ctx,v), scale=1/sqrt(D), layer_mask)
    y = x + W_output a
    m = plain_rmsnorm(y, post_attention_norm)
    x_next = y + W_down(SiLU(W_gate m) * (W_up m))

DFlash2 wraps both branches in the grouped convolution (reference.grouped_conv):

    (prepared_a, finish_delta_a) = attention_conv.prepare(n);  q, k, v from prepared_a
    y = x + attention_conv.finish(W_output a, finish_delta_a)
    (prepared_m, finish_delta_m) = mlp_conv.prepare(m)
    x_next = y + mlp_conv.finish(W_down(SiLU(W_gate prepared_m) * (W_up prepared_m)), finish_delta_m)

The mask and the attention are reference.draft_attention's (live block rows only). The only
represented point of the layer is x_next (BF16). A production layer is a chain of kernels that
store every tensor between them in BF16; the baseline may round at these named intermediates:
n, q_proj, k_proj, v_proj (GEMM outputs), q, k (after head norm and RoPE), probs (inside
attention), attn, o_proj, y (the residual stream), m, gate, up, act (SiLU(gate) * up), down.
DFlash2 never rounds n or m: its fused prepare keeps the normalized input private and emits the
represented prepared input instead.
"""

from __future__ import annotations

import numpy as np

from reference import grouped_conv
from reference import precision as P
from reference.backend import portable, xp
from reference.draft_attention import attend
from reference.norms import plain_head_rmsnorm, plain_rmsnorm, rope_1d, silu
from reference.precision import inter, represent, work

BF16_INTERMEDIATES = frozenset(
    {"n", "q_proj", "k_proj", "v_proj", "q", "k", "probs", "attn", "o_proj", "y", "m", "gate", "up", "act", "down",
     "attn_conv_out", "mlp_conv_out"}
)


def _proj(x, w, name: str) -> np.ndarray:
    return inter(P.matmul(x, work(w).T), name)


def forward(
    x, k_cache, v_cache, frontier, live, input_norm, wq, wk, wv, q_norm, k_norm, wo, post_norm, w_gate, w_up,
    w_down, eps, theta, head_dim, window, variant,
    attn_conv_base=None, mlp_conv_base=None, attn_conv_proj=None, mlp_conv_proj=None,
) -> np.ndarray:
    """x_next [B, W, H] before its represented rounding (masked_block chains this)."""
    if variant not in ("dflash", "dflash2"):
        raise ValueError(f"draft_layer: variant must be 'dflash' or 'dflash2', got {variant!r}")
    conv = variant == "dflash2"
    x = work(x)
    b, w, _ = x.shape
    positions = xp.asarray(frontier, dtype=np.int64)[:, None] + xp.arange(w, dtype=np.int64)

    # DFlash2's fused prepare keeps the normalized input private; only its outputs are BF16
    n = plain_rmsnorm(x, input_norm, eps)
    if conv:
        n, finish_a = grouped_conv.prepare(n, attn_conv_base, attn_conv_proj)
    else:
        n = inter(n, "n")
    # [B, W, heads, D] before the head norm: with one KV head the flat width equals D
    q = _proj(n, wq, "q_proj").reshape(b, w, -1, head_dim)
    k = _proj(n, wk, "k_proj").reshape(b, w, -1, head_dim)
    v = _proj(n, wv, "v_proj").reshape(b, w, -1, head_dim)
    q = inter(rope_1d(plain_head_rmsnorm(q, q_norm, eps, head_dim), positions, theta), "q")
    k = inter(rope_1d(plain_head_rmsnorm(k, k_norm, eps, head_dim), positions, theta), "k")
    a = inter(attend(q, k, v, k_cache, v_cache, frontier, live, int(window)), "attn").reshape(b, w, -1)
    o = _proj(a, wo, "o_proj")
    if conv:
        o = inter(grouped_conv.finish_raw(o, attn_conv_base, finish_a), "attn_conv_out")
    y = inter(x + o, "y")

    m = plain_rmsnorm(y, post_norm, eps)
    if conv:
        m, finish_m = grouped_conv.prepare(m, mlp_conv_base, mlp_conv_proj)
    else:
        m = inter(m, "m")
    act = inter(silu(_proj(m, w_gate, "gate")) * _proj(m, w_up, "up"), "act")
    z = _proj(act, w_down, "down")
    if conv:
        z = inter(grouped_conv.finish_raw(z, mlp_conv_base, finish_m), "mlp_conv_out")
    return y + z


@portable
def draft_layer(
    x, k_cache, v_cache, frontier, live, input_norm, wq, wk, wv, q_norm, k_norm, wo, post_norm, w_gate, w_up,
    w_down, eps, theta, head_dim, window, variant,
    attn_conv_base=None, mlp_conv_base=None, attn_conv_proj=None, mlp_conv_proj=None,
) -> dict[str, np.ndarray]:
    """The Op: ``x_next`` [B, W, H], represented BF16 (rows < live compared)."""
    x_next = forward(
        x, k_cache, v_cache, frontier, live, input_norm, wq, wk, wv, q_norm, k_norm, wo, post_norm, w_gate, w_up,
        w_down, eps, theta, head_dim, window, variant, attn_conv_base, mlp_conv_base, attn_conv_proj, mlp_conv_proj,
    )
    return {"x_next": represent(x_next, "bf16")}
