"""A tiny causal target LM in float64 for end-to-end rounds (docs/ops.md "one end-to-end round ... on a
tiny model with random weights"; spec: "For each processed position t, let r_t^l be the complete
residual output of zero-based target block l").

Token t at absolute position t (0-based) flows through:

    x_t^0 = embed[token_t]
    block l (pre-norm, causal):
        n   = plain_rmsnorm(x, attn_norm_l)
        q,k = rope_1d(plain_head_rmsnorm(W_q n / W_k n, qk_norm_l), position t);  v = W_v n
        y   = x + W_o softmax_causal(q k^T / sqrt(D)) v          keys at positions <= t only
        m   = plain_rmsnorm(y, mlp_norm_l)
        r_t^l = y + W_down(SiLU(W_gate m) * (W_up m))            the captured residual output
    logits_t = FP32(head @ plain_rmsnorm(r_t^(last), final_norm))   over all padded rows

``logits[t]`` predicts the token at t + 1 (the target's next-token shift). The head has
``rows >= vocab_size`` rows; the padded ones carry large weights, so a consumer that forgets the
public-vocabulary mask (C5 step 1) would pick them. Logits are emitted FP32, the represented
format of the Op interface (docs/ops.md), so the speculative loop and plain decoding read the
same numbers.

State is a ``TargetCache`` (per block K/V of the processed positions). ``forward`` runs a chunk
on top of a cache without changing it and returns a ``TargetStep``; ``commit(cache, step, n)``
appends the step's first n rows. This is the verify/commit split of the spec ("The Fold uses
records from this physical verify block, not a separately recomputed numerical path"): a round
verifies Q rows and keeps only the N committed ones. Processing a prefix at once or in pieces
gives the same results (up to float64 summation order).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from reference.norms import plain_head_rmsnorm, plain_rmsnorm, rope_1d, silu
from reference.numerics import to_fp32

BLOCK_WEIGHTS = ("attn_norm", "wq", "wk", "wv", "qk_norm", "wo", "mlp_norm", "w_gate", "w_up", "w_down")


@dataclass(frozen=True)
class ToyTarget:
    """Weights and geometry. ``blocks[l]`` maps BLOCK_WEIGHTS names to arrays."""

    embed: np.ndarray  # [rows, H]
    blocks: tuple[dict, ...]
    final_norm: np.ndarray  # [H]
    head: np.ndarray  # [rows, H]
    vocab_size: int  # public vocabulary; rows >= vocab_size are padding
    heads: int
    head_dim: int
    eps: float = 1e-6
    theta: float = 10_000.0

    @property
    def rows(self) -> int:
        return self.head.shape[0]

    @property
    def hidden(self) -> int:
        return self.embed.shape[1]

    @property
    def n_blocks(self) -> int:
        return len(self.blocks)


@dataclass(frozen=True)
class TargetCache:
    """K/V of the processed positions [0, length), per block: [length, heads, D]."""

    k: tuple[np.ndarray, ...]
    v: tuple[np.ndarray, ...]

    @property
    def length(self) -> int:
        return self.k[0].shape[0]


@dataclass(frozen=True)
class TargetStep:
    """One chunk's results at positions start .. start+T-1 (not yet committed)."""

    start: int
    logits: np.ndarray  # [T, rows], FP32 values
    block_outputs: np.ndarray  # [n_blocks, T, H]: r_t^l by block id
    k: tuple[np.ndarray, ...]  # per block, the chunk's new rows [T, heads, D]
    v: tuple[np.ndarray, ...]


def random_target(
    rng: np.random.Generator,
    *,
    vocab_size: int,
    rows: int,
    hidden: int,
    n_blocks: int = 3,
    heads: int = 2,
    head_dim: int = 16,
    intermediate: int = 64,
    head_spread: float = 0.6,
) -> ToyTarget:
    """Random weights. Head rows get log-normal norms (``head_spread``): a few rows win the argmax
    often, for the target and for a draft reading the same head, so greedy rounds accept
    proposals now and then instead of never."""
    if rows < vocab_size:
        raise ValueError(f"toy target: {rows} head rows cannot hold a vocabulary of {vocab_size}")

    def dense(out, inp):
        return rng.standard_normal((out, inp)) / np.sqrt(inp)

    qd = heads * head_dim
    blocks = tuple(
        {
            "attn_norm": 1 + 0.1 * rng.standard_normal(hidden),
            "wq": dense(qd, hidden),
            "wk": dense(qd, hidden),
            "wv": dense(qd, hidden),
            "qk_norm": 1 + 0.1 * rng.standard_normal(head_dim),
            "wo": dense(hidden, qd),
            "mlp_norm": 1 + 0.1 * rng.standard_normal(hidden),
            "w_gate": dense(intermediate, hidden),
            "w_up": dense(intermediate, hidden),
            "w_down": dense(hidden, intermediate),
        }
        for _ in range(n_blocks)
    )
    head = dense(rows, hidden) * np.exp(head_spread * rng.standard_normal((rows, 1)))
    head[vocab_size:] *= 4  # padding rows that would win if the C5 mask were missing
    return ToyTarget(
        embed=rng.standard_normal((rows, hidden)),
        blocks=blocks,
        final_norm=1 + 0.1 * rng.standard_normal(hidden),
        head=head,
        vocab_size=int(vocab_size),
        heads=heads,
        head_dim=head_dim,
    )


def empty_cache(target: ToyTarget) -> TargetCache:
    empty = np.zeros((0, target.heads, target.head_dim))
    return TargetCache(k=(empty,) * target.n_blocks, v=(empty,) * target.n_blocks)


def forward(target: ToyTarget, cache: TargetCache, tokens) -> TargetStep:
    """Run ``tokens`` at positions cache.length ...; causal over the cache and the chunk."""
    tokens = np.asarray(tokens, dtype=np.int64)
    if tokens.ndim != 1 or np.any(tokens < 0) or np.any(tokens >= target.rows):
        raise ValueError(f"toy target: tokens {tokens.tolist()} must be a 1-D list of ids in 0..{target.rows - 1}")
    start, T = cache.length, tokens.shape[0]
    if T == 0:
        none = np.zeros((0, target.heads, target.head_dim))
        return TargetStep(start, np.zeros((0, target.rows)), np.zeros((target.n_blocks, 0, target.hidden)),
                          (none,) * target.n_blocks, (none,) * target.n_blocks)
    positions = start + np.arange(T, dtype=np.int64)
    D, eps = target.head_dim, target.eps
    x = target.embed[tokens].astype(np.float64)
    outs, new_k, new_v = [], [], []
    # chunk row i (position start+i) sees every cached key and chunk keys j <= i
    visible = np.concatenate([np.ones((T, start), bool), np.tril(np.ones((T, T), bool))], axis=1)
    for blk, k_old, v_old in zip(target.blocks, cache.k, cache.v):
        n = plain_rmsnorm(x, blk["attn_norm"], eps)
        q = rope_1d(plain_head_rmsnorm((n @ blk["wq"].T).reshape(T, -1, D), blk["qk_norm"], eps, D), positions,
                    target.theta)
        k = rope_1d(plain_head_rmsnorm((n @ blk["wk"].T).reshape(T, -1, D), blk["qk_norm"], eps, D), positions,
                    target.theta)
        v = (n @ blk["wv"].T).reshape(T, -1, D)
        keys, vals = np.concatenate([k_old, k]), np.concatenate([v_old, v])
        s = np.einsum("ihd,jhd->hij", q, keys) / np.sqrt(D)
        s = np.where(visible[None], s, -np.inf)
        w = np.exp(s - s.max(axis=-1, keepdims=True))
        a = np.einsum("hij,jhd->ihd", w / w.sum(axis=-1, keepdims=True), vals).reshape(T, -1)
        y = x + a @ blk["wo"].T
        m = plain_rmsnorm(y, blk["mlp_norm"], eps)
        x = y + (silu(m @ blk["w_gate"].T) * (m @ blk["w_up"].T)) @ blk["w_down"].T
        outs.append(x)
        new_k.append(k)
        new_v.append(v)
    logits = to_fp32(plain_rmsnorm(x, target.final_norm, eps) @ target.head.T)
    return TargetStep(start=start, logits=logits, block_outputs=np.stack(outs), k=tuple(new_k), v=tuple(new_v))


def commit(cache: TargetCache, step: TargetStep, n: int) -> TargetCache:
    """The cache after committing the step's first n rows (the rest of the step is dropped)."""
    if step.start != cache.length:
        raise ValueError(f"toy target: step starts at {step.start}, cache holds {cache.length} positions")
    if not 0 <= n <= step.logits.shape[0]:
        raise ValueError(f"toy target: cannot commit {n} of {step.logits.shape[0]} rows")
    return TargetCache(
        k=tuple(np.concatenate([a, b[:n]]) for a, b in zip(cache.k, step.k)),
        v=tuple(np.concatenate([a, b[:n]]) for a, b in zip(cache.v, step.v)),
    )


def prefill(target: ToyTarget, tokens) -> tuple[TargetCache, TargetStep]:
    """Process ``tokens`` from an empty cache at once: (committed cache, the step)."""
    step = forward(target, empty_cache(target), tokens)
    return commit(empty_cache(target), step, step.logits.shape[0]), step
