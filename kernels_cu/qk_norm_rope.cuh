// The fast mode's head RMSNorm + split-half RoPE of one head row held by a warp, shared by fb_qkv_post
// (fast_block.cu) and the attention that does that work itself (fast_attention.cu FA_QKV, session v21): both
// go through these helpers, so the q / k / v bits are the same either way (tests/gpu/test_fast_attention.py).
//
// Per row (spec plain_head_rmsnorm, rope_1d; common.cuh head_norm_rope is the exact mode's form):
//   ss  = the lane's squares in element order (d = lane, lane + 32, ...), as fused multiply-adds, then the
//         warp's butterfly sum (common.cuh warp_sum);
//   inv = rsqrt(ss * (1 / D) + eps) (rsqrtf: the hardware's reciprocal square root, ~2 ulp, as HF / vLLM's
//         torch.rsqrt);  n[d] = w[d] * (x[d] * inv)  (two roundings).
//   Branch-free on purpose: the IEEE division and square root of sessions v5-v20 (x / sqrt(mean + eps), the exact
//   mode's) carry a slow path each, whose branches kept the attention from overlapping one row's latency with the
//   next's (session v21: 16 rows a warp took ~18 us of the attention's critical path at B8 W16).
//   out[d] = n[d] cos - n[d + D/2] sin (first half), n[d] cos + n[d - D/2] sin (second half), n[d] cos rounded
//         first and the partner's product added by one fused multiply-add: the contraction pinned here, so that
//         two kernels cannot contract it differently.
// cos, sin: of pos * inv_freq[i] formed and reduced in double from the exact 64-bit position (common.cuh
// head_norm_rope), rounded to fp32.
#pragma once
#include "common.cuh"

namespace dfl {

__device__ __forceinline__ void rope_cos_sin(long long pos, const double* __restrict__ inv_freq, int i, float& c,
                                             float& s) {
    double s_, c_;
    sincos((double)pos * inv_freq[i], &s_, &c_);
    c = (float)c_;
    s = (float)s_;
}

// ss + x * x, one rounding
__device__ __forceinline__ float sq_acc(float ss, float x) { return __fmaf_rn(x, x, ss); }

// 1 / sqrt(mean + eps) from the lane's partial sum of squares (every lane of the warp calls it)
__device__ __forceinline__ float head_inv(float ss, int D, float eps) {
    return rsqrtf(__fmaf_rn(warp_sum(ss), 1.f / (float)D, eps));
}

__device__ __forceinline__ float head_scale(float w, float x, float inv) { return __fmul_rn(w, __fmul_rn(x, inv)); }

// RoPE of the normalized element n with its partner p (n[d + D/2] for d in the first half, n[d - D/2] after):
// n cos rounded, then -p sin (first half) or p sin added to it by one fused multiply-add (fb_qkv_post's
// contraction before it was pinned here: the same bits as sessions v5-v20)
__device__ __forceinline__ float rope_pair(float n, float p, float c, float s, bool first_half) {
    return __fmaf_rn(first_half ? -p : p, s, __fmul_rn(n, c));
}

}  // namespace dfl
