// Fast mode (kernels_cu/fast_wgemm.py): the block's layer GEMMs at up to 128 rows on wgmma, the weight streamed
// once by tensor copies, the whole sum written (no K-slice partials for the consumer to add).
//
//   out[m, v] = sum_k x[m, k] W[v, k]   (x: M <= WG_N rows of BF16 bits, W: N weight rows, fp32 out [M, N])
//
// Work split (stream-K): the GEMM is T = tiles x KC iterations, a tile being 256 weight rows and an iteration one
// stage of 64 K. Block b of G takes iterations [floor(b T / G), floor((b + 1) T / G)), so every block streams the
// same number of weight bytes whatever N and K are (the grid is one block a multiprocessor; the 35B layer GEMMs at
// B8 have 8 to 48 tiles, too few to fill 132 multiprocessors one tile a block). A block's range cuts the tiles it
// touches into pieces, each summed over K in order, 16 at a time, by the tensor cores (FP32 accumulation, as
// cuBLAS's). A tile covered by one piece is written straight to out. Otherwise each piece goes to a scratch slot (a
// block cuts at most its first and its last tile: slots 2 b and 2 b + 1) and is counted on the tile; after its loop
// a block waits until every piece of each tile it cut has arrived, then the tile's P blocks add the pieces in block
// order, each its own run of 1/P of the tile, so the sum does not depend on which block came last (the same bits on
// every run for one G) and no block reads a whole tile alone. Waiting for other blocks needs the whole grid resident:
// fast_wgemm.py launches it cooperatively.
//
// Each block: two warpgroups, warpgroup w computing weight rows [128 w, 128 w + 128) of the tile as two m64nNk16 wgmma
// chains (A = weight rows, B = the x rows, N = WG_N, both K-major from shared memory in the tensor copies' 128-byte
// swizzle: ht_desc). WG_STAGES buffers of [256 weight rows x 64 K | WG_N x rows x 64 K], filled by the tensor copy
// engine WG_STAGES - 1 ahead, one thread issuing: fast_head.cu's v13 kernel, whose stages had the same shape,
// streamed the 27B head at 3.85-3.92 TB/s. With 128-row tiles (a stage as much x as weight) the H200 streamed
// 3.0 TB/s at the 27B gate/up shape (session v16's first form): a multiprocessor took in about 44 GB/s either way.
//
// Programmatic dependent launch (kernels_cu/pdl.py's rules): the weights are prepared once and written by no kernel
// of a round, so the issuing thread asks for the first stages' weight boxes before griddepcontrol.wait and for their
// x boxes after it; every other read and every write of this kernel follows a stage whose x box was issued after the
// wait. Launched the ordinary way, the wait is a no-op.
#include "philox.cuh"

using dflash::u64;

#ifndef WG_N
#define WG_N 128  // fast_wgemm.py defines it (the rows rounded up to 8); the CI build of this file takes 128
#endif
#define WG_THREADS 256
#define WG_VT 256  // weight rows a tile (two warpgroups' two m64 blocks: a stage is 2 weight bytes to 1 of x at 128 rows)
#define WG_KC 64   // K a stage
#ifndef WG_STAGES
#define WG_STAGES 4
#endif
#define WG_W_BYTES (WG_VT * WG_KC * 2)
#define WG_X_BYTES (WG_N * WG_KC * 2)
#define WG_STAGE_BYTES (WG_W_BYTES + WG_X_BYTES)
#define WG_NACC (WG_N / 2)  // fp32 accumulators a thread and m64 block
#define WG_SLOT4 (WG_THREADS * 2 * WG_NACC / 4)  // float4 of a scratch slot (one piece: every thread's accumulators)
// dynamic shared memory: up to 1 KiB of alignment slack, the stages, a barrier a stage
#define WG_SMEM_BYTES (1024 + WG_STAGES * WG_STAGE_BYTES + WG_STAGES * 8)

// A CUtensorMap by value (cuda.h's layout: 128 bytes, 64-byte aligned), passed as a __grid_constant__ parameter:
// the copies read it from the parameter space, so a CUDA graph keeps the map it was captured with.
struct alignas(64) WgMap {
    u64 v[16];
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#include "tma_wgmma.cuh"

// The block whose range holds iteration i: the b with floor(b T / G) <= i < floor((b + 1) T / G), i.e.
// ceil((i + 1) G / T) - 1. 32-bit: T G < 2^31 (fast_wgemm.py checks it).
__device__ __forceinline__ int wg_owner(int i, int T, int G) { return ((i + 1) * G - 1) / T; }

__device__ __forceinline__ int wg_first(int b, int T, int G) { return b * T / G; }

// One stage: iteration i's weight box (256 rows of tile i / KC, K from 64 (i % KC)) and, with x, its x box, counted on
// bar, which expects both boxes' bytes (rows past N or past M read as zeros and count as well).
__device__ __forceinline__ void wg_issue(unsigned sw, unsigned bar, const u64* wmap, const u64* xmap, int i, int KC,
                                         bool expect, bool w, bool x) {
    const int tile = i / KC, k0 = (i - tile * KC) * WG_KC;
    if (expect)
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(WG_STAGE_BYTES)
                     : "memory");
    if (w) ht_tma(sw, wmap, k0, tile * WG_VT, bar);
    if (x) ht_tma(sw + WG_W_BYTES, xmap, k0, 0, bar);
}

// out[n, v] of one float4 of a piece's scratch slot: float4 e holds accumulators 4 j4 .. 4 j4 + 3 of m64 block mb of
// thread tid (e = (mb WG_NACC / 4 + j4) WG_THREADS + tid). Accumulator j of (tid, mb) is weight row
// tile0 + 128 wg + 64 mb + 16 (warp % 4) + g + 8 ((j % 4) / 2), x row 8 (j / 4) + 2 t + j % 2 (the m64nN layout).
__device__ __forceinline__ void wg_store4(float* __restrict__ out, float4 z, int e, int tile0, int M, int N) {
    const int tid = e % WG_THREADS, q = e / WG_THREADS, mb = q / (WG_NACC / 4), j4 = q - mb * (WG_NACC / 4);
    const int warp = tid >> 5, lane = tid & 31;
    const int v = tile0 + 128 * (warp >> 2) + 64 * mb + 16 * (warp & 3) + (lane >> 2), n = 8 * j4 + 2 * (lane & 3);
    const float w4[4] = {z.x, z.y, z.z, z.w};
#pragma unroll
    for (int e4 = 0; e4 < 4; ++e4) {
        const int vv = v + 8 * (e4 >> 1), nn = n + (e4 & 1);
        if (nn < M && vv < N) out[(size_t)nn * N + vv] = w4[e4];
    }
}

extern "C" __global__ void __launch_bounds__(WG_THREADS, 1)
fast_wgemm(const __grid_constant__ WgMap wmap_p, const __grid_constant__ WgMap xmap_p, int M, int N, int K,
           float* __restrict__ out, float* __restrict__ scratch, int* __restrict__ arrive, int* __restrict__ depart) {
    extern __shared__ unsigned char wg_raw[];
    unsigned char* base = wg_raw + ((1024 - (ht_smem_u32(wg_raw) & 1023)) & 1023);
    u64* bars = reinterpret_cast<u64*>(base + WG_STAGES * WG_STAGE_BYTES);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2;
    const int G = gridDim.x, b = blockIdx.x;
    const int KC = K / WG_KC, T = (N + WG_VT - 1) / WG_VT * KC;
    const int i0 = wg_first(b, T, G), i1 = wg_first(b + 1, T, G), n_it = i1 - i0;
    const u64* wmap = wmap_p.v;
    const u64* xmap = xmap_p.v;
    // No early launch_dependents: the blocks below wait for each other's pieces, so every block of the grid must be
    // resident (fast_wgemm.py launches the grid cooperatively); dependents start as this grid exits, or, under a
    // graph's launch-order edge, once every block here has begun.
    const unsigned s0 = ht_smem_u32(base), b0 = ht_smem_u32(bars);
    if (tid == 0) {
        for (int st = 0; st < WG_STAGES; ++st)
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(b0 + 8 * st) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        const int pre = min(WG_STAGES - 1, n_it);
        for (int p = 0; p < pre; ++p)  // the weights before the wait (written by no kernel of the sequence)
            wg_issue(s0 + p * WG_STAGE_BYTES, b0 + 8 * p, wmap, xmap, i0 + p, KC, true, true, false);
        asm volatile("griddepcontrol.wait;\n" ::: "memory");  // the kernel ahead (x's writer) completed
        for (int p = 0; p < pre; ++p)
            wg_issue(s0 + p * WG_STAGE_BYTES, b0 + 8 * p, wmap, xmap, i0 + p, KC, false, false, true);
    }
    __syncthreads();
    float acc[2][WG_NACC];
#pragma unroll
    for (int mb = 0; mb < 2; ++mb)
#pragma unroll
        for (int j = 0; j < WG_NACC; ++j) acc[mb][j] = 0.f;
    int piece0 = i0;  // the current piece's first iteration
#pragma unroll 1
    for (int q = 0; q < n_it; ++q) {
        const int it = i0 + q;
        ht_bar_wait(b0 + 8 * (q % WG_STAGES), (q / WG_STAGES) & 1);  // stage q landed
        __syncthreads();  // and every wgmma of q - 1 retired: its buffer may be refilled
        if (tid == 0 && q + WG_STAGES - 1 < n_it) {
            const int nx = q + WG_STAGES - 1;
            wg_issue(s0 + nx % WG_STAGES * WG_STAGE_BYTES, b0 + 8 * (nx % WG_STAGES), wmap, xmap, i0 + nx, KC, true,
                     true, true);
        }
        const int tile = it / KC, kc = it - tile * KC;
        const unsigned sw = s0 + q % WG_STAGES * WG_STAGE_BYTES, sx = sw + WG_W_BYTES;
#pragma unroll
        for (int mb = 0; mb < 2; ++mb)
#pragma unroll
            for (int j = 0; j < WG_NACC; ++j) asm volatile("" : "+f"(acc[mb][j])::"memory");
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int s = 0; s < WG_KC / 16; ++s) {
            const u64 db = ht_desc(sx + 32 * s);
#pragma unroll
            for (int mb = 0; mb < 2; ++mb)
                ht_wgmma(acc[mb], ht_desc(sw + (128 * wg + 64 * mb) * 128 + 32 * s), db, (it != piece0) | s);
        }
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        if (kc != KC - 1 && it != i1 - 1) continue;

        // ---- the piece [piece0, it] of `tile` is summed: a whole tile to out, a cut one to this block's slot
        piece0 = it + 1;
        if (wg_owner(tile * KC, T, G) == wg_owner(tile * KC + KC - 1, T, G)) {
#pragma unroll
            for (int mb = 0; mb < 2; ++mb)
#pragma unroll
                for (int j4 = 0; j4 < WG_NACC / 4; ++j4)
                    wg_store4(out, make_float4(acc[mb][4 * j4], acc[mb][4 * j4 + 1], acc[mb][4 * j4 + 2],
                                               acc[mb][4 * j4 + 3]),
                              (mb * (WG_NACC / 4) + j4) * WG_THREADS + tid, tile * WG_VT, M, N);
            continue;
        }
        // scratch slot 2 b for the block's first tile, 2 b + 1 for its last (a range cuts at most those two)
        const int slot = 2 * b + (tile != i0 / KC);
        float4* mine = reinterpret_cast<float4*>(scratch) + (size_t)slot * WG_SLOT4;
#pragma unroll
        for (int mb = 0; mb < 2; ++mb)
#pragma unroll
            for (int j4 = 0; j4 < WG_NACC / 4; ++j4)
                mine[(mb * (WG_NACC / 4) + j4) * WG_THREADS + tid] =
                    make_float4(acc[mb][4 * j4], acc[mb][4 * j4 + 1], acc[mb][4 * j4 + 2], acc[mb][4 * j4 + 3]);
        __threadfence();
        __syncthreads();
        if (tid == 0) atomicAdd(&arrive[tile], 1);
    }
    if (n_it == 0) return;

    // ---- the cut tiles this block touched (its first and its last): once all of a tile's P pieces have arrived, the
    // tile's blocks add them in block order, block bf + c taking the c-th of P equal runs of the slot's float4s, so
    // the sum does not depend on arrival order. Every block posts all its pieces before it waits: with the whole grid
    // resident nothing waits on a block that has not run.
    for (int side = 0; side < 2; ++side) {
        const int tile = (side == 0 ? i0 : i1 - 1) / KC;
        if (side == 1 && tile == i0 / KC) break;
        const int bf = wg_owner(tile * KC, T, G), bl = wg_owner(tile * KC + KC - 1, T, G), P = bl - bf + 1;
        if (P == 1) continue;
        if (tid == 0) {
            int seen;
            do {
                asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(seen) : "l"(arrive + tile) : "memory");
            } while (seen < P);
        }
        __syncthreads();
        const int c = b - bf, e0 = (int)((long long)c * WG_SLOT4 / P), e1 = (int)((long long)(c + 1) * WG_SLOT4 / P);
        for (int e = e0 + tid; e < e1; e += WG_THREADS) {
            float4 z = __ldcg(reinterpret_cast<const float4*>(scratch) +
                              (size_t)(2 * bf + (tile != wg_first(bf, T, G) / KC)) * WG_SLOT4 + e);
            for (int p = bf + 1; p <= bl; ++p) {
                const float4 y = __ldcg(reinterpret_cast<const float4*>(scratch) +
                                        (size_t)(2 * p + (tile != wg_first(p, T, G) / KC)) * WG_SLOT4 + e);
                z.x += y.x, z.y += y.y, z.z += y.z, z.w += y.w;
            }
            wg_store4(out, z, e, tile * WG_VT, M, N);
        }
        __syncthreads();  // every read of the slots done before this block departs
        if (tid == 0 && atomicAdd(&depart[tile], 1) == P - 1) {  // the tile's last reader: counters ready for the next launch
            arrive[tile] = 0;
            depart[tile] = 0;
        }
    }
    (void)lane;
}

#else  // plain sm_90 (CI's build of every kernels_cu/*.cu): no wgmma; fast_wgemm.py builds sm_90a only
extern "C" __global__ void fast_wgemm(const WgMap, const WgMap, int, int, int, float*, float*, int*, int*) { __trap(); }
#endif
