"""Running error magnitudes: the ``s`` of the accuracy envelope (CONTRACTS C2 v2, the conv as amended by v3).

A represented output is ACCEPTABLE when |out_i - ref_i| <= K * u * s_i. This module
computes s_i next to the value by forward running-error analysis: every tracked value
carries ``s``, the magnitude of the error that the rounding points a legitimate
implementation may place upstream of it can cause in this element, in units of one
rounding at the chain's unit roundoff. Each operation combines its *local*
term (the magnitude of the value rounded there) with the *upstream* terms carried
through its first-order effect, as a root sum of squares (``rss``): round-to-nearest
errors of distinct rounding points are independent with mean zero, so they add in
quadrature. (The linear worst case, |W| s_x through a GEMM of width n, grows sqrt(n)-fold
per layer and, measured, reached 10^4 |ref| after one draft layer: an envelope that wide
passes real bugs.) Each term is the largest error of its rounding (u |v|), so s is about
sqrt(3) standard deviations of a chain that rounds once at every point; K then allows a
chain that rounds up to three times where the analysis counts once, at the maximum over
a tensor (``conformance.registry.Envelope``).

Rules, each one line of the analysis (every "+" between terms below is rss):

- an exact input (a BF16 weight, a given cache) carries s = 0: it is not rounded again;
- a dot product or GEMM y = W x with FP32 accumulation in any order (tree, split-K,
  sequential, tensor-core tiles) and its output possibly stored BF16:
  s_y = rss_j(w_j s_xj) + |y| + ACC sum_j |w_j x_j|, ACC the FP32 accumulation term in
  units of UNIT (4 * 2^-24 / UNIT: a sequential FP32 sum's typical error is about one
  rounding of sum |w x|);
- a sum a + b:     s = s_a + s_b + |a + b|            (one rounding of the result)
- a product a b:   s = |b| s_a + |a| s_b + |a b|
- RMSNorm y = w x / r:  s_y = |w| / r (s_x + |x| rss_j(x_j s_xj) / (n r^2)) + |y|
- RoPE (split half):  lo' = lo cos - hi sin  gets  |cos| s_lo + |sin| s_hi + |lo cos| +
  |hi sin| (a BF16 or FP32 table, a rotation in BF16) + |hi'| da, where da is the angle
  error budget of FP32 angle formation from an FP32 position: 4 |angle| 2^-24 (in units
  of UNIT) for positions below 2^24, and 0 above (an FP32 position there is not exact:
  not legitimate, so it contributes nothing and shows);
- SiLU: |f'(x)| s_x + |f(x)| (a libm or intrinsic within its documented error);
- attention out = sum_k w_k V_k (w = softmax of scores): s = w_k s_Vk + w_k V_k (P
  rounded to BF16 for the PV product) + w_k S_k |V_k| + w_k S_k |out| + |out|, each over
  k, with S_k = rss_d(s_qd k_d, q_d s_kd) / sqrt(D) the score's magnitude from BF16 q and
  k; scores and row sums stay FP32 (no term of their own);
- the grouped conv, one tap (base + delta) x (CONTRACTS C2 v3): s = |x| s_delta +
  |base + delta| s_x + (|base x| + |delta x|) + |(base + delta) x|, where the third term
  is the coefficient's split, written once as a linear sum; the two taps' sum adds |out|.
  Derivation (u the BF16 unit roundoff, b = base, d = delta, c = b + d). Two legitimate
  forms of a tap differ in where they round:
    (A) c first:   fl(fl(b + d) x)        errors u |c| |x| (the coefficient) and u |c x|;
    (B) z-lab:     fl(fl(b x) + fl(d x))  errors u |b x|, u |d x| (each product) and
                                          u |b x + d x| = u |c x| (their sum).
  Both share the upstream terms |x| s_d and |c| s_x (x's error enters through b x + d x
  = c x either way) and the rounding of the tap's value, |c x|. They differ in one point:
  A rounds |c x| there, B rounds |b x| and |d x| independently (rss). An implementation
  picks one form, so s must cover the larger: |b x| + |d x| >= |c x| and
  >= rss(|b x|, |d x|), hence the split's term (|b| + |d|) |x|, linear because it stands
  for alternatives, not for independent points of one chain. Where b and d share a sign
  it equals |c| |x|, the coefficient rounded once (v2); it grows only where they cancel,
  and where b + d = 0 exactly it keeps a tap whose value is 0 from demanding an exact 0.
  (B's worst case, 1.12 u (|b x| + |d x|) as measured on z-lab's drafter, is then 1.12 u s:
  K = 8 needs no change.)
    (C) the finish with the unrounded FP32 delta where the stored finish delta is its BF16
  copy: |d_fp32 - bf16(d)| <= u |d|, so a term |d| |x| enters through s_d. Inside a
  layer the delta's s already holds it (magnitude.linear's |y|, the GEMM output stored
  BF16); where an Op is judged against the implementation's own BF16 finish delta
  (followed), the caller passes that delta as ``rounded``, not ``exact``
  (reference.scales.grouped_conv). Nothing else about the conv is legitimate: a tap read
  from the wrong column, a delta indexed per channel instead of per group of 16, or a
  first column that reads a tap it does not have contribute nothing to s, so they show.

UNIT is the BF16 unit roundoff 2^-8: chains whose outputs are BF16 count in it. Ops with
FP32 outputs (scores, probabilities) count in FP32 units and write their own terms.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from reference.backend import xp

from reference.norms import rope_angles

UNIT = 2.0**-8
FP32_EXACT_POSITIONS = 2**24
ANGLE_ULPS = 4.0  # inverse frequency (pow, rounding) and the product p * f, each an FP32 rounding or two
ACC = 4.0 * 2.0**-24 / UNIT  # FP32 accumulation of a dot product, per unit of sum |w x|


def rss(*terms) -> np.ndarray:
    return xp.sqrt(sum(xp.square(t) for t in terms))


@dataclass(frozen=True)
class Tracked:
    """A float64 value and its running error magnitude (same shape)."""

    v: np.ndarray
    s: np.ndarray

    def reshape(self, *shape) -> Tracked:
        return Tracked(self.v.reshape(*shape), self.s.reshape(*shape))

    def __getitem__(self, idx) -> Tracked:
        return Tracked(self.v[idx], self.s[idx])


def exact(x) -> Tracked:
    v = xp.asarray(x, np.float64)
    return Tracked(v, xp.zeros_like(v))


def rounded(x) -> Tracked:
    """A value stored at a legitimate rounding point of its own (s = |x|)."""
    v = xp.asarray(x, np.float64)
    return Tracked(v, xp.abs(v))


def linear(x: Tracked, w) -> Tracked:
    """y = x @ w.T (a projection or GEMM)."""
    w = xp.asarray(w, np.float64)
    y = x.v @ w.T
    upstream = xp.sqrt(xp.square(x.s) @ xp.square(w).T)
    return Tracked(y, rss(upstream, xp.abs(y), ACC * (xp.abs(x.v) @ xp.abs(w).T)))


def add(a: Tracked, b: Tracked) -> Tracked:
    v = a.v + b.v
    return Tracked(v, rss(a.s, b.s, v))


def mul(a: Tracked, b: Tracked) -> Tracked:
    v = a.v * b.v
    return Tracked(v, rss(b.v * a.s, a.v * b.s, v))


def rmsnorm(x: Tracked, weight, eps: float) -> Tracked:
    w = xp.asarray(weight, np.float64)
    n = x.v.shape[-1]
    r = xp.sqrt(xp.mean(x.v * x.v, axis=-1, keepdims=True) + float(eps))
    v = w * (x.v / r)
    coupling = xp.sqrt(xp.sum(xp.square(x.v * x.s), axis=-1, keepdims=True)) / (n * r * r)
    return Tracked(v, rss(w / r * rss(x.s, x.v * coupling), v))


def angle_budget(positions, head_dim: int, theta: float) -> np.ndarray:
    """[..., D/2]: the legitimate angle error of FP32 angle formation, in units of UNIT."""
    ang = xp.abs(rope_angles(positions, head_dim, theta))
    pos = xp.asarray(positions, dtype=np.int64)[..., None]
    return xp.where(xp.abs(pos) < FP32_EXACT_POSITIONS, ANGLE_ULPS * ang * 2.0**-24 / UNIT, 0.0)


def rope(x: Tracked, positions, theta: float) -> Tracked:
    """x [..., heads, D] at positions [...] (broadcast over heads), as norms.rope_1d."""
    d = x.v.shape[-1]
    ang = rope_angles(positions, d, theta)[..., None, :]
    da = angle_budget(positions, d, theta)[..., None, :]
    c, s = xp.cos(ang), xp.sin(ang)
    lo, hi = x.v[..., : d // 2], x.v[..., d // 2:]
    slo, shi = x.s[..., : d // 2], x.s[..., d // 2:]
    vlo, vhi = lo * c - hi * s, hi * c + lo * s
    ac, as_ = xp.abs(c), xp.abs(s)
    mlo = rss(ac * slo, as_ * shi, lo * c, hi * s, vhi * da)
    mhi = rss(ac * shi, as_ * slo, hi * c, lo * s, vlo * da)
    return Tracked(xp.concatenate([vlo, vhi], -1), xp.concatenate([mlo, mhi], -1))


def silu(x: Tracked) -> Tracked:
    with np.errstate(over="ignore"):
        sig = 1.0 / (1.0 + xp.exp(-x.v))
    v = x.v * sig
    slope = xp.abs(sig * (1.0 + x.v * (1.0 - sig)))
    return Tracked(v, rss(slope * x.s, v))


def attention(q: Tracked, k: Tracked, v: Tracked, k_cache, v_cache, mask) -> Tracked:
    """q [B,W,Hq,D]; k, v [B,W,Hk,D]; caches [B,C,Hk,D], exact arrays (the Op's inputs) or Tracked
    (context K/V computed in the same round: their s enters as the block rows' does);
    mask [B,1,W,C+W] -> [B,W,Hq,D]."""
    b, w, hq, d = q.v.shape
    rep = hq // k.v.shape[2]

    def keys_of(block: Tracked, cache) -> Tracked:
        cache = cache if isinstance(cache, Tracked) else exact(cache)
        val = xp.repeat(xp.concatenate([cache.v, block.v], axis=1), rep, axis=2)
        mag = xp.repeat(xp.concatenate([cache.s, block.s], axis=1), rep, axis=2)
        return Tracked(val, mag)

    keys, vals = keys_of(k, k_cache), keys_of(v, v_cache)
    scale = 1.0 / np.sqrt(d)
    sc = xp.einsum("bihd,bkhd->bhik", q.v, keys.v, optimize=True) * scale
    sc = xp.where(mask, sc, -np.inf)
    m = xp.max(sc, axis=-1, keepdims=True)
    m = xp.where(xp.isfinite(m), m, 0)
    p = xp.where(mask, xp.exp(sc - m), 0)
    total = xp.sum(p, axis=-1, keepdims=True)
    wts = xp.where(total > 0, p / xp.where(total > 0, total, 1), 0)  # a row with no key: no weights
    finite = xp.isfinite(vals.v)
    av = xp.where(finite, xp.abs(vals.v), 0.0)
    out = xp.einsum("bhik,bkhd->bihd", wts, xp.where(finite, vals.v, 0.0), optimize=True)
    kv = xp.where(xp.isfinite(keys.v), keys.v, 0.0)
    score_mag = xp.sqrt(xp.einsum("bihd,bkhd->bhik", xp.square(q.s), xp.square(kv), optimize=True)
                        + xp.einsum("bihd,bkhd->bhik", xp.square(q.v), xp.square(keys.s), optimize=True)) * scale
    w2, ws2 = xp.square(wts), xp.square(wts * score_mag)
    # rss_k(w S (|V| + |out|)) <= rss_k(w S |V|) + |out| rss_k(w S): the bound keeps [B,W,H,D] sized
    mag = xp.sqrt(xp.einsum("bhik,bkhd->bihd", w2, xp.square(vals.s) + xp.square(av), optimize=True)
                  + xp.einsum("bhik,bkhd->bihd", ws2, 2 * xp.square(av), optimize=True)
                  + 2 * xp.transpose(xp.sum(ws2, axis=-1), (0, 2, 1))[..., None] * xp.square(out) + xp.square(out))
    # a non-finite V that is attended makes the output non-finite: no envelope there (compared exactly)
    hit = xp.einsum("bhik,bkhd->bihd", (wts > 0).astype(np.float64), (~finite).astype(np.float64), optimize=True) > 0
    return Tracked(xp.where(hit, np.nan, out), xp.where(hit, np.inf, mag))


def conv(x: Tracked, base_side, delta: Tracked, group: int) -> Tracked:
    """x [B,W,H]; base_side [2 taps, H] exact; delta [B,W,2 taps,G] -> [B,W,H] (grouped_conv._conv)."""
    bsz, w, h = x.v.shape
    g = h // group
    base = xp.asarray(base_side, np.float64).reshape(1, 1, 2, g, group)
    coef_v = base + delta.v[..., None]
    # the coefficient's split (module docstring): (base + delta) rounded once (|c|) or the products
    # base x and delta x rounded separately (rss(|b|, |d|) per |x|); |b| + |d| covers either
    coef_s = rss(delta.s[..., None], xp.abs(base) + xp.abs(delta.v[..., None]))
    xv, xs = x.v.reshape(bsz, w, g, group), x.s.reshape(bsz, w, g, group)
    t0 = mul(Tracked(coef_v[:, :, 0], coef_s[:, :, 0]), Tracked(xv, xs))
    out_v, out_s = t0.v.copy(), t0.s.copy()
    if w > 1:
        t1 = mul(Tracked(coef_v[:, 1:, 1], coef_s[:, 1:, 1]), Tracked(xv[:, :-1], xs[:, :-1]))
        out_v[:, 1:] += t1.v
        out_s[:, 1:] = rss(out_s[:, 1:], t1.s, out_v[:, 1:])
    return Tracked(out_v.reshape(bsz, w, h), out_s.reshape(bsz, w, h))
