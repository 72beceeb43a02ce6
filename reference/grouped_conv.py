"""DFlash2 dynamic grouped convolution (spec: "DFlash2 adds a dynamic grouped
convolution"; CONTRACTS C1 for the represented points).

For a branch's normalized input X [B, W, H], groups of 16 channels
(X[b, i, g, j], g < G = H/16, j < 16):

    delta = reshape(W_delta X, [B, W, 2 sides, 2 taps, G])
    Conv_s(X)[b,i,g,j] = (base[s,0,g,j] + delta[b,i,s,0,g]) * X[b,i,g,j]
                       + 1{i>=1} (base[s,1,g,j] + delta[b,i,s,1,g]) * X[b,i-1,g,j]

``prepare`` applies side 0 to X and emits the prepared input (BF16) and the
side-1 delta (BF16). ``finish`` applies side 1 to the branch output Z using that
represented delta: it never projects again. Column 0 has no preceding tap and
nothing carries across calls. The reference forms the coefficient (base + delta) and
multiplies once, in float64; base*x + delta*x with the products rounded separately, and a
finish with the unrounded delta, are legitimate reformulations (CONTRACTS C2 v3: their
room is in reference.magnitude.conv's s), not other results.
"""

from __future__ import annotations

import numpy as np

from reference import precision as P
from reference.backend import portable
from reference.precision import inter, represent, work

GROUP = 16


def _groups(h: int) -> int:
    if h % GROUP:
        raise ValueError(f"grouped_conv: hidden width {h} is not a multiple of {GROUP}")
    return h // GROUP


def _conv(x, base_side, delta_side) -> np.ndarray:
    """x [B,W,H]; base_side [2 taps, H]; delta_side [B,W,2 taps,G] -> [B,W,H]."""
    b, w, h = x.shape
    g = _groups(h)
    xg = x.reshape(b, w, g, GROUP)
    coef = base_side.reshape(1, 1, 2, g, GROUP) + delta_side[..., None]  # [B,W,2,G,16]
    out = coef[:, :, 0] * xg
    out[:, 1:] += coef[:, 1:, 1] * xg[:, :-1]  # tap 1 reads the previous column; none at i = 0
    return out.reshape(b, w, h)


def project_delta(x, proj) -> np.ndarray:
    """W_delta X reshaped to [B, W, 2 sides, 2 taps, G]."""
    x = work(x)
    b, w, h = x.shape
    return P.matmul(x, work(proj).T).reshape(b, w, 2, 2, _groups(h))


def prepare(x, base, proj) -> tuple[np.ndarray, np.ndarray]:
    """Input side: (prepared BF16 [B,W,H], finish delta BF16 [B,W,2,G])."""
    x, base = work(x), work(base)
    delta = inter(project_delta(x, proj), "delta")
    prepared = represent(_conv(x, base[0], delta[:, :, 0]), "bf16")
    return prepared, represent(delta[:, :, 1], "bf16")


def finish_raw(z, base, finish_delta) -> np.ndarray:
    """Output side on the branch output z, with the represented delta from prepare, unrounded:
    inside a layer the finished branch joins the residual stream, which C1 does not name as a
    represented point (draft_layer)."""
    return _conv(work(z), work(base)[1], work(finish_delta))


def finish(z, base, finish_delta) -> np.ndarray:
    """The Op's ``finished`` output: finish_raw stored BF16."""
    return represent(finish_raw(z, base, finish_delta), "bf16")


@portable
def grouped_conv(x, z, base, proj) -> dict[str, np.ndarray]:
    """The Op: prepare on x, finish on z with prepare's delta."""
    prepared, finish_delta = prepare(x, base, proj)
    return {"prepared": prepared, "finish_delta": finish_delta, "finished": finish(z, base, finish_delta)}
