// Non-causal draft attention over the context ring and the query block
// (reference/draft_attention.py; spec "Draft attention is non-causal").
//
// Query row i of batch row b sits at pq = F + i. Keys: context positions p in
// [max(0, F - C), F) read from slot p mod C, and block rows j < live[b] at F + j; a
// local layer (window S > 0) keeps only abs(pk - pq) < S, i.e. distance S - 1 kept and
// S dropped. Both key ranges are contiguous in position, so each block enumerates
// exactly the allowed keys and never evaluates a masked score.
//
// One block per (b, i, q head), ATT_WARPS warps splitting the keys; each warp keeps an
// fp32 online softmax (running max, row sum, unnormalized PV) and the warps merge at the
// end. Scores, P, sums and PV stay fp32 (the reference allows P in BF16 for PV; keeping
// it fp32 is at least as accurate). Rows >= live are unspecified and left untouched.
#include "common.cuh"

using dfl::u16;

#define ATT_WARPS 8
#define ATT_MAXC 8  // D <= 32 * ATT_MAXC = 256

extern "C" __global__ void __launch_bounds__(ATT_WARPS * 32)
draft_attention_fwd(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                    const u16* __restrict__ kc, const u16* __restrict__ vc, const long long* __restrict__ frontier,
                    const int* __restrict__ live, int W, int Hq, int Hk, int D, long long C, long long window,
                    float scale, float* __restrict__ out_f32, u16* __restrict__ out_bf16) {
    __shared__ float sm_m[ATT_WARPS], sm_l[ATT_WARPS];
    __shared__ float sm_acc[ATT_WARPS][32 * ATT_MAXC];
    const int h = blockIdx.x % Hq;
    const int i = (blockIdx.x / Hq) % W;
    const int b = blockIdx.x / (Hq * W);
    const int lv = live[b];
    if (i >= lv) return;
    const int hk = h / (Hq / Hk);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

    const long long F = frontier[b];
    const long long pq = F + i;
    long long ctx_lo = F - C > 0 ? F - C : 0;
    long long blk_lo = 0, blk_hi = lv;
    if (window > 0) {
        ctx_lo = dfl::max64(ctx_lo, pq - window + 1);
        blk_lo = dfl::max64(blk_lo, (long long)i - window + 1);
        blk_hi = dfl::min64(blk_hi, (long long)i + window);
    }
    const long long n_ctx = F > ctx_lo ? F - ctx_lo : 0;
    const long long n_blk = blk_hi > blk_lo ? blk_hi - blk_lo : 0;
    const long long total = n_ctx + n_blk;

    float qr[ATT_MAXC], acc[ATT_MAXC];
    const long long qo = (((long long)b * W + i) * Hq + h) * D;
#pragma unroll
    for (int c = 0; c < ATT_MAXC; ++c) {
        const int d = lane + 32 * c;
        qr[c] = d < D ? q[qo + d] : 0.f;
        acc[c] = 0.f;
    }
    float m = dfl::neg_inf(), l = 0.f;
    for (long long kk = warp; kk < total; kk += ATT_WARPS) {
        float dot = 0.f, val[ATT_MAXC];
        if (kk < n_ctx) {
            const long long slot = (ctx_lo + kk) % C;
            const long long base = (((long long)b * C + slot) * Hk + hk) * D;
#pragma unroll
            for (int c = 0; c < ATT_MAXC; ++c) {
                const int d = lane + 32 * c;
                val[c] = 0.f;
                if (d < D) {
                    dot += qr[c] * dfl::bf16_to_f32(kc[base + d]);
                    val[c] = dfl::f16_to_f32(vc[base + d]);
                }
            }
        } else {
            const long long j = blk_lo + (kk - n_ctx);
            const long long base = (((long long)b * W + j) * Hk + hk) * D;
#pragma unroll
            for (int c = 0; c < ATT_MAXC; ++c) {
                const int d = lane + 32 * c;
                val[c] = 0.f;
                if (d < D) {
                    dot += qr[c] * k[base + d];
                    val[c] = v[base + d];
                }
            }
        }
        const float s = dfl::warp_sum(dot) * scale;
        const float m_new = fmaxf(m, s);
        const float corr = expf(m - m_new);  // 0 for the first key (m = -inf)
        const float p = expf(s - m_new);
        l = l * corr + p;
#pragma unroll
        for (int c = 0; c < ATT_MAXC; ++c) acc[c] = acc[c] * corr + p * val[c];
        m = m_new;
    }
    if (lane == 0) {
        sm_m[warp] = m;
        sm_l[warp] = l;
    }
#pragma unroll
    for (int c = 0; c < ATT_MAXC; ++c) sm_acc[warp][lane + 32 * c] = acc[c];
    __syncthreads();
    // Row i < live always has its own block key (distance 0 < S), so the max is finite;
    // warps that saw no key carry m = -inf and weigh exp(-inf) = 0.
    float M = dfl::neg_inf();
#pragma unroll
    for (int w = 0; w < ATT_WARPS; ++w) M = fmaxf(M, sm_m[w]);
    float wt[ATT_WARPS], L = 0.f;
#pragma unroll
    for (int w = 0; w < ATT_WARPS; ++w) {
        wt[w] = expf(sm_m[w] - M);
        L += sm_l[w] * wt[w];
    }
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float o = 0.f;
#pragma unroll
        for (int w = 0; w < ATT_WARPS; ++w) o += sm_acc[w][d] * wt[w];
        o /= L;
        if (out_f32) out_f32[qo + d] = o;
        if (out_bf16) out_bf16[qo + d] = dfl::f32_to_bf16_rn(o);
    }
}

// ---------------------------------------------------------------------------------------------
// The same attention, organised for GQA and long contexts (the default when G = Hq/Hk <= 8 and
// G*D <= 1024): one block per (b, i, KV head) computes all G query heads that share the KV
// head, so each K/V row is read once for G heads, and each lane owns one key of a 32-key chunk
// (full-row dot products, no per-key shuffles). Per chunk a warp updates its online softmax
// (max and sum over the chunk by shuffles), parks P in shared memory, then lanes switch to
// owning head dimensions for the coalesced PV accumulation. Same masks, same fp32 arithmetic
// class as draft_attention_fwd; only the summation order differs.

#define GQA_WARPS 4
#define GQA_GMAX 8
#define GQA_CMAX 8  // D <= 256

extern "C" __global__ void __launch_bounds__(GQA_WARPS * 32)
draft_attention_gqa(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                    const u16* __restrict__ kc, const u16* __restrict__ vc, const long long* __restrict__ frontier,
                    const int* __restrict__ live, int W, int Hq, int Hk, int D, long long C, long long window,
                    float scale, float* __restrict__ out_f32, u16* __restrict__ out_bf16) {
    extern __shared__ float smem[];
    const int G = Hq / Hk;
    const int hk = blockIdx.x % Hk;
    const int i = (blockIdx.x / Hk) % W;
    const int b = blockIdx.x / (Hk * W);
    const int lv = live[b];
    if (i >= lv) return;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float* qs = smem;                                    // [G][D]
    float* ps = qs + G * D;                              // [WARPS][G][32] chunk probabilities
    long long* vo = (long long*)(ps + GQA_WARPS * G * 32);  // [WARPS][32] value row offsets (D even: aligned)
    float* mw = (float*)(vo + GQA_WARPS * 32);           // [WARPS][G]
    float* lw = mw + GQA_WARPS * G;                      // [WARPS][G]
    float* aw = lw + GQA_WARPS * G;                      // [WARPS][G][D]

    const long long qo = (((long long)b * W + i) * Hq + (long long)hk * G) * D;  // G heads are contiguous
    for (int t = threadIdx.x; t < G * D; t += blockDim.x) qs[t] = q[qo + t];
    __syncthreads();

    const long long F = frontier[b];
    const long long pq = F + i;
    long long ctx_lo = F - C > 0 ? F - C : 0;
    long long blk_lo = 0, blk_hi = lv;
    if (window > 0) {
        ctx_lo = dfl::max64(ctx_lo, pq - window + 1);
        blk_lo = dfl::max64(blk_lo, (long long)i - window + 1);
        blk_hi = dfl::min64(blk_hi, (long long)i + window);
    }
    const long long n_ctx = F > ctx_lo ? F - ctx_lo : 0;
    const long long n_blk = blk_hi > blk_lo ? blk_hi - blk_lo : 0;
    const long long total = n_ctx + n_blk;
    const long long nchunks = (total + 31) / 32;

    float m[GQA_GMAX], l[GQA_GMAX], acc[GQA_GMAX][GQA_CMAX];
#pragma unroll
    for (int g = 0; g < GQA_GMAX; ++g) {
        m[g] = dfl::neg_inf();
        l[g] = 0.f;
#pragma unroll
        for (int c = 0; c < GQA_CMAX; ++c) acc[g][c] = 0.f;
    }
    for (long long ch = warp; ch < nchunks; ch += GQA_WARPS) {
        const long long kk = ch * 32 + lane;
        float s[GQA_GMAX];
#pragma unroll
        for (int g = 0; g < GQA_GMAX; ++g) s[g] = 0.f;
        long long code = 0;
        if (kk < total) {
            if (kk < n_ctx) {
                const long long off = (((long long)b * C + (ctx_lo + kk) % C) * Hk + hk) * D;
                code = off;
                if ((D & 7) == 0) {  // 16-byte rows: 8 BF16 per load (offsets are multiples of D)
                    const uint4* kr = reinterpret_cast<const uint4*>(kc + off);
                    for (int t = 0; t < (D >> 3); ++t) {
                        const uint4 u = kr[t];
                        const unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
                        for (int e = 0; e < 8; ++e) {
                            const float kv = __uint_as_float(e & 1 ? (w[e >> 1] & 0xffff0000u) : (w[e >> 1] << 16));
                            const int d = t * 8 + e;
#pragma unroll
                            for (int g = 0; g < GQA_GMAX; ++g)
                                if (g < G) s[g] += qs[g * D + d] * kv;
                        }
                    }
                } else {
                    for (int d = 0; d < D; ++d) {
                        const float kv = dfl::bf16_to_f32(kc[off + d]);
#pragma unroll
                        for (int g = 0; g < GQA_GMAX; ++g)
                            if (g < G) s[g] += qs[g * D + d] * kv;
                    }
                }
            } else {
                const long long off = (((long long)b * W + blk_lo + (kk - n_ctx)) * Hk + hk) * D;
                code = -off - 1;  // negative: a query-block row (fp32 k/v)
                for (int d = 0; d < D; ++d) {
                    const float kv = k[off + d];
#pragma unroll
                    for (int g = 0; g < GQA_GMAX; ++g)
                        if (g < G) s[g] += qs[g * D + d] * kv;
                }
            }
        }
        vo[warp * 32 + lane] = code;
#pragma unroll
        for (int g = 0; g < GQA_GMAX; ++g) {
            if (g < G) {
                const float sg = kk < total ? s[g] * scale : dfl::neg_inf();
                // lane 0 of every chunk holds a valid key, so the chunk max is finite
                const float m_new = fmaxf(m[g], dfl::warp_max(sg));
                const float corr = expf(m[g] - m_new);
                const float p = expf(sg - m_new);
                l[g] = l[g] * corr + dfl::warp_sum(p);
                m[g] = m_new;
                ps[(warp * G + g) * 32 + lane] = p;
#pragma unroll
                for (int c = 0; c < GQA_CMAX; ++c) acc[g][c] *= corr;
            }
        }
        __syncwarp();
        const int nvalid = (int)dfl::min64(32, total - ch * 32);
        for (int j = 0; j < nvalid; ++j) {
            const long long o = vo[warp * 32 + j];
            const bool ctx = o >= 0;
            const long long base = ctx ? o : -o - 1;
#pragma unroll
            for (int c = 0; c < GQA_CMAX; ++c) {
                const int d = lane + 32 * c;
                if (d < D) {
                    const float val = ctx ? dfl::f16_to_f32(vc[base + d]) : v[base + d];
#pragma unroll
                    for (int g = 0; g < GQA_GMAX; ++g)
                        if (g < G) acc[g][c] += ps[(warp * G + g) * 32 + j] * val;
                }
            }
        }
        __syncwarp();  // ps and vo are rewritten by the next chunk
    }
#pragma unroll
    for (int g = 0; g < GQA_GMAX; ++g) {
        if (g < G) {
            if (lane == 0) {
                mw[warp * G + g] = m[g];
                lw[warp * G + g] = l[g];
            }
#pragma unroll
            for (int c = 0; c < GQA_CMAX; ++c) {
                const int d = lane + 32 * c;
                if (d < D) aw[(warp * G + g) * D + d] = acc[g][c];
            }
        }
    }
    __syncthreads();
    for (int t = threadIdx.x; t < G * D; t += blockDim.x) {
        const int g = t / D;
        float M = dfl::neg_inf();
        for (int w = 0; w < GQA_WARPS; ++w) M = fmaxf(M, mw[w * G + g]);
        float L = 0.f, o = 0.f;
        for (int w = 0; w < GQA_WARPS; ++w) {
            const float e = expf(mw[w * G + g] - M);  // a warp that saw no key: exp(-inf) = 0
            L += lw[w * G + g] * e;
            o += aw[(w * G + g) * D + (t - g * D)] * e;
        }
        o /= L;
        if (out_f32) out_f32[qo + t] = o;
        if (out_bf16) out_bf16[qo + t] = dfl::f32_to_bf16_rn(o);
    }
}
