// Fast mode: the DFlash2 candidate selector of the proposal round (kernels_cu/fast/round.py),
// with the exact mode's numerics (kernels_cu/exact/select.cu bf16_rowdot and selector_walk):
//
//   fast_rowdot_*    g = BF16(W_hidden h) (or fp32 out): the exact BF16 x BF16 products summed
//                    in double, one rounding at the end (select.cu bf16_round_bits_f64 /
//                    f64_to_f32_rn). Only the order of the double sum differs from bf16_rowdot.
//   fast_selector_walk   the conditional walk, BITWISE equal to select.cu selector_walk.
//
// Why the rowdot result equals bf16_rowdot's. Every BF16 x BF16 product has at most 16
// significant bits and is exact in double, so both kernels compute the same exact sum S
// with rounding errors of at most about H * 2^-53 * sum |x_h w_h| (double), in different
// orders, then round to BF16 once. The two BF16 results differ only if S lies that close to
// a BF16 rounding boundary (a midpoint between two BF16 neighbours), i.e. within ~2^-40 of
// S's own size for typical rows: astronomically rare on real data. Where every partial sum
// is exact (products within ~36 binades of each other: nearly every real row), both sums
// ARE S and the results are equal always, ties included (both round S itself, to even).
// Inf and NaN inputs give the same class of result in any order. The GPU test checks
// equality bit for bit on random rows at the real shapes and on hand-built midpoints.
//
// How the rowdot is faster. bf16_rowdot spends one warp per output on scalar 2-byte loads and
// one double FMA per product. Here the products run on the FP64 tensor cores:
// mma.m8n8k4.f64 (DMMA), 8x8 outputs per instruction, fragments loaded straight from global
// memory with 16-byte loads (8 BF16 of one row; the k index of the fragment is a permutation
// of h, which the sum does not care about), converted to double exactly (below). A warp
// owns TMW x TNW tiles of 8x8 outputs over a slice of h; WK warps of a block and the CS
// blocks of a cluster (__cluster_dims__) split h, and the partial sums meet in shared memory
// and, across the cluster, in distributed shared memory, always added in the same order
// (deterministic, graph replay equals eager). No scratch buffer, one launch.
// Measured on the H200 (CUPTI, H 5120, R 256): 7 rows 9.4 -> 7.0 us (cold L2 15.3 -> 8.4),
// 120 rows 87 -> 29 us. Six tilings (warp tiles 8x32 to 32x32, 128 or 256 threads, 1 to 7
// blocks per SM's worth of warps, clusters of 4 or 8, one or two units of loads in flight)
// all took 29-39 us at 120 rows although their load traffic, conversion work and occupancy
// differ by 2-3x. Hopper's own f64 shape (mma.m16n8k16, DMMA.16x8x16 in the SASS: eight times
// an m8n8k4's products per instruction, x tiles taken in pairs) measured, cold L2: 120 rows 30.1 -> 24.0 us with m_v's
// tiling (m16_v; 32-row tiles the same, a 1 x 8-warp block 41.8), 7 rows 8.3 -> 9.7 (16-row
// tiles for 7 rows: s_v stays). So the MMA rate was not what held the rowdot at ~29 us; what
// does was not measured (no profile of this kernel). Both shapes give bf16_rowdot's bits.
//
// How the walk is fast (bitwise equal). selector_walk computes, per step, k energies after
// the predecessor is known, with a dependent load of the predecessor's w_pred row, and
// thread 0 decides. But the predecessor of step i is one of the k candidates of step i - 1
// (or the anchor at i = 0), so all k x k energies E_i[p][c] of a step are computed up front,
// in parallel, each with exactly selector_walk's arithmetic (same operands, same per-lane
// fma order, same butterfly, same fadd of the score): the values are bit for bit the ones
// selector_walk would compute for whichever predecessor the walk picks. The 8 blocks of a
// cluster (one cluster per batch row) compute the steps' tables and store them into block
// 0's shared memory; block 0's first warp then walks: per step one row of the table, a
// warp-wide lowest-rank argmax (T <= 0) or the double softmax (sum in rank order, as
// selector_walk) and a warp-wide exponential race. (The products keep selector_walk's order,
// fmul(w_pred, g) first: BF16 x BF16 x BF16 is exact in fp32 only without underflow or
// overflow, and under -ftz a product flushed in one order need not be in the other.) The
// race's log(-log U) terms depend only on (seed, frontier + i, rank) and are computed up
// front by the same code race_score runs (race_score is log(weight) - log(-log U), two
// separately rounded logs and one subtraction; nvcc emits exactly that sub.f64 in both
// kernels, so the score is the same double). 512 threads per block (measured faster than 256).
// Measured on the H200 (CUPTI, k 16, R 256, T 0 / T 1): B1 K7 24 -> 11 / 117 -> 19 us,
// B8 K15 53 -> 21 / 251 -> 39 us; equal bit for bit in every case.
#include "philox.cuh"
#include "select_common.cuh"

using dflash::u32;
using dflash::u64;
typedef unsigned short u16;

// Every kernel here runs on thread-block clusters, which need sm_90: below it (NVRTC builds for the
// device at hand) the module is empty and kernels_cu/fast/round.py uses select.cu's kernels
// (fast_block.cluster_capable()).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900

#define FS_CLUSTER 8
#define FS_WALK_THREADS 512
#define FS_WALK_KMAX 32   // one lane per candidate in the walk's decision
#define FS_WALK_RT 8      // R <= 8 * 32: each lane's share of a row in registers
#define FS_NONE 0x7fffffff

namespace {

using selc::bf16_round_bits_f64;
using selc::bf16_value;
using selc::warp_sum;

// --- cluster helpers (inline PTX: no cooperative_groups header needed under NVRTC) -----------

__device__ __forceinline__ u32 cluster_rank() {
    u32 r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}

// Every thread of every block of the cluster arrives; release/acquire orders the shared
// memory writes (local and remote) before the barrier with the reads after it.
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

__device__ __forceinline__ u32 smem_u32(const void* p) {
    u32 r;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
    return r;
}

__device__ __forceinline__ u32 map_rank(u32 addr, u32 rank) {
    u32 r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(addr), "r"(rank));
    return r;
}

__device__ __forceinline__ double ld_cluster_f64(u32 addr) {
    double v;
    asm volatile("ld.shared::cluster.f64 %0, [%1];" : "=d"(v) : "r"(addr) : "memory");
    return v;
}

__device__ __forceinline__ void st_cluster_f32(u32 addr, float v) {
    asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(addr), "f"(v) : "memory");
}

__device__ __forceinline__ void st_cluster_f64(u32 addr, double v) {
    asm volatile("st.shared::cluster.f64 [%0], %1;" ::"r"(addr), "d"(v) : "memory");
}

__device__ __forceinline__ void st_cluster_s32(u32 addr, int v) {
    asm volatile("st.shared::cluster.s32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
}

// --- rowdot ------------------------------------------------------------------------------

// BF16 (as the fp32 bit pattern f, low 16 bits zero) -> double, exactly, for every finite
// value: move sign, exponent and mantissa into double position with the exponent field
// unchanged (the double then holds v * 2^-896: a normal double for a normal BF16, a double
// subnormal 0.m * 2^-1022 for a BF16 subnormal 0.m * 2^-126, +-0 for +-0), then scale by
// 2^896 (a power of two: exact). Inf and NaN (exponent field 255) must not come here: the
// caller converts a fragment holding one with cvt (f32_to_f64) instead.
__device__ __forceinline__ double bf16f_to_f64_finite(u32 f) {
    const u32 hi = (f & 0x80000000u) | ((f >> 3) & 0x0fffffffu);
    return __hiloint2double((int)hi, 0) * __longlong_as_double(0x77f0000000000000ll);  // * 2^896
}

__device__ __forceinline__ u32 half_bits(const uint4& v, int j) {  // fp32 pattern of BF16 j of 8
    const u32 wd = (j >> 1) == 0 ? v.x : (j >> 1) == 1 ? v.y : (j >> 1) == 2 ? v.z : v.w;
    return (j & 1) ? (wd & 0xffff0000u) : (wd << 16);
}

__device__ __forceinline__ bool has_special(const uint4& v) {  // an exponent field of 255 (inf, NaN)
    return (__vcmpeq2(v.x & 0x7f807f80u, 0x7f807f80u) | __vcmpeq2(v.y & 0x7f807f80u, 0x7f807f80u) |
            __vcmpeq2(v.z & 0x7f807f80u, 0x7f807f80u) | __vcmpeq2(v.w & 0x7f807f80u, 0x7f807f80u)) != 0u;
}

__device__ __forceinline__ void dmma(double& c0, double& c1, double a, double b) {
    asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0,%1}, {%2}, {%3}, {%0,%1};"
                 : "+d"(c0), "+d"(c1)
                 : "d"(a), "d"(b));
}

// Hopper's own f64 shape (sm_90): 16 x 8 outputs, k 16, eight times an m8n8k4's work per instruction.
// Fragments (PTX ISA, mma.m16n8k16 .f64; lane = 4 g + t): a[i] is A(g + 8 (i % 2), t + 4 (i / 2)),
// b[i] is B(t + 4 i, g), c[i] is C(g + 8 (i / 2), 2 t + i % 2).
__device__ __forceinline__ void dmma16(double& c0, double& c1, double& c2, double& c3, const double (&a)[8],
                                       const double (&b)[4]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f64.f64.f64.f64 {%0,%1,%2,%3}, {%4,%5,%6,%7,%8,%9,%10,%11}, "
        "{%12,%13,%14,%15}, {%0,%1,%2,%3};"
        : "+d"(c0), "+d"(c1), "+d"(c2), "+d"(c3)
        : "d"(a[0]), "d"(a[1]), "d"(a[2]), "d"(a[3]), "d"(a[4]), "d"(a[5]), "d"(a[6]), "d"(a[7]), "d"(b[0]),
          "d"(b[1]), "d"(b[2]), "d"(b[3]));
}

// 8 BF16 of row p starting at h (zeros past H or for an absent row).
template <bool VEC>
__device__ __forceinline__ uint4 load8(const u16* __restrict__ p, bool valid, int h, int H) {
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (!valid || h >= H) return v;
    if constexpr (VEC) {
        return *reinterpret_cast<const uint4*>(p + h);  // H % 8 == 0: h + 8 <= H
    } else {
        u32 e[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) e[j] = h + j < H ? (u32)p[h + j] : 0u;
        v.x = e[0] | (e[1] << 16);
        v.y = e[2] | (e[3] << 16);
        v.z = e[4] | (e[5] << 16);
        v.w = e[6] | (e[7] << 16);
        return v;
    }
}

// One unit = 32 consecutive h. Lane (r8 = lane / 4, q = lane % 4) holds h = 32u + 8q .. + 7 of
// row r8 of every tile (8 BF16 in v[i]), for the TMW tiles of x rows and the TNW tiles of w rows.
// The fragments' k index is a permutation of h, the same on both sides (the sum does not care):
//   KS 4 (mma.m8n8k4): step j of 8 multiplies element j, at A(r8, q) and B(q, r8);
//   KS 16 (mma.m16n8k16, TMW even: x tiles 2p and 2p + 1 are one 16-row fragment): step s of 2
//   multiplies elements 4s .. 4s + 3, element 4s + i at A(r8 [+ 8], q + 4i) and B(q + 4i, r8).
// CVT: the element -> double conversion (finite BF16 only, or any value).
template <int TMW, int TNW, int KS, typename CVT>
__device__ __forceinline__ void unit_steps(const uint4 (&v)[TMW + TNW], double (&acc)[TMW][TNW][2], CVT cvt) {
    if constexpr (KS == 4) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            double a[TMW], b[TNW];
#pragma unroll
            for (int i = 0; i < TMW; ++i) a[i] = cvt(half_bits(v[i], j));
#pragma unroll
            for (int i = 0; i < TNW; ++i) b[i] = cvt(half_bits(v[TMW + i], j));
#pragma unroll
            for (int tm = 0; tm < TMW; ++tm)
#pragma unroll
                for (int tn = 0; tn < TNW; ++tn) dmma(acc[tm][tn][0], acc[tm][tn][1], a[tm], b[tn]);
        }
    } else {
        static_assert(KS == 16 && TMW % 2 == 0, "m16n8k16 takes x tiles in pairs");
#pragma unroll
        for (int s = 0; s < 2; ++s) {
            double a[TMW / 2][8], b[TNW][4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
#pragma unroll
                for (int p = 0; p < TMW / 2; ++p) {
                    a[p][2 * i] = cvt(half_bits(v[2 * p], 4 * s + i));
                    a[p][2 * i + 1] = cvt(half_bits(v[2 * p + 1], 4 * s + i));
                }
#pragma unroll
                for (int tn = 0; tn < TNW; ++tn) b[tn][i] = cvt(half_bits(v[TMW + tn], 4 * s + i));
            }
#pragma unroll
            for (int p = 0; p < TMW / 2; ++p)
#pragma unroll
                for (int tn = 0; tn < TNW; ++tn)
                    dmma16(acc[2 * p][tn][0], acc[2 * p][tn][1], acc[2 * p + 1][tn][0], acc[2 * p + 1][tn][1], a[p],
                           b[tn]);
        }
    }
}

template <int TMW, int TNW, int KS>
__device__ __forceinline__ void unit_mma(const uint4 (&v)[TMW + TNW], double (&acc)[TMW][TNW][2]) {
    bool special = false;
#pragma unroll
    for (int i = 0; i < TMW + TNW; ++i) special |= has_special(v[i]);
    if (__any_sync(0xffffffffu, special))  // warp-uniform: mma.sync needs the whole warp
        unit_steps<TMW, TNW, KS>(v, acc, [](u32 f) { return dflash::f32_to_f64(__uint_as_float(f)); });
    else
        unit_steps<TMW, TNW, KS>(v, acc, [](u32 f) { return bf16f_to_f64_finite(f); });
}

// Block: WN x WK warps; warp (wn, wk) owns the TMW x TNW tiles at rows blockIdx.z * 8 TMW,
// columns blockIdx.y * 8 TNW WN + wn * 8 TNW; h is split over G = CS WK slices (units of 32),
// slice rank * WK + wk (CS blocks per cluster). UB units per load batch, two batches in
// registers (the next batch's loads fly while the current one multiplies).
template <int TMW, int TNW, int WN, int WK, int UB, int CS, bool VEC, int KS>
__device__ __forceinline__ void rowdot_body(const u16* __restrict__ x, const u16* __restrict__ w, int M, int N, int H,
                                            float* __restrict__ out, u16* __restrict__ out_bits) {
    constexpr int NT = 32 * WN * WK, BM = 8 * TMW, BN = 8 * TNW * WN, G = CS * WK, NV = TMW + TNW;
    __shared__ double part[BM * BN];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wn = warp % WN, wk = warp / WN;
    const int rank = (int)cluster_rank();
    const int mb = blockIdx.z * BM, nb = blockIdx.y * BN;
    const int r8 = lane >> 2, q = lane & 3;

    const u16* rows[NV];
    bool valid[NV];
#pragma unroll
    for (int i = 0; i < TMW; ++i) {
        const int m = mb + i * 8 + r8;
        valid[i] = m < M;
        rows[i] = x + (size_t)(valid[i] ? m : 0) * H;
    }
#pragma unroll
    for (int i = 0; i < TNW; ++i) {
        const int n = nb + wn * 8 * TNW + i * 8 + r8;
        valid[TMW + i] = n < N;
        rows[TMW + i] = w + (size_t)(valid[TMW + i] ? n : 0) * H;
    }

    const int nunits = (H + 31) >> 5, g = rank * WK + wk;
    const int u0 = (int)((long long)g * nunits / G), u1 = (int)((long long)(g + 1) * nunits / G);
    const int nbat = (u1 - u0 + UB - 1) / UB;

    double acc[TMW][TNW][2];
#pragma unroll
    for (int tm = 0; tm < TMW; ++tm)
#pragma unroll
        for (int tn = 0; tn < TNW; ++tn) acc[tm][tn][0] = acc[tm][tn][1] = 0.0;

    uint4 bufA[UB][NV], bufB[UB][NV];
    auto load_batch = [&](uint4(&buf)[UB][NV], int bt) {
#pragma unroll
        for (int ub = 0; ub < UB; ++ub) {
            const int u = u0 + bt * UB + ub;
            const int h = u * 32 + q * 8;
#pragma unroll
            for (int i = 0; i < NV; ++i) buf[ub][i] = load8<VEC>(rows[i], valid[i] && u < u1, h, H);
        }
    };
    auto mma_batch = [&](const uint4(&buf)[UB][NV], int bt) {
#pragma unroll
        for (int ub = 0; ub < UB; ++ub)
            if (u0 + bt * UB + ub < u1) unit_mma<TMW, TNW, KS>(buf[ub], acc);  // warp-uniform
    };
    if (nbat > 0) load_batch(bufA, 0);
    for (int bt = 0; bt < nbat; bt += 2) {
        if (bt + 1 < nbat) load_batch(bufB, bt + 1);
        mma_batch(bufA, bt);
        if (bt + 1 < nbat) {
            if (bt + 2 < nbat) load_batch(bufA, bt + 2);
            mma_batch(bufB, bt + 1);
        }
    }

    // the block's sum: the WK slices added into part[row][col] in slice order (C fragment: row r8,
    // columns 2q, 2q + 1 of each tile)
    for (int kk = 0; kk < WK; ++kk) {
        if (wk == kk) {
#pragma unroll
            for (int tm = 0; tm < TMW; ++tm)
#pragma unroll
                for (int tn = 0; tn < TNW; ++tn) {
                    double* p = part + (tm * 8 + r8) * BN + wn * 8 * TNW + tn * 8 + 2 * q;
                    p[0] = kk ? p[0] + acc[tm][tn][0] : acc[tm][tn][0];
                    p[1] = kk ? p[1] + acc[tm][tn][1] : acc[tm][tn][1];
                }
        }
        if (kk + 1 < WK) __syncthreads();
    }
    cluster_sync();
    // block `rank` finishes outputs [rank, rank + 1) * BM * BN / CS, adding the CS blocks' sums in
    // rank order
    constexpr int PER = BM * BN / CS;
    const u32 base = smem_u32(part);
    for (int o = rank * PER + tid; o < (rank + 1) * PER; o += NT) {
        double s = ld_cluster_f64(map_rank(base + 8u * o, 0));
#pragma unroll
        for (int c = 1; c < CS; ++c) s += ld_cluster_f64(map_rank(base + 8u * o, c));
        const int m = mb + o / BN, n = nb + o % BN;
        if (m < M && n < N) {
            if (out_bits)
                out_bits[(size_t)m * N + n] = bf16_round_bits_f64(s);
            else
                out[(size_t)m * N + n] = dflash::f64_to_f32_rn(s);
        }
    }
    cluster_sync();  // no block leaves while another may still read its partials
}

}  // namespace

// out[m, n] = sum_h x[m, h] w[n, h] in double, rounded once (out_bits: BF16 bits; else fp32
// out). Grid (CS, ceil(N / BN), ceil(M / BM)), clusters of CS blocks along x; BM = 8 TMW rows,
// BN = 8 TNW WN columns, 32 WN WK threads per block. _v: 16-byte loads (H % 8 == 0 and x, w
// 16-byte aligned), else 2-byte loads. KS: the MMA, 4 (m8n8k4) or 16 (m16n8k16, TMW even).
// fast/selector.py ROWDOT_KERNELS mirrors this table.
#define FS_ROWDOT(NAME, TMW, TNW, WN, WK, UB, CS, VEC, KS)                                                            \
    extern "C" __global__ void __cluster_dims__(CS, 1, 1) __launch_bounds__(32 * WN * WK)                            \
        NAME(const u16* __restrict__ x, const u16* __restrict__ w, int M, int N, int H, float* __restrict__ out,      \
             u16* __restrict__ out_bits) {                                                                          \
        rowdot_body<TMW, TNW, WN, WK, UB, CS, VEC, KS>(x, w, M, N, H, out, out_bits);                                \
    }
FS_ROWDOT(fast_rowdot_s_v, 1, 4, 1, 8, 2, 8, true, 4)
FS_ROWDOT(fast_rowdot_s, 1, 4, 1, 8, 2, 8, false, 4)
FS_ROWDOT(fast_rowdot_m_v, 2, 4, 2, 4, 1, 8, true, 4)
FS_ROWDOT(fast_rowdot_l, 4, 4, 2, 2, 1, 8, false, 4)  // m_v's 2-byte fallback (run on the H200; m with
                                                      // 2-byte loads was not)
FS_ROWDOT(fast_rowdot_m16_v, 2, 4, 2, 4, 1, 8, true, 16)  // m_v's tiling on m16n8k16: the default above 16 rows

// --- the walk -----------------------------------------------------------------------------
//
// One cluster of 8 blocks per batch row b (grid (8, B)). Block `rank` takes the steps
// i = rank, rank + 8, ...: for every predecessor p (the anchor at i = 0, else the k candidates
// of step i - 1) and candidate c it computes selector_walk's energy
//   E_i[p][c] = fadd(scores[i, c], warp_sum(lane's fma chain of
//               fmul(w_pred[pred_p, r], g_i[r]) * w_succ[ids[i, c], r]))
// and stores it, with ids[i, :] and the race's log(-log U_i[c]), into block 0's tables.
// Block 0's warp 0 then walks. Dynamic shared memory (bytes, every block the same):
//   ws   [k][2][32][4] fp32   w_succ rows of the block's current step, lane-major (r = 32 t + lane)
//   lnl  [K][k] double        log(-log U) of the race (block 0)
//   tab  [K][k][k] fp32       energies, [i][p][c] (block 0; i = 0 uses p = 0 only)
//   tok  [K][k] int32         ids (block 0)
// Requires k <= 32, R <= 256 and the total within the launcher's shared memory limit.
namespace {

template <int NT>
__device__ __forceinline__ void walk_body(const u16* __restrict__ g, const float* __restrict__ scores,
                                          const int* __restrict__ ids, const int* __restrict__ anchor,
                                          const u16* __restrict__ w_pred, const u16* __restrict__ w_succ,
                                          const float* __restrict__ temperature, const u64* __restrict__ seed,
                                          const long long* __restrict__ frontier, int B, int K, int k, int R,
                                          int* __restrict__ path, int* __restrict__ tokens, float* __restrict__ q) {
    constexpr int PW = FS_WALK_KMAX / (NT / 32);  // predecessors per warp, at most
    extern __shared__ __align__(16) unsigned char fs_smem[];
    __shared__ int pred_tok[FS_WALK_KMAX], cand_tok[FS_WALK_KMAX];
    __shared__ float cand_score[FS_WALK_KMAX];
    __shared__ double esum[FS_WALK_KMAX];
    float* ws = reinterpret_cast<float*>(fs_smem);
    double* lnl = reinterpret_cast<double*>(fs_smem + (size_t)k * 256 * 4);
    float* tab = reinterpret_cast<float*>(fs_smem + (size_t)k * 256 * 4 + (size_t)K * k * 8);
    int* tok = reinterpret_cast<int*>(fs_smem + (size_t)k * 256 * 4 + (size_t)K * k * 8 + (size_t)K * k * k * 4);

    const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5, nw = NT / 32;
    const int rank = (int)cluster_rank();
    const int b = blockIdx.y;  // grid (8, B): every block of the cluster has the same b
    const float T = temperature[b];
    const u64 s = seed[b];
    const u64 F = (u64)frontier[b];

    for (int i = rank; i < K; i += FS_CLUSTER) {
        const size_t row = (size_t)b * K + i;
        const int P = i == 0 ? 1 : k;  // predecessors
        if (tid < k) {
            cand_tok[tid] = ids[row * k + tid];
            cand_score[tid] = scores[row * k + tid];
        } else if (tid >= 32 && tid < 32 + P) {
            pred_tok[tid - 32] = i == 0 ? anchor[b] : ids[(row - 1) * k + (tid - 32)];
        }
        __syncthreads();
        // this warp's predecessors' rows and g_i, lane's share (r = lane + 32 t), loaded now
        u16 gv[FS_WALK_RT], pv[PW][FS_WALK_RT];
        const u16* gi = g + row * R;
#pragma unroll
        for (int t = 0; t < FS_WALK_RT; ++t) gv[t] = lane + 32 * t < R ? gi[lane + 32 * t] : (u16)0;
#pragma unroll
        for (int pp = 0; pp < PW; ++pp) {
            const int p = wid + pp * nw;
            const u16* wp = w_pred + (size_t)(p < P ? pred_tok[p] : 0) * R;
#pragma unroll
            for (int t = 0; t < FS_WALK_RT; ++t)
                pv[pp][t] = (p < P && lane + 32 * t < R) ? wp[lane + 32 * t] : (u16)0;
        }
        // w_succ rows of the candidates, as fp32, lane-major
        for (int e = tid; e < k * R; e += NT) {
            const int c = e / R, r = e - c * R;
            ws[c * 256 + (r >> 7) * 128 + (r & 31) * 4 + ((r >> 5) & 3)] =
                bf16_value(w_succ[(size_t)cand_tok[c] * R + r]);
        }
        if (tid < k) {  // the race's log(-log U) at (seed, frontier + i, DFLASH2_PROPOSAL, rank c)
            const float u = dflash::keyed_uniform(s, F + (u64)i, dflash::DFLASH2_PROPOSAL, (u32)tid);
            st_cluster_f64(map_rank(smem_u32(lnl + (size_t)i * k + tid), 0), log(-log(dflash::f32_to_f64(u))));
            st_cluster_s32(map_rank(smem_u32(tok + (size_t)i * k + tid), 0), cand_tok[tid]);
        }
        __syncthreads();
#pragma unroll
        for (int pp = 0; pp < PW; ++pp) {
            const int p = wid + pp * nw;
            if (p >= P) break;  // warp-uniform
            float prod[FS_WALK_RT];
#pragma unroll
            for (int t = 0; t < FS_WALK_RT; ++t) prod[t] = __fmul_rn(bf16_value(pv[pp][t]), bf16_value(gv[t]));
            const u32 dst = map_rank(smem_u32(tab + ((size_t)i * k + p) * k), 0);
            for (int c = 0; c < k; ++c) {
                const float4 s0 = *reinterpret_cast<const float4*>(ws + c * 256 + lane * 4);
                const float4 s1 = *reinterpret_cast<const float4*>(ws + c * 256 + 128 + lane * 4);
                const float sv[8] = {s0.x, s0.y, s0.z, s0.w, s1.x, s1.y, s1.z, s1.w};
                float acc = 0.0f;
#pragma unroll
                for (int t = 0; t < FS_WALK_RT; ++t)  // r = lane + 32 t ascending, as selector_walk
                    if (lane + 32 * t < R) acc = __fmaf_rn(prod[t], sv[t], acc);
                acc = warp_sum(acc);
                if (lane == (c & 31)) st_cluster_f32(dst + 4u * c, __fadd_rn(cand_score[c], acc));
            }
        }
        __syncthreads();  // pred_tok, cand_*, ws are rewritten by the next step
    }
    cluster_sync();  // every table is in block 0
    if (rank != 0 || wid != 0) return;

    // the walk: lane c holds candidate c
    const int c = lane;
    const bool live = c < k;
    int j = 0;
    for (int i = 0; i < K; ++i) {
        const size_t row = (size_t)b * K + i;
        const float E = live ? tab[((size_t)i * k + (i == 0 ? 0 : j)) * k + c] : 0.0f;
        float qc;
        if (T <= 0.0f) {
            // selector_walk: j = 0; for c: if (E[c] > E[j]) j = c. That is the lowest rank among the
            // maxima of the non-NaN energies, unless E[0] is NaN (then 0): a total order
            // (valid first, larger E, lower rank) reduced over the warp.
            bool ok = live && !isnan(E);
            float v = E;
            int idx = c;
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                const float ov = __shfl_xor_sync(0xffffffffu, v, o);
                const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
                const bool ook = __shfl_xor_sync(0xffffffffu, (int)ok, o) != 0;
                if (ook && (!ok || ov > v || (!(v > ov) && oi < idx))) {
                    v = ov;
                    idx = oi;
                    ok = ook;
                }
            }
            const bool e0nan = __shfl_sync(0xffffffffu, (int)isnan(E), 0) != 0;
            j = e0nan ? 0 : idx;
            qc = c == j ? 1.0f : 0.0f;
        } else {
            // softmax in double from the fp32 energies, rounded once to the fp32 q (as selector_walk:
            // the max by fmax, the sum in rank order)
            const double xc = live ? dflash::f32_to_f64(E) / (double)T : -1.0 / 0.0;
            double mx = fmax(-1.0 / 0.0, xc);  // NaN -> -inf, as fmax(mx, NaN) leaves mx
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) mx = fmax(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            const double ec = live ? exp(xc - mx) : 0.0;
            // the sum in rank order, as selector_walk (every lane the same sequence of additions)
            if (live) esum[c] = ec;
            __syncwarp();
            double sum = 0.0;
#pragma unroll
            for (int cc = 0; cc < FS_WALK_KMAX; ++cc)
                if (cc < k) sum += esum[cc];
            __syncwarp();  // read before the next step writes
            qc = dflash::f64_to_f32_rn(ec / sum);
            // race_offer for every rank at once: the winner maximises (score, then lower rank) among
            // the weights > 0, the order race_better defines (scores finite: a total order)
            dflash::RaceEntry best = dflash::race_empty();
            const double weight = dflash::f32_to_f64(qc);
            if (live && weight > 0.0) {
                best.score = log(weight) - lnl[(size_t)i * k + c];
                best.index = c;
            }
            best = dflash::warp_race(best);
            j = best.index == DFLASH_RACE_NONE ? 0 : best.index;
        }
        if (live) q[row * k + c] = qc;
        if (lane == 0) {
            path[row] = j;
            tokens[row] = tok[(size_t)i * k + j];
        }
    }
}

}  // namespace

#define FS_WALK(NAME, NT)                                                                                            \
    extern "C" __global__ void __cluster_dims__(FS_CLUSTER, 1, 1) __launch_bounds__(NT)                              \
        NAME(const u16* __restrict__ g, const float* __restrict__ scores, const int* __restrict__ ids,                \
             const int* __restrict__ anchor, const u16* __restrict__ w_pred, const u16* __restrict__ w_succ,          \
             const float* __restrict__ temperature, const u64* __restrict__ seed,                                    \
             const long long* __restrict__ frontier, int B, int K, int k, int R, int* __restrict__ path,             \
             int* __restrict__ tokens, float* __restrict__ q) {                                                     \
        walk_body<NT>(g, scores, ids, anchor, w_pred, w_succ, temperature, seed, frontier, B, K, k, R, path, tokens, \
                      q);                                                                                            \
    }
FS_WALK(fast_selector_walk, FS_WALK_THREADS)

#endif  // sm_90
