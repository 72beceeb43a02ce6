// Fast one-pass draft attention (fast mode): flash-decoding over the context ring and
// the query block, on the tensor cores (mma.sync m16n8k16, FP32 accumulation).
//
// Same Op as attention.cu (reference/draft_attention.py): query row i of batch row b sits at
// F + i; keys are the context positions F - n_ctx .. F - 1 (ring slot p mod C) and the block rows
// j < live[b]; a local layer (window S > 0) keeps |p_k - p_q| < S. Everything is computed
// relative to F, so no position is formed (frontiers up to 2^63 - 1 are safe).
//
// Work split. One block (4 warps) per (key split, b * Hk + hk, chunk of 64 query rows). The
// block's query rows are the Hq/Hk heads of the GQA group times the W block columns
// (row R = i * G + g), so every K/V tile is loaded into shared memory once for the whole group.
// Keys come in tiles of 64: ceil(n_ctx / 64) context tiles, where n_ctx = min(F, C, S - 1) is the
// union of what the rows may see (the per-row window is a mask on it), split evenly over the
// grid's x dimension, then one block tile (rows j < live, W <= 64) in the last split. Context
// tiles are double-buffered with cp.async (zero-filled past n_ctx). Warp w owns the 16-row
// m-tile w % MT and the key slice w / MT of each tile (MT = 1, 2, 4 m-tiles: 64, 32 or 16 keys
// per warp); each keeps an online softmax in the exp2 domain; key slices are merged in shared
// memory at the end, splits by fast_attn_combine (or written directly when there is one split).
//
// The wgmma form (WG: FA_WG=1, sm_90a; BF16 bits, D 128, 4 m-tiles = one warpgroup over 64 query rows): each tile's
// QK^T is 8 m64n64k16 steps with Q's A fragments from registers and K read from shared memory by the tensor cores,
// its PV 4 m64n128k16 steps with P from registers and V as the transposed (MN-major) operand; the K/V tiles sit with
// the 128-byte swizzle (el, wg_desc). The accumulators have the mma.sync fragments' layout, so everything between
// the products is the same code, and the k16 steps run in the same order: the same bits (tests check it).
//
// Numerics. Scores: Q . K^T in BF16 x BF16 -> FP32 (exact products). Q given in FP32
// (attention_fast's contract, masked_block's path) is split Q = Q_hi + Q_lo (two BF16 values,
// ~16 significant bits) and multiplied twice; block K in FP32 likewise (Q_hi K_lo added). A pass whose
// operand is zero in every element of the block (Q_lo, K_lo, V_lo of FP32 arrays holding BF16 values, as
// masked_block's are) would add exact zeros and is skipped: the FP32 path then gives the BF16 path's bits.
// P = exp2(s * log2(e)/sqrt(D) - m) in FP32 feeds the FP32 row sum; for PV it is an MMA operand:
// context V is FP16, so P is rounded to FP16 (11 bits, at least as fine as the reference's
// BF16 "probs" down to 2^-13; positive P below FP16's smallest subnormal is kept at 2^-24 so an
// attended non-finite V stays non-finite); block V is BF16 (or FP32 split into hi + lo), and P
// goes in as P_hi + P_lo (BF16 each). Division by the row sum and the BF16 output rounding are
// the exact kernel's (IEEE division, one RNE rounding).
//
// Non-finite V (FP16 overflow is kept, C1). A masked key has P = 0, and 0 * inf is NaN on the
// tensor cores. Keys past n_ctx / live are zero-filled, so only a tile in which a window cuts
// between live rows (a key allowed for one row and not for another) can hit it: such tiles are
// scanned, and when one holds a non-finite V that tile's PV runs on the CUDA cores, adding
// p * v only where p > 0 (the reference's rule). The block tile is scanned always (its P_lo
// may be 0). Rows >= live are written as zeros.
#include "common.cuh"

using dfl::u16;

#define FA_NT 64     // keys per tile
#define FA_WARPS 4   // warps per block
#define FA_ROWS 64   // query rows (W x G) per block
// FA_WG=1 (built for sm_90a only, FastOptions.attention_wgmma): the BF16-bits kernel at D 128 and 64 query rows (MT 4,
// one warpgroup) runs its tiles on wgmma (attn_body's WG). Elsewhere, or on another target, the mma.sync kernel.
#if defined(FA_WG) && FA_WG && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FA_WG_ARCH 1
#else
#define FA_WG_ARCH 0
#endif

namespace fa {

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    unsigned r;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
    return r;
}

__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
// at most n (block-uniform, clamped to 0 .. 4) of the latest groups still pending
__device__ __forceinline__ void cp_wait_n(int n) {
    if (n <= 0)
        cp_wait<0>();
    else if (n == 1)
        cp_wait<1>();
    else if (n == 2)
        cp_wait<2>();
    else if (n == 3)
        cp_wait<3>();
    else
        cp_wait<4>();
}

// four 8x8 b16 matrices; thread t gives the address of row t % 8 of matrix t / 8
__device__ __forceinline__ void ldsm_x4(const void* p, unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(smem_addr(p))
                 : "memory");
}
__device__ __forceinline__ void ldsm_x4_t(const void* p, unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(smem_addr(p))
                 : "memory");
}

// D (16x8 f32) += A (16x16, row) * B (16x8, col)
__device__ __forceinline__ void mma_bf16(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_f16(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// wgmma (WG): a warpgroup's 64 rows, warp w rows 16 w .. 16 w + 15 with the mma.sync m16n8k16 fragment layouts (A
// fragments as qa / pa, the accumulator's n-tile j in x[j][0..3]), so the softmax and the epilogue are unchanged.
// The tiles sit in shared memory with the 128-byte swizzle (attn_body's el): two halves of 64 columns (8 KiB each,
// 1024-byte aligned), each 64 key rows of 128 bytes, the 16-byte chunk c of row r at chunk c ^ (r % 8), so a warp
// copies two whole ring rows without meeting a bank twice. (An unswizzled core-matrix layout, measured
// first: its copies cut the rows into 64-byte pieces or met the same banks 16 times, and every form on it, mma.sync
// too, ran about 1.5x slower.) Descriptor: start address, leading
// byte offset, stride byte offset (each >> 4), layout type 1 (128-byte swizzle) in bits 62-63.
// K as QK's B (K-major: d contiguous): stride = the next 8 keys (1024 B), leading unused (1); the k16 steps of a half
// start 32 bytes apart, the second half 8 KiB on. V as PV's B (MN-major, transposed: d is N): leading = the next 64
// columns (the other half, 8 KiB), stride = the next 8 keys (1024 B); a k16 step is 16 keys (2 KiB). The CUTLASS
// canonical forms ((8,m),(T,2k)):((8T,SBO),(1,T)) and ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO)) under Swizzle<3,4,3>.
__device__ __forceinline__ unsigned long long wg_desc(unsigned addr, unsigned lead, unsigned stride) {
    return (unsigned long long)((addr & 0x3FFFFu) >> 4) | ((unsigned long long)(lead >> 4) << 16) |
           ((unsigned long long)(stride >> 4) << 32) | (1ull << 62);
}
__device__ __forceinline__ void wg_fence() {
#if FA_WG_ARCH
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wg_commit_wait() {
#if FA_WG_ARCH
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#endif
}
// shared memory written by the generic proxy (cp.async, stores) visible to wgmma's reads (the async proxy)
__device__ __forceinline__ void wg_proxy_fence() {
#if FA_WG_ARCH
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
#define FA_ACC4(x, j) "+f"(x[j][0]), "+f"(x[j][1]), "+f"(x[j][2]), "+f"(x[j][3])
#define FA_ACC32(x)                                                                                \
    FA_ACC4(x, 0), FA_ACC4(x, 1), FA_ACC4(x, 2), FA_ACC4(x, 3), FA_ACC4(x, 4), FA_ACC4(x, 5), FA_ACC4(x, 6), \
        FA_ACC4(x, 7)
#define FA_ACC64(x)                                                                                           \
    FA_ACC32(x), FA_ACC4(x, 8), FA_ACC4(x, 9), FA_ACC4(x, 10), FA_ACC4(x, 11), FA_ACC4(x, 12), FA_ACC4(x, 13), \
        FA_ACC4(x, 14), FA_ACC4(x, 15)
#define FA_REGS32                                                                                              \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, " \
    "%23, %24, %25, %26, %27, %28, %29, %30, %31"
#define FA_REGS64                                                                                                 \
    FA_REGS32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, " \
              "%51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
// s (64 rows x 64 keys) = (acc ? s : 0) + A (Q, BF16, registers) . B (K tile, K-major)
__device__ __forceinline__ void wg_qk(float (&s)[8][4], const unsigned (&a)[4], unsigned long long db, int acc) {
#if FA_WG_ARCH
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" FA_REGS32
                 "}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
                 : FA_ACC32(s)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
#endif
}
// o (64 rows x 128 columns) += A (P, FP16 or BF16, registers) . B (V tile, MN-major)
#define FA_WG_PV_ASM(T)                                                                      \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                    \
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32." T "." T " {" FA_REGS64            \
                 "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"                                 \
                 : FA_ACC64(o)                                                                    \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1))
template <bool HALF>
__device__ __forceinline__ void wg_pv(float (&o)[16][4], const unsigned (&a)[4], unsigned long long db) {
#if FA_WG_ARCH
    if constexpr (HALF) {
        FA_WG_PV_ASM("f16");
    } else {
        FA_WG_PV_ASM("bf16");
    }
#endif
}

// two values packed, `lo` in the low half (the lower column / key index), each rounded RNE
__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
__device__ __forceinline__ unsigned pack_f16(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

__device__ __forceinline__ bool finite32(float x);

// x = hi + lo with hi = BF16(x) and lo = BF16(x - hi) (lo = 0 where hi is not finite)
__device__ __forceinline__ void split_pair(float x0, float x1, unsigned& hi, unsigned& lo) {
    const float h0 = dfl::round_bf16(x0), h1 = dfl::round_bf16(x1);
    hi = pack_bf16(h0, h1);
    lo = pack_bf16(finite32(h0) ? x0 - h0 : 0.f, finite32(h1) ? x1 - h1 : 0.f);
}

__device__ __forceinline__ bool finite32(float x) { return (__float_as_uint(x) & 0x7f800000u) != 0x7f800000u; }

__device__ __forceinline__ bool f16_pair_nonfinite(unsigned w) {
    return (w & 0x7c00u) == 0x7c00u || (w & 0x7c000000u) == 0x7c000000u;
}
__device__ __forceinline__ bool bf16_pair_nonfinite(unsigned w) {
    return (w & 0x7f80u) == 0x7f80u || (w & 0x7f800000u) == 0x7f800000u;
}

// s[j] (16 rows x 8 keys each) += Q (16 x DP, A fragments) . K^T for keys key0 .. key0 + 8 NJ - 1
// of a [64][ST] BF16 tile. ldmatrix (no transpose) of K rows: matrices (keys +0, d +0), (keys +0,
// d +8), (keys +8, d +0), (keys +8, d +8) are b0/b1 of two adjacent n-tiles.
template <int KS, int NJ, int ST>
__device__ __forceinline__ void qk_tile(float (&s)[NJ][4], const unsigned (&q)[KS][4], const u16* kbuf, int key0,
                                        int lane) {
    const u16* base = kbuf + (key0 + (lane & 7) + ((lane >> 4) << 3)) * ST + (((lane >> 3) & 1) << 3);
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
#pragma unroll
        for (int np = 0; np < NJ / 2; ++np) {
            unsigned r0, r1, r2, r3;
            ldsm_x4(base + 16 * np * ST + 16 * ks, r0, r1, r2, r3);
            mma_bf16(s[2 * np], q[ks], r0, r1);
            mma_bf16(s[2 * np + 1], q[ks], r2, r3);
        }
    }
}

// o[n] (16 rows x 8 dims each) += P (16 x 8 NJ keys, A fragments per 16 keys) . V, V a [64][ST]
// tile read with ldmatrix.trans: matrices (keys +0, d +0), (keys +8, d +0), (keys +0, d +8),
// (keys +8, d +8) are b0/b1 of the n-tiles d and d + 8.
template <int NJ, int ND, int ST, bool HALF>
__device__ __forceinline__ void pv_tile(float (&o)[ND][4], const unsigned (&pa)[NJ / 2][4], const u16* vbuf, int key0,
                                        int lane) {
    const u16* base = vbuf + (key0 + (lane & 7) + (((lane >> 3) & 1) << 3)) * ST + ((lane >> 4) << 3);
#pragma unroll
    for (int kk = 0; kk < NJ / 2; ++kk) {
#pragma unroll
        for (int np = 0; np < ND / 2; ++np) {
            unsigned r0, r1, r2, r3;
            ldsm_x4_t(base + 16 * kk * ST + 16 * np, r0, r1, r2, r3);
            if (HALF) {
                mma_f16(o[2 * np], pa[kk], r0, r1);
                mma_f16(o[2 * np + 1], pa[kk], r2, r3);
            } else {
                mma_bf16(o[2 * np], pa[kk], r0, r1);
                mma_bf16(o[2 * np + 1], pa[kk], r2, r3);
            }
        }
    }
}

// Online softmax over one tile's scores (already scaled to the exp2 domain and masked to -inf):
// updates m, the thread's partial row sums l and rescales o; leaves P = exp2(s - m) in s.
template <int NJ, int ND>
__device__ __forceinline__ void softmax_step(float (&s)[NJ][4], float (&m)[2], float (&l)[2], float (&o)[ND][4]) {
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
        mx[0] = fmaxf(mx[0], fmaxf(s[j][0], s[j][1]));
        mx[1] = fmaxf(mx[1], fmaxf(s[j][2], s[j][3]));
    }
    float corr[2], mu[2], sum[2] = {0.f, 0.f};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
        mu[h] = mx[h] == dfl::neg_inf() ? 0.f : mx[h];  // a row with no key yet: P = exp2(-inf) = 0
        corr[h] = exp2f(m[h] - mu[h]);                   // 0 while m = -inf
        m[h] = mx[h];
    }
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            s[j][e] = exp2f(s[j][e] - mu[e >> 1]);
            sum[e >> 1] += s[j][e];
        }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) l[h] = l[h] * corr[h] + sum[h];
    if (__all_sync(0xffffffffu, corr[0] == 1.f && corr[1] == 1.f)) return;  // no row maximum moved: o * 1
#pragma unroll
    for (int n = 0; n < ND; ++n) {
        o[n][0] *= corr[0];
        o[n][1] *= corr[0];
        o[n][2] *= corr[1];
        o[n][3] *= corr[1];
    }
}

// The slow PV of a tile that holds a non-finite V where some P is 0: p * v in FP32, only p > 0.
// vval(key, d) reads the tile's V value.
template <int NJ, int ND, int NKW, typename VV>
__device__ __forceinline__ void pv_scalar(float (&o)[ND][4], const float (&p)[NJ][4], float* pw, int key0, int lane,
                                          VV vval) {
    const int g = lane >> 2, tq = lane & 3;
#pragma unroll
    for (int j = 0; j < NJ; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) pw[(g + 8 * (e >> 1)) * NKW + j * 8 + 2 * tq + (e & 1)] = p[j][e];
    __syncwarp();
#pragma unroll 1
    for (int c = 0; c < NKW; ++c) {
        const float p0 = pw[g * NKW + c], p1 = pw[(g + 8) * NKW + c];
#pragma unroll
        for (int n = 0; n < ND; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float pp = (e >> 1) ? p1 : p0;
                if (pp > 0.f) o[n][e] += pp * vval(key0 + c, n * 8 + 2 * tq + (e & 1));
            }
        }
    }
    __syncwarp();
}

// WG: s = Q . K^T over a tile (KS k16 steps of the K-major K tile: 32 bytes apart in a half, 8 KiB a half), then wait
template <int KS>
__device__ __forceinline__ void wg_qk_tile(float (&s)[8][4], const unsigned (&q)[KS][4], const u16* ktile) {
    const unsigned a = smem_addr(ktile);
    wg_fence();
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) wg_qk(s, q[ks], wg_desc(a + (ks >> 2) * 8192 + (ks & 3) * 32, 16, 1024), ks);
    wg_commit_wait();
}
// WG: o += P . V over a tile (KK k16 steps of 16 keys, 2 KiB apart), then wait
template <int KK, bool HALF>
__device__ __forceinline__ void wg_pv_tile(float (&o)[16][4], const unsigned (&p)[KK][4], const u16* vtile) {
    const unsigned a = smem_addr(vtile);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < KK; ++kk) wg_pv<HALF>(o, p[kk], wg_desc(a + 2048 * kk, 8192, 1024));
    wg_commit_wait();
}

// element (row, col) of a K / V tile: [FA_NT][ST] padded rows, or (WG) two swizzled halves of [FA_NT][64]. Where
// attn_body writes the padded index out beside it (the copies' addresses, the block tile's scan and slow PV), that is
// the mma.sync kernels' own expression: with it nvcc emits their code unchanged (the SASS of every variant compared); through tile_el those sites compile to other, equivalent integer code
template <bool WG, int ST>
__device__ __forceinline__ int tile_el(int row, int col) {
    return WG ? (col >> 6) * (FA_NT * 64) + row * 64 + ((((col >> 3) & 7) ^ (row & 7)) << 3) + (col & 7)
              : row * ST + col;
}

template <int DP, int MT, int NS, bool F32, bool WG>
__device__ __forceinline__ void attn_body(const void* __restrict__ qp, const void* __restrict__ kp,
                                          const void* __restrict__ vp, const u16* __restrict__ kc,
                                          const u16* __restrict__ vc, const long long* __restrict__ frontier,
                                          const int* __restrict__ live, int B, int W, int Hq, int Hk, int D,
                                          long long C, long long window, float sl2, int ns,
                                          float* __restrict__ part_o, float2* __restrict__ part_ml,
                                          float* __restrict__ out_f32, u16* __restrict__ out_bf16,
                                          unsigned char* smem) {
    constexpr int KG = FA_WARPS / MT;  // key slices per tile
    constexpr int NKW = FA_NT / KG;    // keys per warp per tile (16 MT)
    constexpr int NJ = NKW / 8;        // score n-tiles per warp
    constexpr int KS = DP / 16;        // k-steps over the head dimension
    constexpr int ND = DP / 8;         // output n-tiles
    constexpr int ST = DP + 8;         // shared row stride in elements (16-byte pad: conflict-free ldmatrix)
    constexpr int QL = F32 ? KS : 1;

    static_assert(NS >= 2 && NS <= 4, "2 to 4 stages (cp_wait_n)");
    static_assert(!WG || (DP == 128 && MT == 4 && FA_WARPS == 4 && !F32),
                  "wgmma: one warpgroup over 64 rows, D 128, BF16 bits");
    // a K / V tile: [FA_NT][ST] rows padded 16 bytes (ldmatrix without conflicts), or (WG) two swizzled halves of
    // [FA_NT][64] (wg_desc's layout, no padding, 1024-byte aligned: the launcher takes D == DP and gives 1 KiB slack)
    constexpr int TILE = WG ? FA_NT * DP : FA_NT * ST;
    constexpr auto el = tile_el<WG, ST>;
    if constexpr (WG) smem += (1024 - (smem_addr(smem) & 1023)) & 1023;
    u16* sK = reinterpret_cast<u16*>(smem);                     // [NS stages][TILE]
    u16* sV = sK + NS * TILE;                                   // [NS stages][TILE]
    // q's rows [16 MT][ST] (BF16 bits, read into registers before the loop) share their region with the
    // per-warp P scratch [FA_WARPS][16][NKW] fp32 (the non-finite V path, inside the loop only): the region
    // is the larger of the two (fast/attention.py smem_bytes), so q costs no occupancy.
    constexpr int QROWS = 16 * MT;
    u16* sQ = sV + NS * TILE;
    float* ps = reinterpret_cast<float*>(sQ);

    const int split = blockIdx.x;
    const int b = blockIdx.y / Hk, hk = blockIdx.y - (blockIdx.y / Hk) * Hk;
    const int G = Hq / Hk, M = W * G;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, tq = lane & 3;
    const int mt = warp % MT, kg = warp / MT;
    const long long F = frontier[b];
    int lve = live[b];
    lve = lve < 0 ? 0 : (lve > W ? W : lve);
    long long nc = F < C ? F : C;
    if (nc < 0) nc = 0;
    if (window > 0 && nc > window - 1) nc = window - 1;
    const int n_ctx = (int)nc;
    const long long slot0 = n_ctx > 0 ? (F - nc) % C : 0;

    // this thread's rows R0 and R0 + 8: context key kk allowed iff lo_ctx < kk < n_ctx, block key j iff
    // blo <= j < bhi (nothing for padding rows and rows >= live)
    const int R0 = blockIdx.z * FA_ROWS + mt * 16 + g;
    int lo_ctx[2], blo[2], bhi[2];
    int lo_live = -1;  // the largest lo_ctx of this thread's live rows
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int R = R0 + 8 * h;
        const int i = R < M ? R / G : W;
        if (i >= lve) {
            lo_ctx[h] = 0x7fffffff;
            blo[h] = 0;
            bhi[h] = 0;
        } else if (window > 0) {
            const long long t = (long long)i + n_ctx - window;  // distance i + n_ctx - kk < S
            lo_ctx[h] = t < -1 ? -1 : (int)t;
            lo_live = lo_ctx[h] > lo_live ? lo_ctx[h] : lo_live;
            blo[h] = (int)dfl::max64(0, (long long)i - window + 1);
            bhi[h] = (int)dfl::min64(lve, (long long)i + window);
        } else {
            lo_ctx[h] = -1;
            blo[h] = 0;
            bhi[h] = lve;
        }
    }

    // zero the pad columns D .. DP of `rows` rows from `base` (the block tile's loaders write d < D only)
    auto zero_pads = [&](u16* base, int rows) {
        const int pc = (DP - D) >> 3;
        for (int idx = threadIdx.x; idx < rows * pc; idx += FA_WARPS * 32) {
            const int row = idx / pc, c = idx - (idx / pc) * pc;
            *reinterpret_cast<uint4*>(base + row * ST + D + 8 * c) = make_uint4(0u, 0u, 0u, 0u);
        }
    };
    // every stage row and sQ's, once; sK's stages, sV's and sQ's rows are contiguous
    if (!WG && D < DP) zero_pads(sK, 2 * NS * FA_NT + QROWS);

    float m[2] = {dfl::neg_inf(), dfl::neg_inf()}, l[2] = {0.f, 0.f};
    float o[ND][4];
#pragma unroll
    for (int n = 0; n < ND; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;

    const int CPR = D >> 3;  // 16-byte chunks per key row
    const int T = (n_ctx + FA_NT - 1) / FA_NT;
    const int t_lo = (int)((long long)T * split / ns), t_hi = (int)((long long)T * (split + 1) / ns);
    const long long row_el = (long long)Hk * D;
    const u16* kcb = kc + ((long long)b * C * Hk + hk) * D;
    const u16* vcb = vc + ((long long)b * C * Hk + hk) * D;
    float* pw = ps + warp * 16 * NKW;
    const int key0 = kg * NKW;

    // a thread copies one 16-byte chunk column (lch) of every RPP-th key row: compile-time strides, no division
    // per chunk; a chunk past D (D < DP) or a key past n_ctx is zero-filled. A warp takes two whole key rows: in WG's
    // swizzled tiles each row's 128-byte halves are whole 128-byte lines, so its writes meet no bank twice
    constexpr int CPRC = DP / 8, RPP = FA_WARPS * 32 / CPRC;
    const int lch = threadIdx.x % CPRC, lrow = threadIdx.x / CPRC;
    const bool ch_ok = lch < CPR;
    auto load_ctx = [&](int t, int st) {
        const int kb0 = t * FA_NT;
#pragma unroll
        for (int j = 0; j < FA_NT / RPP; ++j) {
            const int row = lrow + RPP * j;
            const int kk = kb0 + row;
            const bool ok = kk < n_ctx && ch_ok;
            long long slot = slot0 + (kk < n_ctx ? kk : 0);
            if (slot >= C) slot -= C;
            const long long goff = ok ? slot * row_el + lch * 8 : 0;
            const int so = WG ? st * TILE + el(row, lch * 8) : (st * FA_NT + row) * ST + lch * 8;
            cp_async16(smem_addr(sK + so), kcb + goff, ok ? 16 : 0);
            cp_async16(smem_addr(sV + so), vcb + goff, ok ? 16 : 0);
        }
        cp_commit();
    };

    // The first NS context tiles are issued before the wait: under PDL (kernels_cu/pdl.py) they load while
    // the kernels ahead (fb_qkv_post and, since each of the block's kernels triggers at its top, those
    // before it) still run. The rings, frontier and live are written by none of the block's kernels.
#pragma unroll
    for (int j = 0; j < NS; ++j)
        if (t_lo + j < t_hi) load_ctx(t_lo + j, j);
    dfl::pdl_wait_for(qp, kp, vp);  // q / k / v (the kernel ahead's outputs) are read after this
    dfl::pdl_trigger();             // the combine may be launched; it waits for this grid's completion

    // Q A-fragments: a0 (row g, d 2tq..), a1 (row g+8), a2 (row g, d 2tq+8..), a3 (row g+8, d 2tq+8..).
    // FP32 q: read and split here. BF16 bits: the block's rows go to shared memory (sQ) by 16-byte loads, all
    // in flight at once (not cp.async: waiting for its group would wait for the prefetched tiles too), and come
    // back by ldmatrix (per-element loads with their index arithmetic cost ~5 us before the first tile)
    unsigned qa[KS][4], ql[QL][4];
    bool lo_any = false;
    if constexpr (F32) {
#pragma unroll
        for (int ks = 0; ks < KS; ++ks) {
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                const int R = R0 + 8 * (r & 1);
                const int col = ks * 16 + (r >> 1) * 8 + 2 * tq;
                float2 x = make_float2(0.f, 0.f);
                if (R < M && col < D) {
                    const int i = R / G, gg = R - (R / G) * G;
                    const long long off = (((long long)b * W + i) * Hq + (long long)hk * G + gg) * D + col;
                    x = *reinterpret_cast<const float2*>(reinterpret_cast<const float*>(qp) + off);
                }
                split_pair(x.x, x.y, qa[ks][r], ql[F32 ? ks : 0][r]);
                lo_any |= ql[F32 ? ks : 0][r] != 0u;
            }
        }
    } else {
        constexpr int QP = (QROWS + RPP - 1) / RPP;
        uint4 qv[QP];
#pragma unroll
        for (int j = 0; j < QP; ++j) {
            const int R = blockIdx.z * FA_ROWS + lrow + RPP * j;
            const bool ok = lrow + RPP * j < QROWS && R < M && ch_ok;
            const int i = ok ? R / G : 0, gg = ok ? R - (R / G) * G : 0;
            const long long off = (((long long)b * W + i) * Hq + (long long)hk * G + gg) * D + lch * 8;
            qv[j] = ok ? *reinterpret_cast<const uint4*>(reinterpret_cast<const u16*>(qp) + off)
                       : make_uint4(0u, 0u, 0u, 0u);
        }
#pragma unroll
        for (int j = 0; j < QP; ++j)
            if (lrow + RPP * j < QROWS) *reinterpret_cast<uint4*>(sQ + (lrow + RPP * j) * ST + lch * 8) = qv[j];
        __syncthreads();
#pragma unroll
        for (int ks = 0; ks < KS; ++ks)
            ldsm_x4(sQ + (mt * 16 + (lane & 15)) * ST + ks * 16 + ((lane >> 4) << 3), qa[ks][0], qa[ks][1], qa[ks][2],
                    qa[ks][3]);
    }

    // FP32 q holding BF16 values (masked_block's: fb_qkv_post rounds them) has Q_lo = 0, and its pass would
    // add exact zeros: skipped, same bits (the block tile's K_lo / V_lo passes likewise)
    const bool qlo = F32 ? __syncthreads_or(lo_any) != 0 : false;

    // The block tile (BF16 bits: rows j < live of k / v, cp.async, rows >= live zero-filled) goes into the
    // first stage the context loop frees with no context tile left to load into it (or stage 0 after the loop),
    // so that it loads while the last context tiles are computed.
    const bool has_blk = split == ns - 1 && lve > 0;
    int bst = 0;
    bool blk_issued = false;
    auto issue_block = [&](int st) {
        for (int idx = threadIdx.x; idx < FA_NT * CPR; idx += FA_WARPS * 32) {
            const int row = idx / CPR, ch = idx - (idx / CPR) * CPR;
            const bool ok = row < lve;
            const long long off = (((long long)b * W + (ok ? row : 0)) * Hk + hk) * D + ch * 8;
            const int so = WG ? st * TILE + el(row, ch * 8) : (st * FA_NT + row) * ST + ch * 8;
            cp_async16(smem_addr(sK + so), reinterpret_cast<const u16*>(kp) + off, ok ? 16 : 0);
            cp_async16(smem_addr(sV + so), reinterpret_cast<const u16*>(vp) + off, ok ? 16 : 0);
        }
        cp_commit();
        bst = st;
        blk_issued = true;
    };

    // Tile t is in stage (t - t_lo) % NS; tile t + NS is issued into it once every warp is done with tile t.
    // cp.async groups committed after tile t's at the top of iteration t: tiles t + 1 .. min(t + NS, t_hi) - 1,
    // and the block tile's once issued (it comes after every context tile).
    for (int t = t_lo; t < t_hi; ++t) {
        const int st = (t - t_lo) % NS;
        cp_wait_n((t_hi - 1 - t < NS - 1 ? t_hi - 1 - t : NS - 1) + (blk_issued ? 1 : 0));
        if constexpr (WG) wg_proxy_fence();
        __syncthreads();
        const int kb0 = t * FA_NT;
        const u16* kt = sK + st * TILE;
        const u16* vt = sV + st * TILE;
        // a window cuts this tile between live rows: scan its V for a non-finite value
        bool slow = false;
        if (window > 0 && (long long)kb0 <= (long long)lve - 1 + n_ctx - window) {
            bool found = false;
            for (int idx = threadIdx.x; idx < FA_NT * CPR; idx += FA_WARPS * 32) {
                const int row = idx / CPR, ch = idx - (idx / CPR) * CPR;
                const uint4 u = *reinterpret_cast<const uint4*>(vt + el(row, ch * 8));
                found |= f16_pair_nonfinite(u.x) | f16_pair_nonfinite(u.y) | f16_pair_nonfinite(u.z) |
                         f16_pair_nonfinite(u.w);
            }
            slow = __syncthreads_or(found);
        }
        float s[NJ][4];
#pragma unroll
        for (int j = 0; j < NJ; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
        if constexpr (WG) {
            wg_qk_tile<KS>(s, qa, kt);
        } else {
            qk_tile<KS, NJ, ST>(s, qa, kt, key0, lane);
        }
        if constexpr (F32) {
            if (qlo) qk_tile<KS, NJ, ST>(s, ql, kt, key0, lane);
        }
        // a warp's key slice inside [lo, n_ctx) for every live row it holds is not masked (rows past live
        // are written as zeros whatever their scores)
        if (__all_sync(0xffffffffu, kb0 + key0 + NKW <= n_ctx && kb0 + key0 > lo_live)) {
#pragma unroll
            for (int j = 0; j < NJ; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) s[j][e] *= sl2;
        } else {
#pragma unroll
            for (int j = 0; j < NJ; ++j) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int kk = kb0 + key0 + j * 8 + 2 * tq + (e & 1);
                    const bool ok = kk < n_ctx && kk > lo_ctx[e >> 1];
                    s[j][e] = ok ? s[j][e] * sl2 : dfl::neg_inf();
                }
            }
        }
        softmax_step<NJ, ND>(s, m, l, o);
        if (!slow) {
            unsigned pa[NJ / 2][4];
#pragma unroll
            for (int kk = 0; kk < NJ / 2; ++kk) {
#pragma unroll
                for (int r = 0; r < 4; ++r) {
                    // positive P below FP16's smallest subnormal stays 2^-24 (never 0 * inf)
                    const float* pj = s[2 * kk + (r >> 1)] + 2 * (r & 1);
                    const float p0 = pj[0] > 0.f ? fmaxf(pj[0], 5.9604645e-08f) : 0.f;
                    const float p1 = pj[1] > 0.f ? fmaxf(pj[1], 5.9604645e-08f) : 0.f;
                    pa[kk][r] = pack_f16(p0, p1);
                }
            }
            if constexpr (WG) {
                wg_pv_tile<NJ / 2, true>(o, pa, vt);
            } else {
                pv_tile<NJ, ND, ST, true>(o, pa, vt, key0, lane);
            }
        } else {
            pv_scalar<NJ, ND, NKW>(o, s, pw, key0, lane,
                                   [&](int key, int d) { return dfl::f16_to_f32(vt[el(key, d)]); });
        }
        __syncthreads();  // stage st is refilled now
        if (t + NS < t_hi) {
            load_ctx(t + NS, st);
        } else if (!F32 && has_blk && !blk_issued) {
            issue_block(st);
        }
    }

    // the block tile: rows j < live of k / v (BF16 bits in stage bst, or FP32 split into hi in stage 0, lo in
    // stage 1)
    if (has_blk) {
        const int PPR = D >> 1;
        bool found = false, klo_any = false, vlo_any = false;
        if constexpr (!F32) {
            // BF16 bits: copied as they are, all in flight at once (issued in the loop, or here when this split
            // has no context tile), then V scanned for a non-finite value (a load-store loop here kept one global
            // load latency per iteration on the kernel's critical path: ~20 us whatever the split count)
            if (!blk_issued) issue_block(0);
            cp_wait<0>();
            if constexpr (WG) wg_proxy_fence();
            __syncthreads();
            for (int idx = threadIdx.x; idx < lve * CPR; idx += FA_WARPS * 32) {
                const int row = idx / CPR, ch = idx - (idx / CPR) * CPR;
                const uint4 u = *reinterpret_cast<const uint4*>(sV + (WG ? bst * TILE + el(row, ch * 8)
                                                                          : (bst * FA_NT + row) * ST + ch * 8));
                found |= bf16_pair_nonfinite(u.x) | bf16_pair_nonfinite(u.y) | bf16_pair_nonfinite(u.z) |
                         bf16_pair_nonfinite(u.w);
            }
        } else {  // FP32 rows split into BF16 hi (stage 0) and lo (stage 1) on the way
            for (int idx = threadIdx.x; idx < FA_NT * PPR; idx += FA_WARPS * 32) {
                const int row = idx / PPR, col = 2 * (idx - (idx / PPR) * PPR);
                unsigned kh = 0u, vh = 0u, kl = 0u, vl = 0u;
                if (row < lve) {
                    const long long off = (((long long)b * W + row) * Hk + hk) * D + col;
                    const float2 kx = *reinterpret_cast<const float2*>(reinterpret_cast<const float*>(kp) + off);
                    const float2 vx = *reinterpret_cast<const float2*>(reinterpret_cast<const float*>(vp) + off);
                    split_pair(kx.x, kx.y, kh, kl);
                    split_pair(vx.x, vx.y, vh, vl);
                    found |= !finite32(vx.x) || !finite32(vx.y);
                    klo_any |= kl != 0u;
                    vlo_any |= vl != 0u;
                }
                *reinterpret_cast<unsigned*>(sK + row * ST + col) = kh;
                *reinterpret_cast<unsigned*>(sV + row * ST + col) = vh;
                *reinterpret_cast<unsigned*>(sK + (FA_NT + row) * ST + col) = kl;
                *reinterpret_cast<unsigned*>(sV + (FA_NT + row) * ST + col) = vl;
            }
        }
        const bool slow = __syncthreads_or(found);
        const bool klo = F32 ? __syncthreads_or(klo_any) != 0 : false;
        const bool vlo = F32 ? __syncthreads_or(vlo_any) != 0 : false;
        const u16* bK = sK + bst * TILE;
        const u16* bV = sV + bst * TILE;
        float s[NJ][4];
#pragma unroll
        for (int j = 0; j < NJ; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
        if constexpr (WG) {
            wg_qk_tile<KS>(s, qa, bK);
        } else {
            qk_tile<KS, NJ, ST>(s, qa, bK, key0, lane);
        }
        if constexpr (F32) {
            if (qlo) qk_tile<KS, NJ, ST>(s, ql, bK, key0, lane);
            if (klo) qk_tile<KS, NJ, ST>(s, qa, sK + FA_NT * ST, key0, lane);
        }
#pragma unroll
        for (int j = 0; j < NJ; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int jj = key0 + j * 8 + 2 * tq + (e & 1);
                const bool ok = jj >= blo[e >> 1] && jj < bhi[e >> 1];
                s[j][e] = ok ? s[j][e] * sl2 : dfl::neg_inf();
            }
        }
        softmax_step<NJ, ND>(s, m, l, o);
        if (!slow) {
            unsigned ph[NJ / 2][4], pl[NJ / 2][4];
#pragma unroll
            for (int kk = 0; kk < NJ / 2; ++kk) {
#pragma unroll
                for (int r = 0; r < 4; ++r) {
                    const float* pj = s[2 * kk + (r >> 1)] + 2 * (r & 1);
                    const float h0 = dfl::round_bf16(pj[0]), h1 = dfl::round_bf16(pj[1]);
                    ph[kk][r] = pack_bf16(h0, h1);
                    pl[kk][r] = pack_bf16(pj[0] - h0, pj[1] - h1);
                }
            }
            if constexpr (WG) {
                wg_pv_tile<NJ / 2, false>(o, ph, bV);
                wg_pv_tile<NJ / 2, false>(o, pl, bV);
            } else {
                pv_tile<NJ, ND, ST, false>(o, ph, bV, key0, lane);
                pv_tile<NJ, ND, ST, false>(o, pl, bV, key0, lane);
            }
            if (F32 && vlo) pv_tile<NJ, ND, ST, false>(o, ph, sV + FA_NT * ST, key0, lane);
        } else {
            pv_scalar<NJ, ND, NKW>(o, s, pw, key0, lane, [&](int key, int d) {
                float x = dfl::bf16_to_f32(bV[WG ? el(key, d) : key * ST + d]);
                if (F32) x += dfl::bf16_to_f32(sV[(FA_NT + key) * ST + d]);
                return x;
            });
        }
    }

    // full row sums (the quad of a row), then merge the key slices of each m-tile
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    }
    if (KG > 1) {
        constexpr int REG = 16 * DP + 32;
        float* mb = reinterpret_cast<float*>(smem);
        __syncthreads();  // every warp is done with the tiles
        if (kg > 0) {
            float* r = mb + ((kg - 1) * MT + mt) * REG;
#pragma unroll
            for (int n = 0; n < ND; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) r[(g + 8 * (e >> 1)) * DP + n * 8 + 2 * tq + (e & 1)] = o[n][e];
            if (tq == 0) {
                r[16 * DP + g] = m[0];
                r[16 * DP + g + 8] = m[1];
                r[16 * DP + 16 + g] = l[0];
                r[16 * DP + 16 + g + 8] = l[1];
            }
        }
        __syncthreads();
        if (kg == 0) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = g + 8 * h;
                float mx = m[h];
#pragma unroll
                for (int q = 1; q < KG; ++q) mx = fmaxf(mx, mb[((q - 1) * MT + mt) * REG + 16 * DP + row]);
                const float mu = mx == dfl::neg_inf() ? 0.f : mx;
                const bool own = m[h] > dfl::neg_inf();
                const float w0 = own ? exp2f(m[h] - mu) : 0.f;
                float L = own ? l[h] * w0 : 0.f;
#pragma unroll
                for (int n = 0; n < ND; ++n) {
                    o[n][2 * h] = own ? o[n][2 * h] * w0 : 0.f;
                    o[n][2 * h + 1] = own ? o[n][2 * h + 1] * w0 : 0.f;
                }
#pragma unroll
                for (int q = 1; q < KG; ++q) {
                    const float* r = mb + ((q - 1) * MT + mt) * REG;
                    const float mq = r[16 * DP + row];
                    if (mq > dfl::neg_inf()) {
                        const float wq = exp2f(mq - mu);
                        L += wq * r[16 * DP + 16 + row];
#pragma unroll
                        for (int n = 0; n < ND; ++n) {
                            o[n][2 * h] += wq * r[row * DP + n * 8 + 2 * tq];
                            o[n][2 * h + 1] += wq * r[row * DP + n * 8 + 2 * tq + 1];
                        }
                    }
                }
                m[h] = mx;
                l[h] = L;
            }
        }
    }
    if (kg != 0) return;

#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int R = R0 + 8 * h;
        if (R >= M) continue;
        const int i = R / G, gg = R - (R / G) * G;
        if (ns == 1) {
            const long long ob = (((long long)b * W + i) * Hq + (long long)hk * G + gg) * D;
            const bool zero = i >= lve || !(l[h] > 0.f);
#pragma unroll
            for (int n = 0; n < ND; ++n) {
                const int d = n * 8 + 2 * tq;
                if (d < D) {
                    const float v0 = zero ? 0.f : o[n][2 * h] / l[h];
                    const float v1 = zero ? 0.f : o[n][2 * h + 1] / l[h];
                    if (out_f32) *reinterpret_cast<float2*>(out_f32 + ob + d) = make_float2(v0, v1);
                    if (out_bf16)
                        *reinterpret_cast<unsigned*>(out_bf16 + ob + d) =
                            (unsigned)dfl::f32_to_bf16_rn(v0) | ((unsigned)dfl::f32_to_bf16_rn(v1) << 16);
                }
            }
        } else {
            const long long pr = (((long long)split * B + b) * Hk + hk) * M + R;
#pragma unroll
            for (int n = 0; n < ND; ++n)
                *reinterpret_cast<float2*>(part_o + pr * DP + n * 8 + 2 * tq) = make_float2(o[n][2 * h], o[n][2 * h + 1]);
            if (tq == 0) part_ml[pr] = make_float2(m[h], l[h]);
        }
    }
}

// One warp per query row (b, hk, R): merge the ns partial (m, l, o) of the splits. The loads go in
// batches of CB splits, every load of a batch issued before the first use (an unrolled loop,
// predicated past ns): a loop over splits that loaded (m, l), then o only where m > -inf, waited
// two L2 latencies a split (16 splits at 35B B1: 5.9 us a call, H200). The arithmetic is the
// same operations in the same split order as that loop (o of a split with m = -inf is loaded but
// not used), so the outputs are the same bits. CB is the launcher's (fast/attention.py
// combine_batch): a batch of 8 at 4 splits held registers for 8 and ran slower than the loop.
// Where every split fits one batch (ns <= CB: every call of up to 16 splits), (m, l) and o are loaded together
// and the largest m taken from the loaded (m, l): one L2 latency before the arithmetic instead of two, the same
// operations in the same order.
template <int DP, int CB>
__device__ __forceinline__ void combine_body(const float* __restrict__ part_o, const float2* __restrict__ part_ml,
                                             const int* __restrict__ live, int B, int W, int Hq, int Hk, int D, int ns,
                                             float* __restrict__ out_f32, u16* __restrict__ out_bf16) {
    constexpr int NP = (DP / 2 + 31) / 32;  // column pairs per lane
    dfl::pdl_trigger();  // the kernel after this one may launch (it waits for this grid before reading)
    dfl::pdl_wait_for(part_o, part_ml);  // launched under PDL (kernels_cu/pdl.py): the partials, after this
    const int G = Hq / Hk, M = W * G;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const long long rows = (long long)B * Hk * M;
    const long long id = (long long)blockIdx.x * (blockDim.x >> 5) + warp;
    if (id >= rows) return;
    const int R = (int)(id % M);
    const long long bh = id / M;
    const int b = (int)(bh / Hk), hk = (int)(bh % Hk);
    const int i = R / G, gg = R - (R / G) * G;
    int lve = live[b];
    lve = lve < 0 ? 0 : (lve > W ? W : lve);
    const long long ob = (((long long)b * W + i) * Hq + (long long)hk * G + gg) * D;
    float acc[NP][2];
#pragma unroll
    for (int c = 0; c < NP; ++c) acc[c][0] = acc[c][1] = 0.f;
    float L = 0.f, mx = dfl::neg_inf();
    // a batch of CB splits from s0: every (m, l) and o load issued before the first use, predicated past ns
    auto load = [&](int s0, float2 (&ml)[CB], float2 (&x)[CB][NP]) {
#pragma unroll
        for (int j = 0; j < CB; ++j) {
            const bool in = s0 + j < ns;
            ml[j] = in ? part_ml[(s0 + j) * rows + id] : make_float2(dfl::neg_inf(), 0.f);
            const float* po = part_o + ((s0 + j) * rows + id) * DP;
#pragma unroll
            for (int c = 0; c < NP; ++c) {
                const int d = 2 * (lane + 32 * c);
                x[j][c] = in && d < DP ? *reinterpret_cast<const float2*>(po + d) : make_float2(0.f, 0.f);
            }
        }
    };
    // the batch's splits in order: each one's weight, its l into L and its o into acc (m = -inf: nothing)
    auto add = [&](const float2 (&ml)[CB], const float2 (&x)[CB][NP]) {
#pragma unroll
        for (int j = 0; j < CB; ++j) {
            if (ml[j].x > dfl::neg_inf()) {  // false past ns
                const float w = exp2f(ml[j].x - mx);
                L += w * ml[j].y;
#pragma unroll
                for (int c = 0; c < NP; ++c) {
                    const int d = 2 * (lane + 32 * c);
                    if (d < DP) {
                        acc[c][0] += w * x[j][c].x;
                        acc[c][1] += w * x[j][c].y;
                    }
                }
            }
        }
    };
    if (i < lve && ns <= CB) {  // one batch: the largest m from the (m, l) loaded with o
        float2 ml[CB], x[CB][NP];
        load(0, ml, x);
#pragma unroll
        for (int j = 0; j < CB; ++j)
            if (j < ns) mx = fmaxf(mx, ml[j].x);
        add(ml, x);
    } else if (i < lve) {
        for (int s0 = 0; s0 < ns; s0 += CB) {
            float t[CB];
#pragma unroll
            for (int j = 0; j < CB; ++j) t[j] = s0 + j < ns ? part_ml[(s0 + j) * rows + id].x : 0.f;
#pragma unroll
            for (int j = 0; j < CB; ++j)
                if (s0 + j < ns) mx = fmaxf(mx, t[j]);
        }
        for (int s0 = 0; s0 < ns; s0 += CB) {
            float2 ml[CB], x[CB][NP];
            load(s0, ml, x);
            add(ml, x);
        }
    }
    const bool zero = !(L > 0.f);
#pragma unroll
    for (int c = 0; c < NP; ++c) {
        const int d = 2 * (lane + 32 * c);
        if (d < D) {
            const float v0 = zero ? 0.f : acc[c][0] / L, v1 = zero ? 0.f : acc[c][1] / L;
            if (out_f32) *reinterpret_cast<float2*>(out_f32 + ob + d) = make_float2(v0, v1);
            if (out_bf16)
                *reinterpret_cast<unsigned*>(out_bf16 + ob + d) =
                    (unsigned)dfl::f32_to_bf16_rn(v0) | ((unsigned)dfl::f32_to_bf16_rn(v1) << 16);
        }
    }
}

}  // namespace fa

// extern "C" entry points: fast_attn_d{DP}_m{MT}_s{NS}_{b: BF16 q/k/v bits | f: FP32 q/k/v} and
// fast_attn_combine_d{DP}_c{CB} (CB 2, 4, 8, 16). kernels_cu/fast/attention.py compiles one variant per module
// (-DFA_SINGLE -DFA_DP= -DFA_MT= -DFA_NS= -DFA_F32=); without
// FA_SINGLE every variant is built (CI's nvcc): 2 stages everywhere (the launcher's default), 4 for MT 1 and 2 (a
// forced stage count, FastOptions.attention_stages; 3 builds with -DFA_NS=3).
#define FA_KERNEL(DPV, MTV, NSV, F32V, SUF)                                                                      \
    extern "C" __global__ void __launch_bounds__(FA_WARPS * 32) fast_attn_d##DPV##_m##MTV##_s##NSV##_##SUF(     \
        const void* __restrict__ q, const void* __restrict__ k, const void* __restrict__ v,                      \
        const unsigned short* __restrict__ kc, const unsigned short* __restrict__ vc,                            \
        const long long* __restrict__ frontier, const int* __restrict__ live, int B, int W, int Hq, int Hk, int D, \
        long long C, long long window, float sl2, int ns, float* __restrict__ part_o,                            \
        float2* __restrict__ part_ml, float* __restrict__ out_f32, unsigned short* __restrict__ out_bf16) {      \
        extern __shared__ __align__(16) unsigned char fa_smem[];                                                 \
        fa::attn_body<DPV, MTV, NSV, F32V, FA_WG_ARCH && DPV == 128 && MTV == 4 && !F32V>(                     \
            q, k, v, kc, vc, frontier, live, B, W, Hq, Hk, D, C,                                               \
                                                       window, sl2, ns, part_o, part_ml, out_f32, out_bf16,     \
                                                       fa_smem);                                                \
    }

#define FA_COMBINE_CB(DPV, CBV)                                                                                  \
    extern "C" __global__ void __launch_bounds__(128) fast_attn_combine_d##DPV##_c##CBV(                        \
        const float* __restrict__ part_o, const float2* __restrict__ part_ml, const int* __restrict__ live, int B, \
        int W, int Hq, int Hk, int D, int ns, float* __restrict__ out_f32, unsigned short* __restrict__ out_bf16) { \
        fa::combine_body<DPV, CBV>(part_o, part_ml, live, B, W, Hq, Hk, D, ns, out_f32, out_bf16);               \
    }
#define FA_COMBINE(DPV) FA_COMBINE_CB(DPV, 2) FA_COMBINE_CB(DPV, 4) FA_COMBINE_CB(DPV, 8) FA_COMBINE_CB(DPV, 16)

// one more expansion step, so that macro arguments (FA_DP) are expanded before ## pastes them
#define FA_KERNEL_X(DPV, MTV, NSV, F32V, SUF) FA_KERNEL(DPV, MTV, NSV, F32V, SUF)
#define FA_COMBINE_X(DPV) FA_COMBINE(DPV)

#ifdef FA_SINGLE
#if FA_F32
FA_KERNEL_X(FA_DP, FA_MT, FA_NS, true, f)
#else
FA_KERNEL_X(FA_DP, FA_MT, FA_NS, false, b)
#endif
FA_COMBINE_X(FA_DP)
#else
#define FA_ALL_MT(DPV)              \
    FA_KERNEL(DPV, 1, 2, false, b)  \
    FA_KERNEL(DPV, 2, 2, false, b)  \
    FA_KERNEL(DPV, 4, 2, false, b)  \
    FA_KERNEL(DPV, 1, 2, true, f)   \
    FA_KERNEL(DPV, 2, 2, true, f)   \
    FA_KERNEL(DPV, 4, 2, true, f)   \
    FA_KERNEL(DPV, 1, 4, false, b)  \
    FA_KERNEL(DPV, 2, 4, false, b)  \
    FA_KERNEL(DPV, 1, 4, true, f)   \
    FA_KERNEL(DPV, 2, 4, true, f)   \
    FA_COMBINE(DPV)
FA_ALL_MT(16)
FA_ALL_MT(32)
FA_ALL_MT(64)
FA_ALL_MT(128)
#endif
