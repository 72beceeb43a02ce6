"""The published draft state-dict layout and adapters to the Ops' keyword inputs (docs/ops.md
"Published state-dict names"; spec: "Source K/V parameters are used for both query-block and
context projections. Their logical roles and Uses remain separate"; CONTRACTS C1, C9).

Names and shapes for a DraftConfig (H hidden, Hq/Hk heads, D head dim, I intermediate,
L = num_hidden_layers, n = len(target_layer_ids), G = H/16, V = cfg.vocab_size head rows):

    layers.N.self_attn.q_proj.weight                [Hq*D, H]
    layers.N.self_attn.{k,v}_proj.weight            [Hk*D, H]
    layers.N.self_attn.o_proj.weight                [H, Hq*D]
    layers.N.self_attn.{q,k}_norm.weight            [D]
    layers.N.mlp.{gate,up}_proj.weight              [I, H]
    layers.N.mlp.down_proj.weight                   [H, I]
    layers.N.{input,post_attention}_layernorm.weight [H]
    norm.weight [H];  fc.weight [H, n*H] (W_feature);  hidden_norm.weight [H] (context_norm)
  DFlash2 only:
    layers.N.{attention,mlp}_conv.base_kernel                 [2 sides, taps, H]
    layers.N.{attention,mlp}_conv.kernel_projection.weight    [2*taps*G, H]
    candidate_selector.hidden_projection.weight               [R, H]
    candidate_selector.predecessor_codebook                   [V, R]   (no .weight suffix)
    candidate_selector.successor_codebook                     [V, R]

The two codebook names are not in docs/ops.md or the spec. They are our assumption, matching the
spelling used by several independent public DFlash2 loaders found by code search (none of them
the upstream reference, which we did not find). The draft has no embedding or LM head: those are
the target's and come in as separate arguments.

Context K/V roles: the published recipes back the context projections W_context_key/value with
the same tensors as the query-block projections (k_proj, v_proj). ``context_kv_inputs`` uses them
by default and takes distinct tensors when given, so a test can tell the roles apart; the
masked-block adapter always reads k_proj / v_proj.

``check_state_dict`` refuses a missing or mis-shaped tensor with a one-line StateDictError naming
the key. Extra keys are ignored (published checkpoints may carry unrelated tensors).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from reference.numerics import storage

SELECTOR_PREFIX = "candidate_selector."
PREDECESSOR = SELECTOR_PREFIX + "predecessor_codebook"  # assumed name, see the module docstring
SUCCESSOR = SELECTOR_PREFIX + "successor_codebook"  # assumed name
HIDDEN_PROJECTION = SELECTOR_PREFIX + "hidden_projection.weight"

# masked_block keyword -> key suffix under layers.N.
LAYER_KEYS = {
    "input_norm": "input_layernorm.weight",
    "wq": "self_attn.q_proj.weight",
    "wk": "self_attn.k_proj.weight",
    "wv": "self_attn.v_proj.weight",
    "q_norm": "self_attn.q_norm.weight",
    "k_norm": "self_attn.k_norm.weight",
    "wo": "self_attn.o_proj.weight",
    "post_norm": "post_attention_layernorm.weight",
    "w_gate": "mlp.gate_proj.weight",
    "w_up": "mlp.up_proj.weight",
    "w_down": "mlp.down_proj.weight",
}
CONV_KEYS = {
    "attn_conv_base": "attention_conv.base_kernel",
    "attn_conv_proj": "attention_conv.kernel_projection.weight",
    "mlp_conv_base": "mlp_conv.base_kernel",
    "mlp_conv_proj": "mlp_conv.kernel_projection.weight",
}


class StateDictError(ValueError):
    """A refused state dict; ``str()`` is one line naming the key."""

    def __init__(self, key: str, problem: str):
        self.key = key
        super().__init__(" ".join(f"state dict: {key}: {problem}".split()))


def layer_key(layer: int, suffix: str) -> str:
    return f"layers.{layer}.{suffix}"


def expected_shapes(cfg) -> dict[str, tuple[int, ...]]:
    """Every tensor the draft reads, with its shape (module docstring)."""
    H, D, inter = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    qd, kd = cfg.num_attention_heads * D, cfg.num_key_value_heads * D
    per_layer = {
        "input_norm": (H,), "wq": (qd, H), "wk": (kd, H), "wv": (kd, H), "q_norm": (D,), "k_norm": (D,),
        "wo": (H, qd), "post_norm": (H,), "w_gate": (inter, H), "w_up": (inter, H), "w_down": (H, inter),
    }
    shapes = {"norm.weight": (H,), "fc.weight": (H, len(cfg.target_layer_ids) * H), "hidden_norm.weight": (H,)}
    for n in range(cfg.num_hidden_layers):
        shapes.update({layer_key(n, LAYER_KEYS[name]): shape for name, shape in per_layer.items()})
    if cfg.variant == "dflash2":
        taps, groups = cfg.conv_kernel_size, H // cfg.conv_group_size
        for n in range(cfg.num_hidden_layers):
            for name, suffix in CONV_KEYS.items():
                shape = (2, taps, H) if name.endswith("base") else (2 * taps * groups, H)
                shapes[layer_key(n, suffix)] = shape
        R = cfg.selector_rank
        shapes.update({HIDDEN_PROJECTION: (R, H), PREDECESSOR: (cfg.vocab_size, R), SUCCESSOR: (cfg.vocab_size, R)})
    return shapes


def check_state_dict(sd: Mapping, cfg) -> None:
    """Refuse a missing or mis-shaped tensor (first one in layout order), naming its key."""
    for key, shape in expected_shapes(cfg).items():
        if key not in sd:
            raise StateDictError(key, f"missing (expected shape {list(shape)})")
        got = tuple(np.shape(sd[key]))
        if got != shape:
            raise StateDictError(key, f"has shape {list(got)}, expected {list(shape)}")


def random_state_dict(cfg, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random BF16 tensors (ml_dtypes.bfloat16) in the published layout for ``cfg``.

    Projections ~ N(0, 1/fan_in) so activations keep unit scale; norm weights near 1; the conv
    base kernel near the identity on tap 0 of both sides (a plain pass-through plus a small
    learned mix) and small projected deltas, so DFlash2 layers stay well conditioned.
    """
    out = {}
    for key, shape in expected_shapes(cfg).items():
        if key.endswith("norm.weight"):  # every RMSNorm weight: layer, head, final and context norms
            x = 1 + 0.1 * rng.standard_normal(shape)
        elif key.endswith("base_kernel"):
            x = 0.1 * rng.standard_normal(shape)
            x[:, 0] += 1
        elif key.endswith("kernel_projection.weight"):
            x = 0.05 * rng.standard_normal(shape) / np.sqrt(shape[1])
        elif key in (PREDECESSOR, SUCCESSOR):
            x = rng.standard_normal(shape)
        else:
            x = rng.standard_normal(shape) / np.sqrt(shape[1])
        out[key] = storage(x, "bf16")
    return out


# --- adapters: state dict -> Op keyword inputs ------------------------------------------------


def feature_capture_inputs(sd: Mapping, cfg) -> dict:
    """feature_capture's weights and params (fc is W_feature, hidden_norm is context_norm)."""
    check_state_dict(sd, cfg)
    return {
        "fc_weight": sd["fc.weight"],
        "hidden_norm": sd["hidden_norm.weight"],
        "target_layer_ids": list(cfg.target_layer_ids),
        "eps": cfg.rms_norm_eps,
    }


def context_kv_inputs(sd: Mapping, cfg, layer: int, context_wk=None, context_wv=None) -> dict:
    """context_kv's weights and params for one draft layer.

    ``context_wk`` / ``context_wv`` ([L, Hk*D, H] or a per-layer sequence) replace the context
    role's projections; absent, the role reads k_proj / v_proj as the published recipes do.
    The key norm is the layer's k_norm either way (spec: "plain_head_rmsnorm(k_raw, key_norm)").
    """
    check_state_dict(sd, cfg)
    kd = cfg.num_key_value_heads * cfg.head_dim
    weights = {}
    for name, override, suffix in (("wk", context_wk, "k_proj"), ("wv", context_wv, "v_proj")):
        key = layer_key(layer, f"self_attn.{suffix}.weight")
        if override is None:
            weights[name] = sd[key]
            continue
        w = override[layer]
        if tuple(np.shape(w)) != (kd, cfg.hidden_size):
            raise StateDictError(f"context {name}[{layer}]", f"has shape {list(np.shape(w))}, "
                                 f"expected {[kd, cfg.hidden_size]}")
        weights[name] = w
    return {
        **weights,
        "k_norm": sd[layer_key(layer, LAYER_KEYS["k_norm"])],
        "eps": cfg.rms_norm_eps,
        "theta": cfg.rope_theta,
        "head_dim": cfg.head_dim,
    }


def masked_block_inputs(sd: Mapping, cfg, embed) -> dict:
    """masked_block's weights (stacked on a leading layer axis), the target embedding and params.

    The query-block K/V projections are always k_proj / v_proj (the block role)."""
    check_state_dict(sd, cfg)
    names = dict(LAYER_KEYS)
    if cfg.variant == "dflash2":
        names.update(CONV_KEYS)
    stacked = {
        name: np.stack([np.asarray(sd[layer_key(n, suffix)]) for n in range(cfg.num_hidden_layers)])
        for name, suffix in names.items()
    }
    return {
        **stacked,
        "embed": embed,
        "final_norm": sd["norm.weight"],
        "mask_token_id": cfg.mask_token_id,
        "windows": list(cfg.windows),
        "eps": cfg.rms_norm_eps,
        "theta": cfg.rope_theta,
        "head_dim": cfg.head_dim,
        "variant": cfg.variant,
        "num_drafts": cfg.K,
    }


def proposal_head_inputs(cfg, head, vocab_size: int) -> dict:
    """DFlash's head is the target's full Text head; nothing comes from the draft state dict."""
    if cfg.variant != "dflash":
        raise ValueError(f"proposal_head is DFlash's head; the config is {cfg.variant}")
    return {"head": head, "vocab_size": int(vocab_size)}


def candidate_topk_inputs(cfg, head, vocab_size: int) -> dict:
    """DFlash2 unary candidates over the target's head, with the config's multiplier / softcap (C4)."""
    if cfg.variant != "dflash2":
        raise ValueError(f"candidate_topk is DFlash2's head; the config is {cfg.variant}")
    return {
        "head": head,
        "vocab_size": int(vocab_size),
        "top_k": cfg.selector_top_k,
        "output_multiplier": cfg.output_multiplier or 0.0,  # None (absent) is off, as 0 is
        "softcap": cfg.final_logit_softcapping or 0.0,
    }


def candidate_selector_inputs(sd: Mapping, cfg) -> dict:
    """The selector's hidden projection and codebooks."""
    if cfg.variant != "dflash2":
        raise ValueError(f"candidate_selector is DFlash2's; the config is {cfg.variant}")
    check_state_dict(sd, cfg)
    return {"w_hidden": sd[HIDDEN_PROJECTION], "w_pred": sd[PREDECESSOR], "w_succ": sd[SUCCESSOR]}
