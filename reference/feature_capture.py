"""Target feature capture and the context features (spec: "For each processed position t";
CONTRACTS C1, C2).

    s_t = concat(r_t^l for l in target_layer_ids, in recorded order)
    c_t = plain_rmsnorm(W_feature s_t, context_norm)

``block_outputs[l]`` is r^l, the complete residual output of zero-based target block l (after
both residual additions). The ids are block ids, not hidden-state boundaries: an API that counts
the embedding as boundary 0 exposes block l at boundary l + 1, and Hugging Face replaces its last
entry with the final-normed output; neither is r^l. W_feature is ``fc_weight`` (bias-free),
context_norm is ``hidden_norm``. The represented point is ``context`` (BF16). A production
implementation writes the feature GEMM's output in BF16 before the norm kernel: the baseline may
round the named intermediate "projected".
"""

from __future__ import annotations

import numpy as np

from reference import precision as P
from reference.norms import plain_rmsnorm
from reference.precision import inter, represent, work


def feature_capture(block_outputs, fc_weight, hidden_norm, target_layer_ids, eps) -> dict[str, np.ndarray]:
    r = work(block_outputs)
    ids = [int(i) for i in target_layer_ids]
    if any(not 0 <= i < r.shape[0] for i in ids):
        raise ValueError(f"feature_capture: block ids {ids} outside 0..{r.shape[0] - 1}")
    s = np.concatenate([r[i] for i in ids], axis=-1)
    projected = inter(P.matmul(s, work(fc_weight).T), "projected")
    return {"context": represent(plain_rmsnorm(projected, hidden_norm, eps), "bf16")}
