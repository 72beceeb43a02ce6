"""A configurable NumPy engine: the represented Ops written the way an engine team writes them.

``Engine(**options)`` implements the Ops independently of ``reference/``: float32 arithmetic,
explicit BF16 roundings (``reference.numerics.to_bf16``, round-to-nearest-even of the float32
value), and every choice that CONTRACTS C2 v2 calls legitimate as an option. Only pure-formula
helpers are reused: the attention mask (``reference.draft_attention.allowed``), the ring/paged slot
arithmetic (``reference.context_kv``), the block's input tokens (``reference.masked_block``) and the
C3 random draws (``reference.rng``). The purely discrete Ops (speculative_accept, tree_verify,
preview_commit) delegate to ``conformance.baseline.Float32Baseline``: they have no represented
output a precision choice could move.

Every option defaults to what the float32 baseline does (``Engine()`` is, up to the BLAS's own
summation order, the baseline), so a variant names only what it changes. Options:

accum           "exact" | "blas" | "sequential" | "pairwise" | "split_k" | "tc_tiles": how every
                dot product and reduction (GEMMs, attention, RMSNorm mean, softmax sums) accumulates.
                exact (the baseline): dot products in float64 rounded once to FP32, other sums
                NumPy's FP32 np.sum; blas: FP32 BLAS (the local library's order); the others FP32 in
                that order. tc_tiles models a tensor core (Fasi et al. 2021): products exact, each
                tile of 16 plus the accumulator aligned to the largest exponent and truncated to 24
                bits, the sum truncated to FP32 (GEMMs only; other sums sequential).
split           chunk length for split_k (and the scan block for cumulative sums)
gemm_bf16       GEMM outputs stored BF16 between kernels (feature projection, Q/K/V/O, gate, up,
                down). Never the context K projection (C1) nor the candidate logits (scores FP32).
norm_style      "div": w * (x / sqrt(ms + eps)) in FP32 | "rsqrt": w * (x * rsqrt(ms + eps)) |
                "hf": HF RMSNorm, w * BF16(x * rsqrt(ms + eps)) (normalized value rounded before the
                weight multiply)
bf16_norm_out   the layer's RMSNorm outputs n and m rounded BF16 (DFlash; baseline "n", "m")
bf16_branch_norm  DFlash2: n and m rounded BF16 before the conv prepare (not in the baseline)
bf16_headnorm_out  Q/K head-norm output rounded BF16 before RoPE
bf16_qk         Q/K rounded BF16 after RoPE (baseline "q", "k")
rope_table      "fp32": cos/sin of the angle in float64, rounded FP32, rotation in FP32 |
                "fp32_libm": cos/sin computed in float32 (NumPy's SIMD libm) of the angle reduced
                mod 2 pi | "bf16_hf": HF: FP32 cos/sin cast to BF16, input BF16, every product and
                the sum rounded BF16 (q * cos + rotate_half(q) * sin in the model dtype)
fp32_angles     angles formed in FP32 from FP32 positions (HF: inv_freq in FP32, pos.float() @
                inv_freq) where the position is below 2^24; exactly (integer position) otherwise
attn_scores_bf16  attention scores stored BF16 before the softmax (HF eager matmul output)
softmax_mode    "flash": unnormalized P feeds PV, FP32 row sum divides at the end (baseline) |
                "normalize_first": P = exp / sum, then PV (HF eager) | "online": flash-attention's
                online softmax over key blocks of ``attn_block`` with rescaling
bf16_probs      P rounded BF16 as the PV operand (baseline "probs")
bf16_attn_out   attention output rounded BF16 (baseline "attn")
bf16_residual   residual stream y and the layer outputs stored BF16 (baseline "y", "x")
bf16_silu       SiLU(gate) rounded BF16 before the multiply by up
bf16_act        SiLU(gate) * up rounded BF16 (baseline "act")
bf16_delta      conv delta projection rounded BF16 before use on the input side; None: as the baseline
                (rounded in the grouped_conv Op, "delta"; FP32 inside draft_layer / masked_block)
bf16_conv_coef  the conv coefficient (base + delta) rounded BF16 before the product
conv_eager_bf16 eager model-dtype conv: coefficient, each tap's product and the tap sum BF16
conv_products   "coef": each tap as (base + delta) * x (the baseline) | "separate_bf16": base * x and
                delta * x each rounded BF16, their sum and the tap sum BF16 (z-lab's drafter in the BF16
                model dtype) | "separate_fp32": the same products and sums in FP32 (its FP32 model)
fp32_finish_delta  the finish side of the conv uses the unrounded FP32 delta; the Op still returns its
                BF16 copy as ``finish_delta``
bf16_conv_out   finished conv branch rounded BF16 before the residual add (baseline)
exp             "exact": float64 exp rounded once (the baseline) | "libm": NumPy's float32 (SIMD) exp |
                "fast": CUDA __expf, ex2.approx(x * log2e) in FP32
ftz             fast exp flushes subnormal results to zero (ex2.approx.ftz, as --use_fast_math)
tanh            "exact" (the baseline) | "libm": NumPy float32 tanh | "rational": Eigen/XLA's clamped 13/6 rational
                approximation in FP32 (a few ulps)
"""

from __future__ import annotations

import numpy as np

from conformance.baseline import Float32Baseline
from conformance.rounds import ComposedRounds
from reference import numerics
from reference.context_kv import store_rows
from reference.draft_attention import allowed
from reference.masked_block import block_tokens
from reference.rng import Purpose, exponential_race

F32 = np.float32
TWO24 = 2**24

DEFAULTS = {
    "accum": "exact",
    "split": 8,
    "gemm_bf16": True,
    "norm_style": "div",
    "bf16_norm_out": True,
    "bf16_branch_norm": False,
    "bf16_headnorm_out": False,
    "bf16_qk": True,
    "rope_table": "fp32",
    "fp32_angles": False,
    "attn_scores_bf16": False,
    "softmax_mode": "flash",
    "attn_block": 4,
    "bf16_probs": True,
    "bf16_attn_out": True,
    "bf16_residual": True,
    "bf16_silu": False,
    "bf16_act": True,
    "bf16_delta": None,
    "bf16_conv_coef": False,
    "conv_eager_bf16": False,
    "conv_products": "coef",
    "fp32_finish_delta": False,
    "bf16_conv_out": True,
    "exp": "exact",
    "ftz": False,
    "tanh": "exact",
}

CHOICES = {
    "accum": ("exact", "blas", "sequential", "pairwise", "split_k", "tc_tiles"),
    "norm_style": ("div", "rsqrt", "hf"),
    "rope_table": ("fp32", "fp32_libm", "bf16_hf"),
    "softmax_mode": ("flash", "normalize_first", "online"),
    "exp": ("exact", "libm", "fast"),
    "tanh": ("exact", "libm", "rational"),
    "conv_products": ("coef", "separate_bf16", "separate_fp32"),
}

GROUP = 16


def f32(x) -> np.ndarray:
    """Any storage array (bf16, fp16, fp32, float64 holding representable values) as float32."""
    return np.asarray(np.asarray(x).astype(np.float32), dtype=np.float32)


def bf16(x) -> np.ndarray:
    """float32 -> BF16 (RNE of the float32 value, one rounding) held in float32."""
    return numerics.to_bf16(np.asarray(x, dtype=np.float32)).astype(np.float32)


def _trunc_to_fp32(x) -> np.ndarray:
    """float64 -> float32 rounding toward zero (a tensor core's normalization)."""
    q = numerics.quantum(x, "fp32")
    return (np.trunc(x / q) * q).astype(np.float32)


# --- fast-math intrinsics ------------------------------------------------------------------------

_LOG2E = F32(1.4426950408889634)
_LN2 = F32(0.6931471805599453)
# exp(f ln 2) = sum (f ln2)^k / k!, degree 7 on |f| <= 1/2: truncation ~5e-9, the FP32 Horner
# roundings give ex2.approx's documented ~2 ulp
_EX2_COEF = [F32(float(np.log(2.0)) ** k / float(np.prod(np.arange(1, k + 1)))) for k in range(8)]


def fast_exp(x, ftz: bool = True) -> np.ndarray:
    """CUDA __expf: ex2.approx(x * log2e), the product rounded to FP32 (error ~2 + 1.17|x| ulp);
    ``ftz``: subnormal results flushed to zero (ex2.approx.ftz, what --use_fast_math compiles)."""
    x = np.asarray(x, dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        t = (x * _LOG2E).astype(np.float32)
        fin = np.isfinite(t)
        tc = np.where(fin, np.clip(t, F32(-200), F32(200)), F32(0)).astype(np.float32)
        n = np.rint(tc)
        f = (tc - n).astype(np.float32)  # exact: |f| <= 1/2
        p = np.full_like(f, _EX2_COEF[7])
        for c in _EX2_COEF[6::-1]:
            p = (p * f + c).astype(np.float32)
        out = np.ldexp(p.astype(np.float64), n.astype(np.int64))
        if ftz:
            out = np.where(out < 2.0**-126, 0.0, out)
        out = out.astype(np.float32)  # overflow -> inf; subnormals rounded once
        out = np.where(fin, out, np.where(t > 0, np.inf, np.where(t < 0, 0.0, np.nan))).astype(np.float32)
    return out


_TANH_A = [F32(v) for v in (4.89352455891786e-03, 6.37261928875436e-04, 1.48572235717979e-05,
                              5.12229709037114e-08, -8.60467152213735e-11, 2.00018790482477e-13,
                              -2.76076847742355e-16)]
_TANH_B = [F32(v) for v in (4.89352518554385e-03, 2.26843463243900e-03, 1.18534705686654e-04,
                              1.19825839466702e-06)]


def rational_tanh(x) -> np.ndarray:
    """Eigen's generic_fast_tanh_float (also XLA's): clamp to +-7.9053, odd 13/even 6 rational in FP32."""
    x = np.asarray(x, dtype=np.float32)
    xc = np.clip(x, F32(-7.90531110763549805), F32(7.90531110763549805)).astype(np.float32)
    x2 = (xc * xc).astype(np.float32)
    p = np.full_like(x2, _TANH_A[6])
    for c in _TANH_A[5::-1]:
        p = (p * x2 + c).astype(np.float32)
    p = (p * xc).astype(np.float32)
    q = np.full_like(x2, _TANH_B[3])
    for c in _TANH_B[2::-1]:
        q = (q * x2 + c).astype(np.float32)
    out = (p / q).astype(np.float32)
    return np.where(np.abs(x) < F32(0.0004), x, out).astype(np.float32)


class Engine(ComposedRounds):
    """One NumPy engine, its numerical choices as options (see the module docstring)."""

    def __init__(self, name: str | None = None, reason: str = "", **options):
        unknown = set(options) - set(DEFAULTS)
        if unknown:
            raise TypeError(f"Engine: unknown options {sorted(unknown)}")
        self.opt = {**DEFAULTS, **options}
        for k, allowed_values in CHOICES.items():
            if self.opt[k] not in allowed_values:
                raise ValueError(f"Engine: {k} must be one of {allowed_values}, got {self.opt[k]!r}")
        self.key = name or "engine(" + ", ".join(f"{k}={v}" for k, v in options.items()) + ")"
        self.reason = reason
        self._discrete = Float32Baseline()

    @property
    def name(self) -> str:
        return f"control {self.key}"

    def changed(self) -> dict:
        """The options this engine sets away from the baseline's choices."""
        return {k: v for k, v in self.opt.items() if DEFAULTS[k] != v}

    def __repr__(self) -> str:
        return f"Engine({self.key})"

    # --- arithmetic building blocks --------------------------------------------------------------

    def _r(self, x, on: bool) -> np.ndarray:
        return bf16(x) if on else np.asarray(x, dtype=np.float32)

    def _reduce_last(self, p, gemm: bool = False) -> np.ndarray:
        """Sum float32 terms over the last axis in the configured order (float32 result). Tensor
        cores only run GEMMs: in tc_tiles mode the other reductions are sequential."""
        mode, n = self.opt["accum"], p.shape[-1]
        if mode == "tc_tiles" and not gemm:
            mode = "sequential"
        if mode == "exact":
            if gemm:
                return np.sum(p.astype(np.float64), axis=-1).astype(np.float32)
            mode = "blas"  # the baseline's other sums: NumPy's float32 np.sum
        if n == 0:
            return np.zeros(p.shape[:-1], np.float32)
        if mode == "blas":
            return np.sum(p, axis=-1, dtype=np.float32)
        if mode == "sequential":
            acc = p[..., 0].astype(np.float32)
            for k in range(1, n):
                acc = (acc + p[..., k]).astype(np.float32)
            return acc
        if mode == "pairwise":
            p = p.astype(np.float32)
            while p.shape[-1] > 1:
                if p.shape[-1] % 2:
                    p = np.concatenate([p, np.zeros(p.shape[:-1] + (1,), np.float32)], axis=-1)
                p = (p[..., 0::2] + p[..., 1::2]).astype(np.float32)
            return p[..., 0]
        if mode == "split_k":
            s = int(self.opt["split"])
            acc = np.zeros(p.shape[:-1], np.float32)
            for k0 in range(0, n, s):  # each chunk by the library, the partials in sequence
                acc = (acc + np.sum(p[..., k0:k0 + s], axis=-1, dtype=np.float32)).astype(np.float32)
            return acc
        # tc_tiles: the accumulator and a tile of 16 products aligned to the largest exponent and
        # truncated to 24 bits, summed, the sum truncated to FP32
        p = p.astype(np.float64)
        acc = np.zeros(p.shape[:-1], np.float64)
        for k0 in range(0, n, 16):
            terms = np.concatenate([acc[..., None], p[..., k0:k0 + 16]], axis=-1)
            big = np.max(np.abs(terms), axis=-1, keepdims=True)
            _, e = np.frexp(np.where(big > 0, big, 1.0))
            q = np.ldexp(1.0, (e - 24).astype(np.int64))
            acc = _trunc_to_fp32(np.sum(np.trunc(terms / q) * q, axis=-1)).astype(np.float64)
        return acc.astype(np.float32)

    def _sum(self, x, axis=-1) -> np.ndarray:
        return self._reduce_last(np.moveaxis(np.asarray(x, np.float32), axis, -1))

    def _contract(self, a, b) -> np.ndarray:
        """a [..., M, K] . b [..., N, K] -> [..., M, N], FP32 accumulation in the configured order."""
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        if self.opt["accum"] == "exact":
            return np.matmul(a.astype(np.float64), np.swapaxes(b, -1, -2).astype(np.float64)).astype(np.float32)
        if self.opt["accum"] == "blas":
            return np.matmul(a, np.swapaxes(b, -1, -2)).astype(np.float32)
        if self.opt["accum"] == "tc_tiles":  # products exact (BF16 x BF16 is exact in FP32 anyway)
            prod = a.astype(np.float64)[..., :, None, :] * b.astype(np.float64)[..., None, :, :]
        else:
            prod = a[..., :, None, :] * b[..., None, :, :]
        return self._reduce_last(prod, gemm=True)

    def _linear(self, x, w) -> np.ndarray:
        """x [..., K] @ w[N, K].T -> [..., N]."""
        x = np.asarray(x, np.float32)
        if self.opt["accum"] == "exact":
            return np.matmul(x.astype(np.float64), f32(w).T.astype(np.float64)).astype(np.float32)
        if self.opt["accum"] == "blas":  # one library call on the batched operand, as x @ W.T
            return np.matmul(x, f32(w).T).astype(np.float32)
        lead = x.shape[:-1]
        out = self._contract(x.reshape(-1, x.shape[-1]), f32(w))
        return out.reshape(lead + (out.shape[-1],))

    def _exp(self, x) -> np.ndarray:
        x = np.asarray(x, np.float32)
        if self.opt["exp"] == "fast":
            return fast_exp(x, ftz=self.opt["ftz"])
        with np.errstate(over="ignore", under="ignore"):
            if self.opt["exp"] == "exact":
                return np.exp(x.astype(np.float64)).astype(np.float32)
            return np.exp(x).astype(np.float32)

    def _tanh(self, x) -> np.ndarray:
        if self.opt["tanh"] == "exact":
            return np.tanh(np.asarray(x, np.float64)).astype(np.float32)
        return rational_tanh(x) if self.opt["tanh"] == "rational" else np.tanh(np.asarray(x, np.float32))

    def _rmsnorm(self, x, w, eps) -> np.ndarray:
        """RMSNorm over the last axis; its output is whatever the next kernel reads (FP32 here)."""
        x = np.asarray(x, np.float32)
        ms = (self._sum(x * x) / F32(x.shape[-1])).astype(np.float32)[..., None]
        den = np.sqrt((ms + F32(eps)).astype(np.float32)).astype(np.float32)
        style = self.opt["norm_style"]
        if style == "div":
            normed = (x / den).astype(np.float32)
        else:
            normed = (x * (F32(1) / den).astype(np.float32)).astype(np.float32)
            if style == "hf":
                normed = bf16(normed)
        return (f32(w) * normed).astype(np.float32)

    def _silu(self, x) -> np.ndarray:
        x = np.asarray(x, np.float32)
        return (x / (F32(1) + self._exp(-x))).astype(np.float32)

    def _angles(self, positions, d: int, theta: float) -> np.ndarray:
        """Angles [..., D/2] in float64 (the value the table is computed from)."""
        half = d // 2
        pos = np.asarray(positions, dtype=np.int64)
        inv64 = float(theta) ** (-np.arange(half, dtype=np.float64) * 2.0 / d)
        exact = pos.astype(np.float64)[..., None] * inv64
        if not self.opt["fp32_angles"]:
            return exact
        # HF: inv_freq = 1 / base ** (arange(0, dim, 2).float() / dim) in FP32, freqs = pos.float() * inv_freq
        expo = (np.arange(0, d, 2, dtype=np.int64).astype(np.float32) / F32(d)).astype(np.float32)
        inv32 = (F32(1) / np.power(F32(theta), expo).astype(np.float32)).astype(np.float32)
        small = pos < TWO24
        pos32 = np.where(small, pos, 0).astype(np.float32)  # exact below 2^24
        ang32 = (pos32[..., None] * inv32).astype(np.float32).astype(np.float64)
        return np.where(small[..., None], ang32, exact)

    def _rope(self, x, positions, theta) -> np.ndarray:
        """x [..., heads, D] float32 rotated at positions [...] (split-half, full head)."""
        x = np.asarray(x, np.float32)
        d = x.shape[-1]
        ang = self._angles(positions, d, theta)[..., None, :]  # [..., 1, D/2]
        table = self.opt["rope_table"]
        if table == "fp32_libm":
            red = np.remainder(ang, 2 * np.pi).astype(np.float32)  # an engine reduces big angles first
            cos, sin = np.cos(red).astype(np.float32), np.sin(red).astype(np.float32)
        else:
            cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
        lo, hi = x[..., : d // 2], x[..., d // 2:]
        if table == "bf16_hf":
            cos, sin, lo, hi = bf16(cos), bf16(sin), bf16(lo), bf16(hi)
            out_lo = bf16(bf16(lo * cos) + bf16(-hi * sin))
            out_hi = bf16(bf16(hi * cos) + bf16(lo * sin))
        else:
            out_lo = (lo * cos - hi * sin).astype(np.float32)
            out_hi = (hi * cos + lo * sin).astype(np.float32)
        return np.concatenate([out_lo, out_hi], axis=-1)

    def _head_norm_rope(self, x, w, eps, positions, theta) -> np.ndarray:
        """plain_head_rmsnorm then RoPE on x [..., heads, D]."""
        n = self._rmsnorm(x, w, eps)
        if self.opt["bf16_headnorm_out"]:
            n = bf16(n)
        return self._rope(n, positions, theta)

    # --- feature capture and context ------------------------------------------------------------

    def feature_capture(self, block_outputs, fc_weight, hidden_norm, target_layer_ids, eps):
        r = f32(block_outputs)
        ids = [int(i) for i in target_layer_ids]
        if any(not 0 <= i < r.shape[0] for i in ids):
            raise ValueError(f"feature_capture: block ids {ids} outside 0..{r.shape[0] - 1}")
        s = np.concatenate([r[i] for i in ids], axis=-1)
        projected = self._r(self._linear(s, fc_weight), self.opt["gemm_bf16"])
        return {"context": numerics.storage(self._rmsnorm(projected, hidden_norm, eps), "bf16")}

    def context_kv(self, context, k_cache, v_cache, wk, wv, k_norm, start, eps, theta, head_dim, storage,
                   page_size=None, page_table=None):
        c = f32(context)
        start, rows, d = int(start), c.shape[0], int(head_dim)
        positions = start + np.arange(rows, dtype=np.int64)
        k_raw = self._linear(c, wk).reshape(rows, -1, d)  # FP32 into the head norm: never BF16 (C1)
        k = numerics.storage(self._head_norm_rope(k_raw, k_norm, eps, positions, theta), "bf16")
        v = numerics.storage(bf16(self._linear(c, wv).reshape(k.shape)).astype(np.float64), "fp16")
        k_out, v_out = np.array(k_cache, copy=True), np.array(v_cache, copy=True)
        store_rows(k_out, v_out, positions, k, v, storage, page_table, page_size)
        return {"k_cache": k_out, "v_cache": v_out, "frontier": np.asarray(start + rows, dtype=np.int64)}

    # --- attention --------------------------------------------------------------------------------

    def _attend(self, q, k, v, k_cache, v_cache, frontier, live, window: int) -> np.ndarray:
        """[B, W, Hq, D] float32 before the output's rounding."""
        q, k, v = f32(q), f32(k), f32(v)
        b, w, hq, d = q.shape
        hk = k.shape[2]
        if hq % hk:
            raise ValueError(f"draft_attention: {hq} query heads are not a multiple of {hk} KV heads")
        keys = np.repeat(np.concatenate([f32(k_cache), k], axis=1), hq // hk, axis=2)  # [B, N, Hq, D]
        vals = np.repeat(np.concatenate([f32(v_cache), v], axis=1), hq // hk, axis=2)
        mask = allowed(frontier, live, k_cache.shape[1], w, int(window))[:, None]  # [B, 1, W, N]
        qh, kh = np.transpose(q, (0, 2, 1, 3)), np.transpose(keys, (0, 2, 1, 3))  # [B, Hq, W|N, D]
        vt = np.transpose(vals, (0, 2, 3, 1))  # [B, Hq, D, N]
        finite = np.isfinite(vt)
        vt0 = np.where(finite, vt, F32(0)).astype(np.float32)
        s = (self._contract(qh, kh) * F32(1.0 / np.sqrt(d))).astype(np.float32)  # [B, Hq, W, N]
        if self.opt["attn_scores_bf16"]:
            s = bf16(s)
        s = np.where(mask, s, -np.inf).astype(np.float32)
        mode, rp = self.opt["softmax_mode"], self.opt["bf16_probs"]
        m = np.max(s, axis=-1, keepdims=True)
        m = np.where(np.isfinite(m), m, F32(0)).astype(np.float32)
        p_full = np.where(mask, self._exp((s - m).astype(np.float32)), F32(0)).astype(np.float32)
        if mode == "flash":
            row_sum = self._sum(p_full)[..., None]
            pv = self._contract(self._r(p_full, rp), vt0)
        elif mode == "normalize_first":
            row_sum = np.ones_like(m)
            with np.errstate(invalid="ignore"):  # a row with no allowed key: 0 / 0, zeroed below
                p_full = (p_full / self._sum(p_full)[..., None]).astype(np.float32)
            p_full = np.where(np.isfinite(p_full), p_full, F32(0)).astype(np.float32)
            pv = self._contract(self._r(p_full, rp), vt0)
        else:  # online softmax over key blocks, accumulators rescaled when the running max grows
            blk = int(self.opt["attn_block"])
            n = s.shape[-1]
            run_m = np.full(m.shape, -np.inf, np.float32)
            row_sum = np.zeros(m.shape, np.float32)
            pv = np.zeros(s.shape[:-1] + (d,), np.float32)
            for k0 in range(0, n, blk):
                sb, mb = s[..., k0:k0 + blk], mask[..., k0:k0 + blk]
                new_m = np.maximum(run_m, np.max(sb, axis=-1, keepdims=True)).astype(np.float32)
                safe = np.where(np.isfinite(new_m), new_m, F32(0)).astype(np.float32)
                alpha = np.where(np.isfinite(run_m), self._exp((run_m - safe).astype(np.float32)), F32(0))
                pb = np.where(mb, self._exp((sb - safe).astype(np.float32)), F32(0)).astype(np.float32)
                row_sum = (row_sum * alpha + self._sum(pb)[..., None]).astype(np.float32)
                pv = (pv * alpha + self._contract(self._r(pb, rp), vt0[..., k0:k0 + blk])).astype(np.float32)
                run_m = new_m
        # a non-finite V (FP16 overflow, kept by C1) counts only where it is attended: 0 * inf must
        # not turn a key outside the window into NaN
        for bb, h, j, key in np.argwhere(~finite):
            wgt = p_full[bb, h, :, key]
            with np.errstate(invalid="ignore"):
                pv[bb, h, :, j] += np.where(wgt > 0, wgt * vt[bb, h, j, key], F32(0)).astype(np.float32)
        with np.errstate(invalid="ignore", divide="ignore"):
            out = np.where(row_sum > 0, pv / np.where(row_sum > 0, row_sum, F32(1)), F32(0)).astype(np.float32)
        return np.transpose(out, (0, 2, 1, 3))

    def draft_attention(self, q, k, v, k_cache, v_cache, frontier, live, window):
        return {"out": numerics.storage(self._attend(q, k, v, k_cache, v_cache, frontier, live, window), "bf16")}

    # --- DFlash2 grouped convolution ---------------------------------------------------------------

    def _delta(self, x, proj) -> np.ndarray:
        b, w, h = x.shape
        if h % GROUP:
            raise ValueError(f"grouped_conv: hidden width {h} is not a multiple of {GROUP}")
        return self._linear(x, proj).reshape(b, w, 2, 2, h // GROUP)

    def _conv(self, x, base_side, delta_side) -> np.ndarray:
        """x [B,W,H]; base_side [2 taps, H]; delta_side [B,W,2 taps,G] -> [B,W,H] float32."""
        b, w, h = x.shape
        g = h // GROUP
        xg = np.asarray(x, np.float32).reshape(b, w, g, GROUP)
        products = self.opt["conv_products"]
        if products != "coef":  # base * x + delta * x, each product rounded where the model's dtype rounds it
            r = bf16 if products == "separate_bf16" else (lambda v: np.asarray(v, np.float32))
            bs = f32(base_side).reshape(1, 1, 2, g, GROUP)
            d = f32(delta_side)[..., None]
            tap0 = r(r(bs[:, :, 0] * xg) + r(d[:, :, 0] * xg))
            tap1 = np.zeros_like(tap0)
            prev = xg[:, :-1]  # no preceding tap at column 0
            tap1[:, 1:] = r(r(bs[:, :, 1] * prev) + r(d[:, 1:, 1] * prev))
            return r(tap0 + tap1).reshape(b, w, h)
        coef = (f32(base_side).reshape(1, 1, 2, g, GROUP) + f32(delta_side)[..., None]).astype(np.float32)
        eager = self.opt["conv_eager_bf16"]
        if self.opt["bf16_conv_coef"] or eager:
            coef = bf16(coef)
        tap0 = (coef[:, :, 0] * xg).astype(np.float32)
        tap1 = np.zeros_like(tap0)
        tap1[:, 1:] = coef[:, 1:, 1] * xg[:, :-1]  # no preceding tap at column 0
        if eager:
            out = bf16(bf16(tap0) + bf16(tap1))
        else:
            out = (tap0 + tap1).astype(np.float32)
        return out.reshape(b, w, h)

    def _prepare(self, x, base, proj, in_layer: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(prepared BF16, the finish delta the finish uses, its BF16 copy), all held in float32."""
        delta = self._delta(x, proj)
        rd = self.opt["bf16_delta"]
        d0 = self._r(delta[:, :, 0], (not in_layer) if rd is None else rd)
        stored = bf16(delta[:, :, 1])
        used = np.asarray(delta[:, :, 1], np.float32) if self.opt["fp32_finish_delta"] else stored
        return bf16(self._conv(x, f32(base)[0], d0)), used, stored

    def grouped_conv(self, x, z, base, proj):
        prepared, used, finish_delta = self._prepare(f32(x), base, proj, in_layer=False)
        finished = bf16(self._conv(f32(z), f32(base)[1], used))
        return {
            "prepared": numerics.storage(prepared, "bf16"),
            "finish_delta": numerics.storage(finish_delta, "bf16"),
            "finished": numerics.storage(finished, "bf16"),
        }

    # --- the layer and the block -------------------------------------------------------------------

    def _layer(self, x, k_cache, v_cache, frontier, live, input_norm, wq, wk, wv, q_norm, k_norm, wo, post_norm,
               w_gate, w_up, w_down, eps, theta, head_dim, window, variant, attn_conv_base=None,
               mlp_conv_base=None, attn_conv_proj=None, mlp_conv_proj=None) -> np.ndarray:
        if variant not in ("dflash", "dflash2"):
            raise ValueError(f"draft_layer: variant must be 'dflash' or 'dflash2', got {variant!r}")
        o = self.opt
        conv = variant == "dflash2"
        x = np.asarray(x, np.float32)
        b, w, _ = x.shape
        d = int(head_dim)
        positions = np.asarray(frontier, dtype=np.int64)[:, None] + np.arange(w, dtype=np.int64)
        gem = o["gemm_bf16"]

        n = self._rmsnorm(x, input_norm, eps)
        if conv:
            n, finish_a, _ = self._prepare(self._r(n, o["bf16_branch_norm"]), attn_conv_base, attn_conv_proj,
                                             in_layer=True)
        else:
            n = self._r(n, o["bf16_norm_out"])
        q = self._r(self._linear(n, wq), gem).reshape(b, w, -1, d)
        k = self._r(self._linear(n, wk), gem).reshape(b, w, -1, d)
        v = self._r(self._linear(n, wv), gem).reshape(b, w, -1, d)
        q = self._r(self._head_norm_rope(q, q_norm, eps, positions, theta), o["bf16_qk"])
        k = self._r(self._head_norm_rope(k, k_norm, eps, positions, theta), o["bf16_qk"])
        a = self._r(self._attend(q, k, v, k_cache, v_cache, frontier, live, int(window)), o["bf16_attn_out"])
        out = self._r(self._linear(a.reshape(b, w, -1), wo), gem)
        if conv:
            out = self._r(self._conv(out, f32(attn_conv_base)[1], finish_a), o["bf16_conv_out"])
        y = self._r(x + out, o["bf16_residual"])

        m = self._rmsnorm(y, post_norm, eps)
        if conv:
            m, finish_m, _ = self._prepare(self._r(m, o["bf16_branch_norm"]), mlp_conv_base, mlp_conv_proj,
                                             in_layer=True)
        else:
            m = self._r(m, o["bf16_norm_out"])
        gate = self._r(self._linear(m, w_gate), gem)
        up = self._r(self._linear(m, w_up), gem)
        act = self._r(self._r(self._silu(gate), o["bf16_silu"]) * up, o["bf16_act"])
        z = self._r(self._linear(act, w_down), gem)
        if conv:
            z = self._r(self._conv(z, f32(mlp_conv_base)[1], finish_m), o["bf16_conv_out"])
        return (y + z).astype(np.float32)

    def draft_layer(self, x, **kw):
        return {"x_next": numerics.storage(self._layer(f32(x), **kw), "bf16")}

    LAYER_WEIGHTS = ("input_norm", "wq", "wk", "wv", "q_norm", "k_norm", "wo", "post_norm", "w_gate", "w_up",
                     "w_down")
    CONV_WEIGHTS = ("attn_conv_base", "mlp_conv_base", "attn_conv_proj", "mlp_conv_proj")

    def masked_block(self, anchor, embed, frontier, live, context_k, context_v, final_norm, mask_token_id, windows,
                     eps, theta, head_dim, variant, num_drafts, **weights):
        names = self.LAYER_WEIGHTS + (self.CONV_WEIGHTS if variant == "dflash2" else ())
        if len(windows) != len(weights["wq"]) or len(context_k) != len(weights["wq"]):
            raise ValueError("masked_block: one window and one ring per layer")
        x = f32(embed)[block_tokens(anchor, mask_token_id, int(num_drafts))]
        attn_live = np.asarray(live) if variant == "dflash" else np.full(x.shape[0], x.shape[1])
        for layer, window in enumerate(windows):
            x = self._r(self._layer(x, context_k[layer], context_v[layer], frontier, attn_live, eps=eps,
                                    theta=theta, head_dim=head_dim, window=int(window), variant=variant,
                                    **{n: weights[n][layer] for n in names}), self.opt["bf16_residual"])
        return {"hidden": numerics.storage(self._rmsnorm(x, final_norm, eps)[:, 1:], "bf16")}

    # --- heads and the selector --------------------------------------------------------------------

    @staticmethod
    def _gid(rows: int, shortlist) -> np.ndarray:
        return np.arange(rows, dtype=np.int64) if shortlist is None else np.asarray(shortlist, dtype=np.int64)

    def proposal_head(self, hidden, head, vocab_size, shortlist=None):
        logits = self._linear(f32(hidden), head)  # FP32, never rounded
        gid = self._gid(head.shape[0], shortlist)
        eligible = (gid >= 0) & (gid < int(vocab_size))
        if not eligible.any():
            raise ValueError("proposal_head: no eligible row")
        best = np.argmax(np.where(eligible, logits, -np.inf), axis=-1)  # first maximum (C4)
        return {"tokens": gid[best].astype(np.int32)}

    def candidate_topk(self, hidden, head, vocab_size, top_k, output_multiplier=0.0, softcap=0.0, shortlist=None):
        z = self._linear(f32(hidden), head)  # FP32 logits: the scores are FP32 (C1)
        gid = self._gid(head.shape[0], shortlist)
        eligible = (gid >= 0) & (gid < int(vocab_size))
        if int(eligible.sum()) < int(top_k):
            raise ValueError("candidate_topk: fewer eligible rows than top_k")
        rows = np.argsort(np.where(eligible, -z, np.inf), axis=-1, kind="stable")[..., : int(top_k)]
        u = np.take_along_axis(z, rows, axis=-1).astype(np.float32)
        if output_multiplier > 0:
            u = (u * F32(output_multiplier)).astype(np.float32)
        if softcap > 0:
            c = F32(softcap)
            u = (c * self._tanh((u / c).astype(np.float32))).astype(np.float32)
        return {"scores": u.astype(np.float32), "ids": gid[rows].astype(np.int32)}

    def _softmax(self, x) -> np.ndarray:
        x = np.asarray(x, np.float32)
        e = self._exp((x - np.max(x)).astype(np.float32))
        return (e / self._sum(e)).astype(np.float32)

    def candidate_selector(self, hidden, scores, ids, anchor, w_hidden, w_pred, w_succ, temperature, seed, frontier):
        g = bf16(self._linear(f32(hidden), w_hidden))  # [B, K, R], represented BF16
        u = f32(scores)
        ids = np.asarray(ids, dtype=np.int64)
        w_pred, w_succ = f32(w_pred), f32(w_succ)
        nb, nk, top = ids.shape
        path = np.zeros((nb, nk), np.int32)
        q = np.zeros((nb, nk, top), np.float32)
        for b in range(nb):
            t = F32(np.asarray(temperature)[b])
            pred = int(anchor[b])
            for i in range(nk):
                pg = (w_pred[pred] * g[b, i]).astype(np.float32)  # [R]
                e = (u[b, i] + self._contract(pg[None, :], w_succ[ids[b, i]])[0]).astype(np.float32)  # [k]
                if t <= 0:
                    j = int(np.argmax(e))  # the lowest rank among the maxima (C4)
                    q[b, i, j] = 1
                else:
                    q[b, i] = self._softmax((e / t).astype(np.float32))
                    j, _ = exponential_race(q[b, i].astype(np.float64), np.uint64(seed[b]), int(frontier[b]) + i,
                                            Purpose.DFLASH2_PROPOSAL)
                path[b, i] = j
                pred = int(ids[b, i, j])
        tokens = np.take_along_axis(ids, path[..., None].astype(np.int64), axis=-1)[..., 0].astype(np.int32)
        return {"g": numerics.storage(g, "bf16"), "path": path, "tokens": tokens, "q": q}

    # --- target distribution (C5) ------------------------------------------------------------------

    def _cumsum(self, x) -> np.ndarray:
        """Inclusive scan in FP32: sequential, or blocked (a GPU scan) for the reordering modes."""
        x = np.asarray(x, np.float32)
        if self.opt["accum"] in ("blas", "sequential"):
            return np.cumsum(x, dtype=np.float32)
        s = int(self.opt["split"]) if self.opt["accum"] == "split_k" else 4
        out = np.empty_like(x)
        offset = F32(0)
        for k0 in range(0, x.size, s):
            local = np.cumsum(x[k0:k0 + s], dtype=np.float32)
            out[k0:k0 + s] = (offset + local).astype(np.float32)
            offset = out[min(k0 + s, x.size) - 1]
        return out

    def _row_probs(self, z, prompt_mask, counts, vocab_size, temperature, top_p, min_p, rho, freq, pres, top_k):
        z = f32(z).copy()
        z[int(vocab_size):] = -np.inf
        counts_f = f32(counts)
        seen_out = np.asarray(counts) > 0
        rho = F32(rho)
        if rho != 1:
            seen = (np.asarray(prompt_mask) != 0) | seen_out
            z = np.where(seen, np.where(z > 0, z / rho, z * rho), z).astype(np.float32)
        z = (z - (F32(freq) * counts_f + F32(pres) * seen_out.astype(np.float32))).astype(np.float32)
        t = F32(temperature)
        if t <= 0:
            p = np.zeros_like(z)
            p[int(np.argsort(-z, kind="stable")[0])] = 1
            return p
        z = (z / t).astype(np.float32)
        order = np.argsort(-z, kind="stable")
        keep = np.isfinite(z)
        if int(top_k) > 0:
            keep[order[int(top_k):]] = False

        def softmax_kept(keep):
            zk = np.where(keep, z, -np.inf).astype(np.float32)
            e = np.where(keep, self._exp((zk - np.max(zk[keep])).astype(np.float32)), F32(0)).astype(np.float32)
            return (e / self._sum(e)).astype(np.float32)

        if F32(top_p) < 1:
            kept = order[keep[order]]
            cum = self._cumsum(softmax_kept(keep)[kept])
            n = int(np.searchsorted(cum, F32(top_p), side="left")) + 1
            keep[kept[min(n, kept.size):]] = False
        if F32(min_p) > 0:
            p = softmax_kept(keep)
            keep &= ~(p < (F32(min_p) * np.max(p)).astype(np.float32))
        return softmax_kept(keep)

    def target_distribution(self, logits, prompt_mask, output_counts, temperature, top_p, min_p, repetition_penalty,
                            frequency_penalty, presence_penalty, top_k, vocab_size):
        rows = [self._row_probs(logits[n], prompt_mask[n], output_counts[n], vocab_size, temperature[n], top_p[n],
                                min_p[n], repetition_penalty[n], frequency_penalty[n], presence_penalty[n], top_k[n])
                for n in range(np.shape(logits)[0])]
        probs = np.stack(rows) if rows else np.zeros(np.shape(logits), np.float32)
        return {"probs": probs.astype(np.float32)}

    # --- discrete Ops: no precision choice can move them -------------------------------------------

    def speculative_accept(self, **kw):
        return self._discrete.speculative_accept(**kw)

    def tree_verify(self, **kw):
        return self._discrete.tree_verify(**kw)

    def preview_commit(self, **kw):
        return self._discrete.preview_commit(**kw)
