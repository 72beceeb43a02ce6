"""The masked draft block: one forward proposing K tokens (spec: "The draft input is the target
embedding of", the layer sections and "After all layers, final plain RMSNorm"; CONTRACTS C1, C2, C7).

    column     0       1      ...  K            (W = K + 1 = num_drafts + 1)
    position   F       F+1    ...  F+K
    token      anchor  MASK   ...  MASK
    x = embed[token];  x = draft_layer_l(x) for each layer l (window windows[l], 0 = full)
    hidden = plain_rmsnorm(x, final_norm)[:, 1:]          mask columns only

Extent (spec table "Proposal attention/masked input"): DFlash attends only the live = P+1 block
columns, so columns >= live influence nothing that is compared; DFlash2 always computes all W
columns (its attention sees every block row) and ``live`` only says which columns are compared.
Mask column i (block column i+1) is compared when i+1 < live.

``num_drafts`` (K) is a param: no input has a W axis. The layer weights are draft_layer's, stacked
on a leading L axis; context_k / context_v [L, B, C, Hk, D] are each layer's context ring. Between
layers the residual stream is a named intermediate "x" (BF16 in the baseline, as a production
stack stores it); the only represented point is ``hidden``.
"""

from __future__ import annotations

import numpy as np

from reference.backend import portable, xp
from reference.draft_layer import BF16_INTERMEDIATES as LAYER_BF16
from reference.draft_layer import forward
from reference.norms import plain_rmsnorm
from reference.precision import inter, represent, work

BF16_INTERMEDIATES = LAYER_BF16 | {"x"}
LAYER_WEIGHTS = ("input_norm", "wq", "wk", "wv", "q_norm", "k_norm", "wo", "post_norm", "w_gate", "w_up", "w_down")
CONV_WEIGHTS = ("attn_conv_base", "mlp_conv_base", "attn_conv_proj", "mlp_conv_proj")


def block_tokens(anchor, mask_token_id: int, num_drafts: int) -> np.ndarray:
    """[B, W] input tokens: the anchor, then K MASK tokens."""
    anchor = xp.asarray(anchor, dtype=np.int64)
    tokens = xp.full((anchor.shape[0], num_drafts + 1), int(mask_token_id), dtype=np.int64)
    tokens[:, 0] = anchor
    return tokens


@portable
def masked_block(
    anchor, embed, frontier, live, context_k, context_v, input_norm, wq, wk, wv, q_norm, k_norm, wo, post_norm,
    w_gate, w_up, w_down, final_norm, mask_token_id, windows, eps, theta, head_dim, variant, num_drafts,
    attn_conv_base=None, mlp_conv_base=None, attn_conv_proj=None, mlp_conv_proj=None,
) -> dict[str, np.ndarray]:
    """The Op: ``hidden`` [B, K, H], represented BF16."""
    stacked = dict(zip(LAYER_WEIGHTS, (input_norm, wq, wk, wv, q_norm, k_norm, wo, post_norm, w_gate, w_up, w_down)))
    if variant == "dflash2":
        stacked.update(zip(CONV_WEIGHTS, (attn_conv_base, mlp_conv_base, attn_conv_proj, mlp_conv_proj)))
    if len(windows) != len(wq) or len(context_k) != len(wq):
        raise ValueError(f"masked_block: {len(windows)} windows and {len(context_k)} rings for {len(wq)} layers")
    # the gather before the cast: the same values, without a float64 copy of the whole table
    x = work(xp.asarray(embed)[block_tokens(anchor, mask_token_id, int(num_drafts))])
    width = x.shape[1]
    attn_live = xp.asarray(live) if variant == "dflash" else xp.full(x.shape[0], width)
    for layer, window in enumerate(windows):
        weights = {name: w[layer] for name, w in stacked.items()}
        x = inter(
            forward(
                x, context_k[layer], context_v[layer], frontier, attn_live, eps=eps, theta=theta,
                head_dim=head_dim, window=int(window), variant=variant, **weights,
            ),
            "x",
        )
    return {"hidden": represent(plain_rmsnorm(x, final_norm, eps)[:, 1:], "bf16")}
