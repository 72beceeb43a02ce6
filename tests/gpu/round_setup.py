"""A FastRound loaded with random full-width weights of one official geometry, and one round's inputs, built on the
device with CuPy (the GPU tests that need a drafter at a real geometry: the committed round vectors are tiny)."""

from __future__ import annotations

import numpy as np


def _bf16_bits(cp, x):
    """uint16 BF16 bits of an fp32 CuPy array (round to nearest even: the random values need no more)."""
    u = x.astype(cp.float32).view(cp.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(cp.uint16)


def random_round(cp, cfg, *, seed: int = 0):
    """(FastRound loaded with random weights of ``cfg`` (reference.config preset), vocab_size): Gaussian projections
    scaled by the fan-in, gains in [0.5, 1.5), a DFlash head (DFlash2 adds its selector codebooks)."""
    from conformance.geometry import PUBLIC_VOCAB_MARGIN
    from kernels_cu.fast.round import FastRound

    rng = cp.random.default_rng(seed)
    L, h, inter = cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size
    hq, hk, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim

    def gauss(shape, scale):
        return _bf16_bits(cp, rng.standard_normal(shape, dtype=cp.float32) * np.float32(scale))

    def gain(shape):
        return _bf16_bits(cp, rng.random(shape, dtype=cp.float32) + np.float32(0.5))

    w = {"input_norm": gain((L, h)), "wq": gauss((L, hq * d, h), h**-0.5), "wk": gauss((L, hk * d, h), h**-0.5),
         "wv": gauss((L, hk * d, h), h**-0.5), "q_norm": gain((L, d)), "k_norm": gain((L, d)),
         "wo": gauss((L, h, hq * d), (hq * d) ** -0.5), "post_norm": gain((L, h)),
         "w_gate": gauss((L, inter, h), h**-0.5), "w_up": gauss((L, inter, h), h**-0.5),
         "w_down": gauss((L, h, inter), inter**-0.5)}
    extra = {}
    if cfg.variant == "dflash2":
        for side in ("attn", "mlp"):
            base = cp.empty((L, 2, 2, h), cp.float32)
            base[:, :, 0] = 1.0 + 0.2 * rng.standard_normal((L, 2, h), dtype=cp.float32)
            base[:, :, 1] = 0.5 * rng.standard_normal((L, 2, h), dtype=cp.float32)
            w[f"{side}_conv_base"] = _bf16_bits(cp, base)
            w[f"{side}_conv_proj"] = gauss((L, 4 * (h // 16), h), 0.2 * h**-0.5)
        r = cfg.selector_rank
        extra = {"top_k": cfg.selector_top_k, "w_hidden": gauss((r, h), h**-0.5),
                 "w_pred": gauss((cfg.vocab_size, r), 1.0), "w_succ": gauss((cfg.vocab_size, r), 1.0)}
    vocab = cfg.vocab_size - PUBLIC_VOCAB_MARGIN
    fr = FastRound()
    fr.load(variant=cfg.variant, weights=w, embed=gauss((cfg.vocab_size, h), 1.0), final_norm=gain((h,)),
            head=gauss((cfg.vocab_size, h), h**-0.5), vocab_size=vocab, windows=list(cfg.windows),
            eps=cfg.rms_norm_eps, theta=cfg.rope_theta, head_dim=d, mask_token_id=cfg.mask_token_id, **extra)
    return fr, vocab


def random_round_inputs(cp, cfg, b: int, w: int, context: int, *, seed: int = 1) -> dict:
    """FastRound.step's keywords for one round at (B, W, context): rings at the geometry's capacity, frontiers
    context - 3 b, DFlash live tails across rows, random anchors below the public vocabulary, temperature 0."""
    from conformance.geometry import PUBLIC_VOCAB_MARGIN, _capacity

    rng = cp.random.default_rng(seed)
    L, hk, d = cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim
    vocab, cap = cfg.vocab_size - PUBLIC_VOCAB_MARGIN, _capacity(cfg, context)
    frontier = context - 3 * cp.arange(b, dtype=cp.int64)
    if cfg.variant == "dflash":
        live = cp.maximum(w - cp.arange(b) % 4, 1).astype(cp.int32)
    else:
        live = cp.full((b,), w, dtype=cp.int32)
    kc = _bf16_bits(cp, rng.standard_normal((L, b, cap, hk, d), dtype=cp.float32))
    vc = cp.abs(rng.standard_normal((L, b, cap, hk, d), dtype=cp.float32)).astype(cp.float16)
    anchor = rng.integers(0, vocab, (b,), dtype=cp.int32)
    return {"anchor": anchor, "frontier": frontier, "live": live, "context_k": kc, "context_v": vc,
            "num_drafts": w - 1, "temperature": cp.zeros(b, cp.float32), "seed": cp.arange(b, dtype=cp.uint64)}
