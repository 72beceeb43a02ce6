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
