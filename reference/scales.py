"""The magnitude s of every represented output, per Op (CONTRACTS C2 v2; the conv's as amended by v3).

Each function takes the Op's keyword arguments and the reference's outputs (for the
decisions that select what is gathered) and returns {output: s}, s shaped as the
output. BF16 chains count in ``magnitude.UNIT`` (the rules are in reference.magnitude);
Ops with FP32 outputs count in FP32 units (2^-24) with the terms written below. Where an
Op is given an implementation's represented intermediate (``follow``: the conv's finish
delta, the selector's g) the caller passes it in place of the reference's, and the
downstream magnitudes are those of that chain; a followed value that is itself a rounded copy
of something an implementation may use unrounded (the conv's finish delta) enters as ``rounded``.
"""

from __future__ import annotations

import numpy as np

from reference.backend import portable, xp

from reference import magnitude as mg
from reference.candidate_topk import _forced_rows
from reference.context_kv import paged_rows, ring_slots
from reference.draft_attention import allowed
from reference.grouped_conv import GROUP
from reference.masked_block import CONV_WEIGHTS, LAYER_WEIGHTS, block_tokens
from reference.rng import uniform
from reference.target_distribution import penalized_logits

SOFTMAX_TERMS = 3.0  # exp's own rounding, the division by the sum, the stored FP32 value


def _abs64(x) -> np.ndarray:
    return xp.abs(xp.asarray(x, np.float64))


# --- BF16 chains -----------------------------------------------------------------------------


def feature_capture(kw, out) -> dict:
    r = xp.asarray(kw["block_outputs"], np.float64)
    s = xp.concatenate([r[int(i)] for i in kw["target_layer_ids"]], axis=-1)
    c = mg.rmsnorm(mg.linear(mg.exact(s), kw["fc_weight"]), kw["hidden_norm"], kw["eps"])
    return {"context": c.s}


@portable
def context_kv(kw, out) -> dict:
    c = mg.exact(kw["context"])
    rows, d = c.v.shape[0], int(kw["head_dim"])
    positions = int(kw["start"]) + xp.arange(rows, dtype=np.int64)
    k = mg.rope(mg.rmsnorm(mg.linear(c, kw["wk"]).reshape(rows, -1, d), kw["k_norm"], kw["eps"]), positions,
                kw["theta"])
    v = mg.linear(c, kw["wv"]).reshape(k.s.shape)
    ks, vs = xp.zeros(xp.shape(kw["k_cache"])), xp.zeros(xp.shape(kw["v_cache"]))  # untouched rows: copies
    if kw["storage"] == "ring":
        keep = xp.arange(max(0, rows - ks.shape[0]), rows)
        slots = ring_slots(positions[keep], ks.shape[0])
        ks[slots], vs[slots] = k.s[keep], v.s[keep]
    else:
        page, row = paged_rows(positions, kw["page_table"], int(kw["page_size"]))
        ks[page, row], vs[page, row] = k.s, v.s
    return {"k_cache": ks, "v_cache": vs}


def _mask(kw_frontier, live, capacity, width, window):
    return allowed(kw_frontier, live, capacity, width, int(window))[:, None]


@portable
def draft_attention(kw, out) -> dict:
    q, k, v = mg.exact(kw["q"]), mg.exact(kw["k"]), mg.exact(kw["v"])
    mask = _mask(kw["frontier"], kw["live"], xp.shape(kw["k_cache"])[1], q.v.shape[1], kw["window"])
    return {"out": mg.attention(q, k, v, kw["k_cache"], kw["v_cache"], mask).s}


def prepare(x: mg.Tracked, base, proj) -> tuple[mg.Tracked, mg.Tracked]:
    """grouped_conv.prepare tracked: (prepared, finish delta)."""
    b, w, h = x.v.shape
    delta = mg.linear(x, proj).reshape(b, w, 2, 2, h // GROUP)
    return mg.conv(x, xp.asarray(base, np.float64)[0], delta[:, :, 0], GROUP), delta[:, :, 1]


@portable
def grouped_conv(kw, out) -> dict:
    """``out`` must hold the finish delta the implementation returned (follow): finished reads it.
    That delta is the BF16 copy; an implementation may finish with the FP32 delta it rounded
    (CONTRACTS C2 v3), which differs from it by up to u |delta|: so it enters as a rounding point
    (``rounded``: s = |delta|), not as an exact input."""
    prepared, delta = prepare(mg.exact(kw["x"]), kw["base"], kw["proj"])
    finish = mg.conv(mg.exact(kw["z"]), xp.asarray(kw["base"], np.float64)[1], mg.rounded(out["finish_delta"]), GROUP)
    return {"prepared": prepared.s, "finish_delta": delta.s, "finished": finish.s}


def layer(x: mg.Tracked, k_cache, v_cache, frontier, live, input_norm, wq, wk, wv, q_norm, k_norm, wo, post_norm,
          w_gate, w_up, w_down, eps, theta, head_dim, window, variant, attn_conv_base=None, mlp_conv_base=None,
          attn_conv_proj=None, mlp_conv_proj=None) -> mg.Tracked:
    """draft_layer.forward, tracked (the caches may be Tracked: magnitude.attention)."""
    conv = variant == "dflash2"
    b, w, _ = x.v.shape
    positions = xp.asarray(frontier, dtype=np.int64)[:, None] + xp.arange(w, dtype=np.int64)
    n = mg.rmsnorm(x, input_norm, eps)
    if conv:
        n, finish_a = prepare(n, attn_conv_base, attn_conv_proj)

    def head(wt, norm):
        return mg.rope(mg.rmsnorm(mg.linear(n, wt).reshape(b, w, -1, head_dim), norm, eps), positions, theta)

    q, k = head(wq, q_norm), head(wk, k_norm)
    v = mg.linear(n, wv).reshape(b, w, -1, head_dim)
    capacity = (k_cache.v if isinstance(k_cache, mg.Tracked) else xp.asarray(k_cache)).shape[1]
    mask = _mask(frontier, live, capacity, w, window)
    a = mg.attention(q, k, v, k_cache, v_cache, mask).reshape(b, w, -1)
    o = mg.linear(a, wo)
    if conv:
        o = mg.conv(o, xp.asarray(attn_conv_base, np.float64)[1], finish_a, GROUP)
    y = mg.add(x, o)
    m = mg.rmsnorm(y, post_norm, eps)
    if conv:
        m, finish_m = prepare(m, mlp_conv_base, mlp_conv_proj)
    z = mg.linear(mg.mul(mg.silu(mg.linear(m, w_gate)), mg.linear(m, w_up)), w_down)
    if conv:
        z = mg.conv(z, xp.asarray(mlp_conv_base, np.float64)[1], finish_m, GROUP)
    return mg.add(y, z)


@portable
def draft_layer(kw, out) -> dict:
    kw = dict(kw)
    x = mg.exact(kw.pop("x"))
    return {"x_next": layer(x, **kw).s}


@portable
def masked_block(kw, out) -> dict:
    stacked = {name: kw[name] for name in LAYER_WEIGHTS}
    if kw["variant"] == "dflash2":
        stacked.update({name: kw[name] for name in CONV_WEIGHTS})
    rows = xp.asarray(kw["embed"])[block_tokens(kw["anchor"], kw["mask_token_id"], int(kw["num_drafts"]))]
    x = mg.exact(xp.asarray(rows, np.float64))  # gathered first: no float64 copy of the whole table
    width = x.v.shape[1]
    live = xp.asarray(kw["live"]) if kw["variant"] == "dflash" else xp.full(x.v.shape[0], width)
    for i, window in enumerate(kw["windows"]):
        x = layer(x, kw["context_k"][i], kw["context_v"][i], kw["frontier"], live, eps=kw["eps"], theta=kw["theta"],
                  head_dim=kw["head_dim"], window=int(window), variant=kw["variant"],
                  **{name: w[i] for name, w in stacked.items()})
    return {"hidden": mg.rmsnorm(x, kw["final_norm"], kw["eps"]).s[:, 1:]}


# --- FP32 outputs (units of 2^-24) --------------------------------------------------------------


def logit_magnitude(hidden, head) -> np.ndarray:
    """sum_r |h_r| |w_r| per logit (NaN for a NaN input): what one rounding of a partial sum can
    move the result by."""
    with np.errstate(invalid="ignore"):
        return _abs64(hidden) @ _abs64(head).T


def accumulation_depth(n: int) -> float:
    """How many FP32 roundings a term of an n-long dot product passes through in a tree-shaped
    accumulation (pairwise, the combine of split-K partials): ceil(log2 n), at least 1."""
    return float(max(1, int(np.ceil(np.log2(max(2, int(n)))))))


TILE = 16  # the k of one BF16 tensor-core step (mma.sync m16n8k16, wgmma k16)


def accumulation_weights(n: int) -> np.ndarray:
    """Per term j of an n-long FP32 dot product: how many FP32 roundings it passes through in the
    legitimate orders together (CONTRACTS C2: s sums, over the rounding points an implementation
    may add, the magnitude of the value rounded there).

    - A GEMM main loop adds one TILE-wide tile of products to the FP32 accumulator per step, k
      ascending (cuBLAS, CUTLASS, mma kernels), and tensor cores round that step by truncation
      (Fasi et al. 2021). Truncation is biased, so these errors add up linearly instead of
      cancelling: term j passes through the accumulator's rounding at its own tile step and every
      later one, ceil(n / TILE) - floor(j / TILE) roundings, each bounded by the partial sum,
      which is at most the sum of the |terms| already in it.
    - The split-K combine or a pairwise sum then adds ceil(log2 n) (accumulation_depth).

    Round-to-nearest chains (sequential CUDA-core loops) are unbiased and stay well inside these
    weights (tests/test_fp32_accumulation_envelope.py measures every order at H 5120)."""
    n = int(n)
    tiles = -(-n // TILE)
    return accumulation_depth(n) + tiles - xp.arange(n) // TILE


def fp32_logit_magnitude(hidden, head) -> np.ndarray:
    """s of FP32 logits accumulated over H terms: sum_j |h_j| |w_j| x accumulation_weights(H)_j.
    At H 5120 the weights run from 333 (first tile) to 14 (last). Measured need at that width
    (docs/reports/h200-fast-and-step.md, tests/test_fp32_accumulation_envelope.py): the H200's
    cuBLAS gemmEx 39-52 u x sum |h||w|, the control set's truncating tensor-core tiles 332 u x
    sum |h||w|; BF16-stored logits (the bug) stay far outside."""
    h = _abs64(hidden)
    with np.errstate(invalid="ignore"):
        return (h * accumulation_weights(h.shape[-1])) @ _abs64(head).T


def softmax_scale(p, y, sy, keep) -> np.ndarray:
    """s of p = softmax(y) over ``keep`` (p the reference's, float64), given s of y: the argument
    y - max carries sy + sy(max) + |y - max|, exp and the division are relative; the sum adds
    log2(n) roundings (a tree; the relative error of a positive sum)."""
    p = xp.asarray(p, np.float64)
    if not keep.any():
        return xp.zeros_like(p)
    top = int(xp.argmax(xp.where(keep, y, -np.inf)))
    arg = xp.where(keep, sy + sy[top] + xp.abs(y - y[top]), 0.0)
    terms = max(1.0, float(np.log2(max(2, int(keep.sum())))))
    rel = arg + float(xp.sum(p * arg)) + terms + SOFTMAX_TERMS
    return xp.where(keep, p * rel, 0.0)


@portable
def candidate_topk(kw, out) -> dict:
    with np.errstate(invalid="ignore"):  # a NaN score (C4: the NaN-score case) has no magnitude
        sz = raw_mag = fp32_logit_magnitude(kw["hidden"], kw["head"])
        z = xp.asarray(kw["hidden"], np.float64) @ xp.asarray(kw["head"], np.float64).T
    m, c = float(kw.get("output_multiplier", 0.0)), float(kw.get("softcap", 0.0))
    if m > 0:
        z, sz = z * m, m * sz + xp.abs(z * m)
    if c > 0:
        t = xp.tanh(z / c)
        sz = (1 - t * t) * (sz + xp.abs(z)) + 2 * xp.abs(c * t)
    gid = xp.arange(sz.shape[-1]) if kw.get("shortlist") is None else xp.asarray(kw["shortlist"])
    eligible = (gid >= 0) & (gid < int(kw["vocab_size"]))
    rows = xp.maximum(_forced_rows(out["ids"], gid, eligible), 0)  # the head row of each chosen id
    raw = xp.where(eligible, raw_mag, 0.0).max(axis=-1, keepdims=True)
    return {"scores": xp.take_along_axis(sz, rows, axis=-1),
            "ids.scale": xp.broadcast_to(2 * raw, xp.shape(out["ids"]))}


@portable
def proposal_head(kw, out) -> dict:
    head = kw["head"]
    ids = xp.arange(head.shape[0]) if kw.get("shortlist") is None else xp.asarray(kw["shortlist"])
    eligible = (ids >= 0) & (ids < int(kw["vocab_size"]))
    raw = xp.where(eligible, fp32_logit_magnitude(kw["hidden"], head), 0.0).max(axis=-1)
    return {"tokens.scale": 2 * raw}


def penalized_magnitude(logits_row, prompt_row, counts_row, vocab_size, rho, f, r) -> np.ndarray:
    """s of the processed logits (C5 steps 1-3) in FP32 units: each penalty is one or two
    FP32 operations on the logit (the logits themselves are given)."""
    z = penalized_logits(logits_row, prompt_row, counts_row, vocab_size, rho, f, r)
    counts = xp.asarray(counts_row, np.float64)
    fin = xp.isfinite(z)
    az = xp.abs(xp.where(fin, z, 0.0))
    seen = (xp.asarray(prompt_row) != 0) | (counts > 0)
    sz = xp.where(seen & (float(rho) != 1), az, 0.0)
    if float(f) or float(r):
        sz = sz + xp.abs(float(f) * counts) + abs(float(r)) * (counts > 0) + az
    return sz


def probs_scale(z, sz, temperature: float, probs) -> np.ndarray:
    """s of p = softmax(z / T) over the kept tokens (those with p > 0), FP32 units."""
    probs = xp.asarray(probs, np.float64)
    if temperature <= 0:
        return xp.zeros_like(probs)  # greedy: one-hot, exact
    fin = xp.isfinite(z)
    y = xp.where(fin, z / temperature, 0.0)
    return softmax_scale(probs, y, sz / temperature + xp.abs(y), probs > 0)


def target_distribution(kw, out) -> dict:
    probs = xp.asarray(out["probs"], np.float64)
    s = xp.zeros_like(probs)
    for n in range(probs.shape[0]):
        z = penalized_logits(kw["logits"][n], kw["prompt_mask"][n], kw["output_counts"][n], kw["vocab_size"],
                             kw["repetition_penalty"][n], kw["frequency_penalty"][n], kw["presence_penalty"][n])
        sz = penalized_magnitude(kw["logits"][n], kw["prompt_mask"][n], kw["output_counts"][n], kw["vocab_size"],
                                 kw["repetition_penalty"][n], kw["frequency_penalty"][n], kw["presence_penalty"][n])
        s[n] = probs_scale(z, sz, float(kw["temperature"][n]), probs[n])
    return {"probs": s}


def race_scale(weights, s_weights, seed, position, purpose) -> float:
    """The envelope of an exponential race's margin (C3 scores log w - log(-log U), FP32
    units): the relative envelope of the winner's and the runner-up's weights, plus each
    score's own FP32 evaluation (|score|)."""
    w = xp.asarray(weights, np.float64)
    support = xp.flatnonzero(w > 0)
    if support.size < 2:
        return 0.0
    u = uniform(seed, position, purpose, support)
    score = xp.log(w[support]) - xp.log(-xp.log(u))
    top2 = xp.argsort(-score, kind="stable")[:2]
    v = support[top2]
    return float(xp.sum(xp.asarray(s_weights, np.float64)[v] / w[v]) + xp.sum(xp.abs(score[top2])))


def greedy_scale(z, sz) -> float:
    """The envelope of an argmax lead over processed logits z (FP32 units): twice the largest s."""
    fin = xp.isfinite(z)
    return float(2 * xp.max(xp.where(fin, sz + xp.abs(xp.where(fin, z, 0.0)), 0.0))) if fin.any() else 0.0


@portable
def candidate_selector(kw, out) -> dict:
    """g: its GEMM. (q and the walk's decisions carry their magnitudes from the reference itself,
    which knows the path it took: reference.candidate_selector.)"""
    return {"g": logit_magnitude(kw["hidden"], kw["w_hidden"])}
