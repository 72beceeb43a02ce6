// Non-causal draft attention over the context ring and the query block
// (reference/draft_attention.py; spec "Draft attention is non-causal").
//
// Query row i of batch row b sits at pq = F + i. Keys: context positions p in
// [max(0, F - C), F) read from slot p mod C, and block rows j < live[b] at F + j; a
// local layer (window S > 0) keeps only abs(pk - pq) < S, i.e. distance S - 1 kept and
// S dropped. Both key ranges are contiguous in position, so each block enumerates
// exactly the allowed keys and never evaluates a masked score.
//
// Two kernels with the same masks and the same fp32 arithmetic class (scores, P, row sums
// and PV in fp32; the reference allows P in BF16 for PV, so fp32 is at least as accurate);
// they differ only in summation order. Rows >= live are unspecified and left untouched.
//   draft_attention_fwd: one block per (b, i, q head); warps split the keys, each keeps an
//     online softmax, the warps merge at the end. Any GQA ratio, D <= 256.
//   draft_attention_gqa*: one block per (b, i, KV head) for the G query heads sharing it, so
//     each K/V row is read once per group; lanes own keys of 32-key chunks (whole-row dot
//     products, no per-key shuffles), then own head dimensions for the coalesced PV.
#include "common.cuh"

using dfl::u16;

namespace {

// The allowed keys of one query row: n_ctx context positions from ctx_lo, whose ring slots
// start at slot0 = ctx_lo mod C and advance without a per-key 64-bit modulo (n_ctx <= C),
// then the block rows blk_lo .. blk_lo + total - n_ctx - 1.
struct KeyRange {
    long long n_ctx, total, slot0, blk_lo;
};

__device__ __forceinline__ KeyRange key_range(long long F, int i, int lv, long long C, long long window) {
    const long long pq = F + i;
    long long ctx_lo = F - C > 0 ? F - C : 0;
    long long blk_lo = 0, blk_hi = lv;
    if (window > 0) {
        ctx_lo = dfl::max64(ctx_lo, pq - window + 1);
        blk_lo = dfl::max64(blk_lo, (long long)i - window + 1);
        blk_hi = dfl::min64(blk_hi, (long long)i + window);
    }
    KeyRange r;
    r.n_ctx = F > ctx_lo ? F - ctx_lo : 0;
    r.total = r.n_ctx + (blk_hi > blk_lo ? blk_hi - blk_lo : 0);
    r.slot0 = ctx_lo % C;
    r.blk_lo = blk_lo;
    return r;
}

__device__ __forceinline__ long long ctx_slot(const KeyRange& r, long long kk, long long C) {
    const long long s = r.slot0 + kk;
    return s >= C ? s - C : s;
}

}  // namespace

#define ATT_WARPS 8
#define ATT_MAXC 8  // D <= 32 * ATT_MAXC = 256

// One key of the fwd kernel: this lane's part of q . key (lane owns d = lane + 32c) and its
// value elements. Row offsets are in elements; `row` = Hk * D between slots / block rows.
__device__ __forceinline__ float fwd_key(long long kk, const KeyRange& r, long long C, long long row,
                                        const u16* kcb, const u16* vcb, const float* kb, const float* vb,
                                        const float* qr, int lane, int D, float* val) {
    float dot = 0.f;
    if (kk < r.n_ctx) {
        const long long off = ctx_slot(r, kk, C) * row;
#pragma unroll
        for (int c = 0; c < ATT_MAXC; ++c) {
            const int d = lane + 32 * c;
            val[c] = 0.f;
            if (d < D) {
                dot += qr[c] * dfl::bf16_to_f32(kcb[off + d]);
                val[c] = dfl::f16_to_f32(vcb[off + d]);
            }
        }
    } else {
        const long long off = (r.blk_lo + (kk - r.n_ctx)) * row;
#pragma unroll
        for (int c = 0; c < ATT_MAXC; ++c) {
            const int d = lane + 32 * c;
            val[c] = 0.f;
            if (d < D) {
                dot += qr[c] * kb[off + d];
                val[c] = vb[off + d];
            }
        }
    }
    return dot;
}

__device__ __forceinline__ void online_update(float s, const float* val, float& m, float& l, float* acc) {
    const float m_new = fmaxf(m, s);
    const float corr = expf(m - m_new);  // 0 for the first key (m = -inf)
    const float p = expf(s - m_new);
    l = l * corr + p;
#pragma unroll
    for (int c = 0; c < ATT_MAXC; ++c) acc[c] = acc[c] * corr + p * val[c];
    m = m_new;
}

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
    const KeyRange r = key_range(frontier[b], i, lv, C, window);
    const long long row = (long long)Hk * D;
    const u16* kcb = kc + ((long long)b * C * Hk + hk) * D;
    const u16* vcb = vc + ((long long)b * C * Hk + hk) * D;
    const float* kb = k + ((long long)b * W * Hk + hk) * D;
    const float* vb = v + ((long long)b * W * Hk + hk) * D;

    float qr[ATT_MAXC], acc[ATT_MAXC];
    const long long qo = (((long long)b * W + i) * Hq + h) * D;
#pragma unroll
    for (int c = 0; c < ATT_MAXC; ++c) {
        const int d = lane + 32 * c;
        qr[c] = d < D ? q[qo + d] : 0.f;
        acc[c] = 0.f;
    }
    float m = dfl::neg_inf(), l = 0.f;
    // two keys in flight per warp: their loads and shuffle trees overlap
    for (long long kk = warp; kk < r.total; kk += 2 * ATT_WARPS) {
        const long long k2 = kk + ATT_WARPS;
        const bool two = k2 < r.total;
        float v1[ATT_MAXC], v2[ATT_MAXC];
        const float d1 = fwd_key(kk, r, C, row, kcb, vcb, kb, vb, qr, lane, D, v1);
        const float d2 = two ? fwd_key(k2, r, C, row, kcb, vcb, kb, vb, qr, lane, D, v2) : 0.f;
        const float s1 = dfl::warp_sum(d1) * scale;
        const float s2 = dfl::warp_sum(d2) * scale;
        online_update(s1, v1, m, l, acc);
        if (two) online_update(s2, v2, m, l, acc);
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
// GQA kernel. GM: largest group handled (G = GM exactly when EXACT), CM: D <= 32 * CM.
// Shared memory (floats): qs [G][D], ps [WARPS][G][32], vo [WARPS][32] (8-byte codes; D even
// keeps them aligned), mw/lw [WARPS][G], aw [WARPS][G][D].

#define GQA_WARPS 4

template <int GM, int CM, bool EXACT>
__device__ __forceinline__ void gqa_body(const float* __restrict__ q, const float* __restrict__ k,
                                         const float* __restrict__ v, const u16* __restrict__ kc,
                                         const u16* __restrict__ vc, const long long* __restrict__ frontier,
                                         const int* __restrict__ live, int W, int Hq, int Hk, int D, long long C,
                                         long long window, float scale, float* __restrict__ out_f32,
                                         u16* __restrict__ out_bf16, float* smem) {
    const int G = EXACT ? GM : Hq / Hk;
    const int hk = blockIdx.x % Hk;
    const int i = (blockIdx.x / Hk) % W;
    const int b = blockIdx.x / (Hk * W);
    const int lv = live[b];
    if (i >= lv) return;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float* qs = smem;
    float* ps = qs + G * D;
    long long* vo = (long long*)(ps + GQA_WARPS * G * 32);
    float* mw = (float*)(vo + GQA_WARPS * 32);
    float* lw = mw + GQA_WARPS * G;
    float* aw = lw + GQA_WARPS * G;

    const long long qo = (((long long)b * W + i) * Hq + (long long)hk * G) * D;  // the group's heads are adjacent
    for (int t = threadIdx.x; t < G * D; t += blockDim.x) qs[t] = q[qo + t];
    __syncthreads();

    const KeyRange r = key_range(frontier[b], i, lv, C, window);
    const long long row = (long long)Hk * D;
    const u16* kcb = kc + ((long long)b * C * Hk + hk) * D;
    const u16* vcb = vc + ((long long)b * C * Hk + hk) * D;
    const float* kb = k + ((long long)b * W * Hk + hk) * D;
    const float* vb = v + ((long long)b * W * Hk + hk) * D;
    const long long nchunks = (r.total + 31) / 32;

    float m[GM], l[GM], acc[GM][CM];
#pragma unroll
    for (int g = 0; g < GM; ++g) {
        m[g] = dfl::neg_inf();
        l[g] = 0.f;
#pragma unroll
        for (int c = 0; c < CM; ++c) acc[g][c] = 0.f;
    }
    for (long long ch = warp; ch < nchunks; ch += GQA_WARPS) {
        const long long kk = ch * 32 + lane;
        float s[GM];
#pragma unroll
        for (int g = 0; g < GM; ++g) s[g] = 0.f;
        long long code = 0;  // >= 0: ring row offset (BF16 K / FP16 V); < 0: -(block row offset) - 1
        if (kk < r.total) {
            if (kk < r.n_ctx) {
                const long long off = ctx_slot(r, kk, C) * row;
                code = off;
                if ((D & 7) == 0) {  // 16-byte K rows (8 BF16) and float4 q reads, all aligned
                    const uint4* kr = reinterpret_cast<const uint4*>(kcb + off);
#pragma unroll 4
                    for (int t = 0; t < (D >> 3); ++t) {
                        const uint4 u = kr[t];
                        const float kv[8] = {__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u),
                                             __uint_as_float(u.y << 16), __uint_as_float(u.y & 0xffff0000u),
                                             __uint_as_float(u.z << 16), __uint_as_float(u.z & 0xffff0000u),
                                             __uint_as_float(u.w << 16), __uint_as_float(u.w & 0xffff0000u)};
#pragma unroll
                        for (int g = 0; g < GM; ++g) {
                            if (g < G) {
                                const float4 qa = *reinterpret_cast<const float4*>(qs + g * D + t * 8);
                                const float4 qb = *reinterpret_cast<const float4*>(qs + g * D + t * 8 + 4);
                                float a = s[g];
                                a += qa.x * kv[0];
                                a += qa.y * kv[1];
                                a += qa.z * kv[2];
                                a += qa.w * kv[3];
                                a += qb.x * kv[4];
                                a += qb.y * kv[5];
                                a += qb.z * kv[6];
                                a += qb.w * kv[7];
                                s[g] = a;
                            }
                        }
                    }
                } else {
                    for (int d = 0; d < D; ++d) {
                        const float kv = dfl::bf16_to_f32(kcb[off + d]);
#pragma unroll
                        for (int g = 0; g < GM; ++g)
                            if (g < G) s[g] += qs[g * D + d] * kv;
                    }
                }
            } else {
                const long long off = (r.blk_lo + (kk - r.n_ctx)) * row;
                code = -off - 1;
                for (int d = 0; d < D; ++d) {
                    const float kv = kb[off + d];
#pragma unroll
                    for (int g = 0; g < GM; ++g)
                        if (g < G) s[g] += qs[g * D + d] * kv;
                }
            }
        }
        vo[warp * 32 + lane] = code;
#pragma unroll
        for (int g = 0; g < GM; ++g) {
            if (g < G) {
                const float sg = kk < r.total ? s[g] * scale : dfl::neg_inf();
                // lane 0 of every chunk holds a valid key, so the chunk max is finite
                const float m_new = fmaxf(m[g], dfl::warp_max(sg));
                const float corr = expf(m[g] - m_new);
                const float p = expf(sg - m_new);
                l[g] = l[g] * corr + dfl::warp_sum(p);
                m[g] = m_new;
                ps[(warp * G + g) * 32 + lane] = p;
#pragma unroll
                for (int c = 0; c < CM; ++c) acc[g][c] *= corr;
            }
        }
        __syncwarp();
        const int nvalid = (int)dfl::min64(32, r.total - ch * 32);
#pragma unroll 4
        for (int j = 0; j < nvalid; ++j) {
            const long long o = vo[warp * 32 + j];
            const bool ctx = o >= 0;
            const long long base = ctx ? o : -o - 1;
#pragma unroll
            for (int c = 0; c < CM; ++c) {
                const int d = lane + 32 * c;
                if (d < D) {
                    const float val = ctx ? dfl::f16_to_f32(vcb[base + d]) : vb[base + d];
#pragma unroll
                    for (int g = 0; g < GM; ++g)
                        if (g < G) acc[g][c] += ps[(warp * G + g) * 32 + j] * val;
                }
            }
        }
        __syncwarp();  // ps and vo are rewritten by the next chunk
    }
#pragma unroll
    for (int g = 0; g < GM; ++g) {
        if (g < G) {
            if (lane == 0) {
                mw[warp * G + g] = m[g];
                lw[warp * G + g] = l[g];
            }
#pragma unroll
            for (int c = 0; c < CM; ++c) {
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

// extern "C" entry points (RawModule loads by plain name): the generic kernel (G <= 8, D <= 256)
// and exact-G specialisations for D <= 128, the official heads (G = 4, D = 128) among them.
#define DFL_GQA_KERNEL(NAME, GM, CM, EXACT)                                                                     \
    extern "C" __global__ void __launch_bounds__(GQA_WARPS * 32)                                               \
    NAME(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,                  \
         const u16* __restrict__ kc, const u16* __restrict__ vc, const long long* __restrict__ frontier,         \
         const int* __restrict__ live, int W, int Hq, int Hk, int D, long long C, long long window, float scale, \
         float* __restrict__ out_f32, u16* __restrict__ out_bf16) {                                             \
        extern __shared__ float smem[];                                                                         \
        gqa_body<GM, CM, EXACT>(q, k, v, kc, vc, frontier, live, W, Hq, Hk, D, C, window, scale, out_f32,        \
                                out_bf16, smem);                                                                \
    }

DFL_GQA_KERNEL(draft_attention_gqa, 8, 8, false)
DFL_GQA_KERNEL(draft_attention_gqa_g1_c4, 1, 4, true)
DFL_GQA_KERNEL(draft_attention_gqa_g2_c4, 2, 4, true)
DFL_GQA_KERNEL(draft_attention_gqa_g4_c4, 4, 4, true)
DFL_GQA_KERNEL(draft_attention_gqa_g8_c4, 8, 4, true)
