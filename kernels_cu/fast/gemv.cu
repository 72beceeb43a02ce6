// Skinny BF16 GEMM for the block's layer GEMMs at few rows (fast mode):
// out [M, N] fp32 = x [M, K] @ w [N, K]^T, BF16 bits in, FP32 accumulation on the tensor cores
// (mma.sync m16n8k16), M <= 16.
//
// Why a kernel of our own. At B1 a layer GEMM has 8 rows, so its time is the weight stream plus a
// ramp: cuBLAS's kernels took 1.3-1.7x the bytes' time (a kernel trace), and a kernel of our own without
// what follows was no faster. What cuBLAS cannot do is start
// streaming the weights before the kernel ahead has finished. The weights are constants of the
// round, so under programmatic dependent launch (kernels_cu/pdl.py) this kernel issues its block's
// weight slab into shared memory by cp.async *before* griddepcontrol.wait, and reads x (the kernel
// ahead's output) only after it. The slab lands while the latency-bound kernels ahead (the
// norms, the attention) run; after the wait only x's rows and the mma remain.
//
// Layout. A block owns 16 rows of w (the mma's M dimension) and FGV_WARPS warps that share K in
// chunks of 32: warp v takes chunks v, v + FGV_WARPS, ... (its steps i = 0, 1, ...). Per chunk a
// thread (g = lane / 4, t = lane % 4) uses 16 bytes of w row g and of row g + 8 at k0 + 8t, and
// 16 bytes of x row g (+ 8 for the second n-tile) at the same k: two mma per n-tile. The mma's k
// slots are a permutation of the chunk's 32 physical k (slot 2t + e <-> 8t + e, slot 2t + 8 + e
// <-> 8t + 2 + e for the first mma, + 4 for the second), the same for w and x, so the products are
// the right ones and only their order of addition differs from a plain k loop
// (tests/test_fast_gemv_plan.py emulates the fragments).
//
// Staging. The first `pre` steps of every warp come from shared memory: each thread copies exactly
// the 2 x 16 bytes it will read, into slots of its own (lane-contiguous, so neither the copy nor
// the read has a bank conflict and no barrier is needed: cp.async.wait_all covers the thread's own
// copies). After the wait the staged steps load only x, FGV_XUNROLL steps in flight. Steps past `pre`
// (K longer than the budget) load w straight from global memory, FGV_UNROLL chunks in flight. The warps'
// 16 x 8 accumulators are added in warp order through shared memory: deterministic, one order per shape.
//
// PDL. pdl_trigger comes first, so the kernel after this one may launch (and stage its own constants)
// at once; it waits for this grid's completion before it reads `out` (or `act`). Launched the ordinary way,
// both instructions are no-ops and the bits are the same.
//
// SiLU-mul form (fast_gemv_act_*). w is the fused [gate; up] projection [2I, K] and the
// output is act [M, I] = BF16(SiLU(gate) * up), not the fp32 GEMM: block c owns gate rows 8c .. 8c + 7
// (the mma's rows g) and up rows I + 8c .. I + 8c + 7 (rows g + 8), so the thread that ends up with
// gate[m, 8c + g] holds up[m, 8c + g] too, and fb_silu_mul's arithmetic (dfl::silu_mul_bf16, the same
// function) runs in the epilogue. Each sum is the one the plain form computes for that row (a row's
// products and their order do not depend on where the row sits in the tile), so act has the bits of
// the plain GEMM followed by fb_silu_mul, with one kernel and one gu round trip less.
//
// Needs K % 32 == 0, N % 16 == 0, 16-byte aligned rows (kernels_cu/fast/gemv.py checks).
// Numerics: BF16 x BF16 products are exact in FP32; each warp adds its chunks' products in the
// tensor cores' FP32 accumulator, then the warps' sums are added in order: an FP32 summation of
// the same exact products, inside the bound gamma_(K-1) sum |x_k w_k| (tests/gpu/test_fast_gemv.py).
#include "common.cuh"

#define FGV_WARPS 8
#define FGV_UNROLL 4
#define FGV_XUNROLL 8       // staged steps' x rows in flight (three blocks a multiprocessor: 72 registers)

namespace fgv {

__device__ __forceinline__ void mma16816(float (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                         unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint4 ldg16(const unsigned short* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
    const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
}

template <int NT, bool ACT>
__device__ __forceinline__ void gemv_body(const unsigned short* __restrict__ x, const unsigned short* __restrict__ w,
                                          float* __restrict__ out, unsigned short* __restrict__ act, int M, int N,
                                          int K, int pre) {
    extern __shared__ uint4 stage[];  // [pre][FGV_WARPS][2][32]: thread-private 16-byte slots
    __shared__ float red[FGV_WARPS][NT][32][4];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int n0 = blockIdx.x * 16;
    const int chunks = K >> 5;
    const int steps = (chunks - warp + FGV_WARPS - 1) / FGV_WARPS;  // this warp's chunks (warp < chunks or 0)
    // rows g and g + 8 of the block's tile: w rows n0 + g and n0 + g + 8, or (ACT, N = 2I) gate row 8c + g
    // and up row N / 2 + 8c + g
    const unsigned short* wr0 = w + (long long)(ACT ? (int)blockIdx.x * 8 + g : n0 + g) * K + 8 * t;
    const unsigned short* wr1 = wr0 + (ACT ? (long long)(N / 2) : 8LL) * K;
    uint4* mine = stage + warp * 64 + lane;  // step i's two slots: mine[i * FGV_WARPS * 64] and + 32

    dfl::pdl_trigger();  // the kernel after this one may launch; it waits for this grid before reading out
    const int staged = min(pre, steps);
    for (int i = 0; i < staged; ++i) {  // the constants: issued before the wait
        const long long k0 = (long long)(warp + i * FGV_WARPS) << 5;
        cp_async16(mine + i * FGV_WARPS * 64, wr0 + k0);
        cp_async16(mine + i * FGV_WARPS * 64 + 32, wr1 + k0);
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
    dfl::pdl_wait_for(x);  // x is the kernel ahead's output: read after this (common.cuh)

    const unsigned short* xr[NT];
    bool xok[NT];
#pragma unroll
    for (int j = 0; j < NT; ++j) {
        const int m = 8 * j + g;
        xok[j] = m < M;
        xr[j] = x + (long long)(xok[j] ? m : 0) * K + 8 * t;
    }
    float c[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j) c[j][0] = c[j][1] = c[j][2] = c[j][3] = 0.f;

    // Staged steps: only x comes from global memory (L2: the kernel ahead just wrote it), FGV_XUNROLL
    // steps' rows in flight at once (each batch is one memory latency after the wait).
    for (int i0 = 0; i0 < staged; i0 += FGV_XUNROLL) {
        uint4 xa[FGV_XUNROLL][NT];
#pragma unroll
        for (int u = 0; u < FGV_XUNROLL; ++u) {
            const int i = i0 + u;
            const long long k0 = (long long)(i < staged ? warp + i * FGV_WARPS : 0) << 5;
#pragma unroll
            for (int j = 0; j < NT; ++j)
                xa[u][j] = i < staged && xok[j] ? *reinterpret_cast<const uint4*>(xr[j] + k0)
                                                : make_uint4(0u, 0u, 0u, 0u);
        }
        if (i0 == 0) asm volatile("cp.async.wait_all;\n" ::: "memory");  // this thread's own slots: no barrier
#pragma unroll
        for (int u = 0; u < FGV_XUNROLL; ++u) {
            const int i = i0 + u;
            if (i >= staged) break;  // warp-uniform
            const uint4 wa = mine[i * FGV_WARPS * 64], wb = mine[i * FGV_WARPS * 64 + 32];
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                mma16816(c[j], wa.x, wb.x, wa.y, wb.y, xa[u][j].x, xa[u][j].y);
                mma16816(c[j], wa.z, wb.z, wa.w, wb.w, xa[u][j].z, xa[u][j].w);
            }
        }
    }
    // Steps past the staging budget: w and x from global memory, FGV_UNROLL steps in flight. The steps are
    // added in the same order (i = 0, 1, ...) whatever the budget: the same bits.
    for (int i0 = staged; i0 < steps; i0 += FGV_UNROLL) {
        uint4 wa[FGV_UNROLL], wb[FGV_UNROLL], xa[FGV_UNROLL][NT];
#pragma unroll
        for (int u = 0; u < FGV_UNROLL; ++u) {
            const int i = i0 + u;
            const bool in = i < steps;  // warp-uniform
            const long long k0 = (long long)(in ? warp + i * FGV_WARPS : 0) << 5;
            wa[u] = in ? ldg16(wr0 + k0) : make_uint4(0u, 0u, 0u, 0u);
            wb[u] = in ? ldg16(wr1 + k0) : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
            for (int j = 0; j < NT; ++j)
                xa[u][j] = in && xok[j] ? *reinterpret_cast<const uint4*>(xr[j] + k0) : make_uint4(0u, 0u, 0u, 0u);
        }
#pragma unroll
        for (int u = 0; u < FGV_UNROLL; ++u) {
            if (i0 + u >= steps) break;  // warp-uniform: no products of a chunk past K
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                mma16816(c[j], wa[u].x, wb[u].x, wa[u].y, wb[u].y, xa[u][j].x, xa[u][j].y);
                mma16816(c[j], wa[u].z, wb[u].z, wa[u].w, wb[u].w, xa[u][j].z, xa[u][j].w);
            }
        }
    }
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) red[warp][j][lane][e] = c[j][e];
    __syncthreads();
    // thread (warp j, lane) of the first NT warps adds the FGV_WARPS accumulators in warp order and stores:
    // c0 (row g, col 2t), c1 (row g, col 2t + 1), c2 (row g + 8, col 2t), c3 (row g + 8, col 2t + 1);
    // rows are w rows (n), cols x rows (m)
    if (warp < NT) {
        const int j = warp;
        float s[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            s[e] = red[0][j][lane][e];
#pragma unroll
            for (int v = 1; v < FGV_WARPS; ++v) s[e] += red[v][j][lane][e];
        }
        if constexpr (ACT) {  // s0 / s1: gate of rows m, m + 1; s2 / s3: their up (column 8c + g of act)
            const int I = N / 2;
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int m = 8 * j + 2 * t + e;
                if (m < M) act[(long long)m * I + blockIdx.x * 8 + g] = dfl::silu_mul_bf16(s[e], s[e + 2]);
            }
        } else {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int n = n0 + g + 8 * (e >> 1), m = 8 * j + 2 * t + (e & 1);
                if (m < M) out[(long long)m * N + n] = s[e];
            }
        }
    }
}

}  // namespace fgv

// Grid (N / 16), FGV_WARPS * 32 threads, dynamic shared memory pre * FGV_WARPS * 64 * 16 bytes. The one
// n-tile form keeps three blocks a multiprocessor (<= 85 registers): the 35B qkv grid, 384 blocks of
// 64 KiB, is then one wave of the H200's 132. (A form with every staged x row in flight, one block a
// multiprocessor, measured slower in the round.)
extern "C" __global__ void __launch_bounds__(FGV_WARPS * 32, 3)
fast_gemv_n1(const unsigned short* __restrict__ x, const unsigned short* __restrict__ w, float* __restrict__ out,
             int M, int N, int K, int pre) {
    fgv::gemv_body<1, false>(x, w, out, nullptr, M, N, K, pre);
}

extern "C" __global__ void __launch_bounds__(FGV_WARPS * 32)
fast_gemv_n2(const unsigned short* __restrict__ x, const unsigned short* __restrict__ w, float* __restrict__ out,
             int M, int N, int K, int pre) {
    fgv::gemv_body<2, false>(x, w, out, nullptr, M, N, K, pre);
}

// The SiLU-mul forms: w [2I, K] = [gate; up], act [M, I] BF16 bits; grid (I / 8), the same threads and shared
// memory as the plain forms (N = 2I).
extern "C" __global__ void __launch_bounds__(FGV_WARPS * 32, 3)
fast_gemv_act_n1(const unsigned short* __restrict__ x, const unsigned short* __restrict__ w,
                 unsigned short* __restrict__ act, int M, int N, int K, int pre) {
    fgv::gemv_body<1, true>(x, w, nullptr, act, M, N, K, pre);
}

extern "C" __global__ void __launch_bounds__(FGV_WARPS * 32)
fast_gemv_act_n2(const unsigned short* __restrict__ x, const unsigned short* __restrict__ w,
                 unsigned short* __restrict__ act, int M, int N, int K, int pre) {
    fgv::gemv_body<2, true>(x, w, nullptr, act, M, N, K, pre);
}
