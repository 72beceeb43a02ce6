// Fast mode (kernels_cu/fast_wgemm.py): the block's layer GEMMs at up to 128 rows on wgmma, the weight streamed
// once by tensor copies, the whole sum written (no K-slice partials for the consumer to add).
//
//   out[m, v] = sum_k x[m, k] W[v, k]   (x: M <= WG_N rows of BF16 bits, W: N weight rows, fp32 out [M, N])
//
// Off by default (fast_wgemm.ENABLED): the H200 measured it slower than the cuBLAS path at every layer shape at 128
// rows, fast_wgemm.py and docs/PERFORMANCE.md ("Session v16") say by how much and why.
//
// Work split (stream-K): the GEMM is T = tiles x KC iterations, a tile being 128 weight rows and an iteration one
// stage of 64 K. Block b of G takes iterations [floor(b T / G), floor((b + 1) T / G)), so every block streams the
// same number of weight bytes whatever N and K are (the grid is one block a multiprocessor; the layer GEMMs of the
// official geometries have 10 to 272 tiles, most too few to fill 132 multiprocessors one tile a block). A block's range
// cuts the tiles it touches into pieces, each summed over K in order, 16 at a time, by the tensor cores (FP32
// accumulation, as cuBLAS's). A tile covered by one piece is written straight to out. Otherwise every piece goes to
// a scratch slot; the block that finishes a tile's last piece (a counter a tile, atomicAdd after a fence) adds the
// tile's pieces in block order and writes the sum, so the result does not depend on which block came last: the same
// bits on every run for one G.
//
// Each block: two warpgroups, warpgroup w computing weight rows [64 w, 64 w + 64) of the tile as one m64nNk16 wgmma
// chain (A = weight rows, B = the x rows, N = WG_N, both K-major from shared memory in the tensor copies' 128-byte
// swizzle: ht_desc). WG_STAGES buffers of [128 weight rows x 64 K | WG_N x rows x 64 K], filled by the tensor copy
// engine by a producer warpgroup (one lane issues each stage once both consumer warpgroups have retired its buffer's
// last use: an empty barrier a stage, as fast_head.cu's ping-pong kernel). Session v16's first form issued from a
// consumer thread after a block-wide barrier each stage (fast_head.cu's v13 form): at 128 rows it took in 37-46 GB/s
// a multiprocessor on the H200, where the ping-pong kernel takes in about 57 (docs/PERFORMANCE.md "Session v16").
//
// Programmatic dependent launch (kernels_cu/pdl.py's rules): the weights are prepared once and written by no kernel
// of a round, so the issuing lane asks for the first stages' weight boxes before griddepcontrol.wait and for their
// x boxes after it; every other read and every write of this kernel follows a stage whose x box was issued after the
// wait. Launched the ordinary way, the wait is a no-op.
#include "philox.cuh"

using dflash::u64;

#ifndef WG_N
#define WG_N 128  // fast_wgemm.py defines it (the rows rounded up to 8); the CI build of this file takes 128
#endif
#define WG_THREADS 384  // two consumer warpgroups and a producer warpgroup (one lane of it issues)
#define WG_CONSUMERS 256
#define WG_VT 128  // weight rows a tile (two warpgroups' m64 blocks)
#define WG_KC 64   // K a stage
#ifndef WG_STAGES
#define WG_STAGES 5
#endif
#define WG_W_BYTES (WG_VT * WG_KC * 2)
#define WG_X_BYTES (WG_N * WG_KC * 2)
#define WG_STAGE_BYTES (WG_W_BYTES + WG_X_BYTES)
#define WG_NACC (WG_N / 2)  // fp32 accumulators a thread
#define WG_SLOT (WG_CONSUMERS * WG_NACC)  // floats of a scratch slot (one piece: every consumer's accumulators)
// dynamic shared memory: up to 1 KiB of alignment slack, the stages, a full and an empty barrier a stage, the flag
#define WG_SMEM_BYTES (1024 + WG_STAGES * WG_STAGE_BYTES + 2 * WG_STAGES * 8 + 16)

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

// One stage: iteration i's weight box (128 rows of tile i / KC, K from 64 (i % KC)) and, with_x, its x box, counted on
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

// A thread's accumulator j holds out[n, v] with v = vb + 8 ((j & 3) >> 1), n = 8 (j >> 2) + 2 t + (j & 1) (the
// m64nN layout; vb the thread's first weight row, t its lane % 4).
__device__ __forceinline__ void wg_store(float* __restrict__ out, const float (&acc)[WG_NACC], int M, int N, int vb,
                                         int t) {
#pragma unroll
    for (int j = 0; j < WG_NACC; ++j) {
        const int v = vb + 8 * ((j & 3) >> 1), n = 8 * (j >> 2) + 2 * t + (j & 1);
        if (n < M && v < N) out[(size_t)n * N + v] = acc[j];
    }
}

// The consumers' barrier (named barrier 1, the 256 consumer threads; the producer warpgroup never joins it).
__device__ __forceinline__ void wg_sync_consumers() { asm volatile("bar.sync 1, %0;\n" ::"r"(WG_CONSUMERS) : "memory"); }

extern "C" __global__ void __launch_bounds__(WG_THREADS, 1)
fast_wgemm(const __grid_constant__ WgMap wmap_p, const __grid_constant__ WgMap xmap_p, int M, int N, int K,
           float* __restrict__ out, float* __restrict__ scratch, int* __restrict__ counters) {
    extern __shared__ unsigned char wg_raw[];
    unsigned char* base = wg_raw + ((1024 - (ht_smem_u32(wg_raw) & 1023)) & 1023);
    u64* bars = reinterpret_cast<u64*>(base + WG_STAGES * WG_STAGE_BYTES);
    int* flag = reinterpret_cast<int*>(bars + 2 * WG_STAGES);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2;
    const int G = gridDim.x, b = blockIdx.x;
    const int KC = K / WG_KC, T = (N + WG_VT - 1) / WG_VT * KC;
    const int i0 = wg_first(b, T, G), i1 = wg_first(b + 1, T, G), n_it = i1 - i0;
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");  // the next kernel waits for our end anyway
    const unsigned s0 = ht_smem_u32(base), full0 = ht_smem_u32(bars), empty0 = full0 + 8 * WG_STAGES;
    if (tid == 0) ht_init_stage_bars(full0, empty0, WG_STAGES, WG_CONSUMERS);
    __syncthreads();
    if (wg == 2) {  // the producer warpgroup (384 threads start capped at 168 registers; it keeps 40)
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        if (warp == 8 && lane == 0) {
            const u64* wmap = wmap_p.v;
            const u64* xmap = xmap_p.v;
            const int pre = min(WG_STAGES, n_it);
            for (int q = 0; q < pre; ++q)  // the weights before the wait (written by no kernel of the sequence)
                wg_issue(s0 + q * WG_STAGE_BYTES, full0 + 8 * q, wmap, xmap, i0 + q, KC, true, true, false);
            asm volatile("griddepcontrol.wait;\n" ::: "memory");  // the kernel ahead (x's writer) completed
            for (int q = 0; q < pre; ++q)
                wg_issue(s0 + q * WG_STAGE_BYTES, full0 + 8 * q, wmap, xmap, i0 + q, KC, false, false, true);
            for (int q = pre; q < n_it; ++q) {
                const int st = q % WG_STAGES;
                ht_bar_wait(empty0 + 8 * st, (q / WG_STAGES - 1) & 1);  // its last use retired in both consumers
                wg_issue(s0 + st * WG_STAGE_BYTES, full0 + 8 * st, wmap, xmap, i0 + q, KC, true, true, true);
            }
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    const int g = lane >> 2, t = lane & 3;
    float acc[WG_NACC];
#pragma unroll
    for (int j = 0; j < WG_NACC; ++j) acc[j] = 0.f;
    int piece0 = i0;  // the current piece's first iteration
#pragma unroll 1
    for (int q = 0; q < n_it; ++q) {
        const int it = i0 + q, st = q % WG_STAGES;
        ht_bar_wait(full0 + 8 * st, (q / WG_STAGES) & 1);  // stage q landed
        const int tile = it / KC, kc = it - tile * KC;
        const unsigned sw = s0 + st * WG_STAGE_BYTES, sx = sw + WG_W_BYTES;
#pragma unroll
        for (int j = 0; j < WG_NACC; ++j) asm volatile("" : "+f"(acc[j])::"memory");
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int s = 0; s < WG_KC / 16; ++s)
            ht_wgmma(acc, ht_desc(sw + 64 * wg * 128 + 32 * s), ht_desc(sx + 32 * s), (it != piece0) | s);
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(empty0 + 8 * st) : "memory");
        if (kc != KC - 1 && it != i1 - 1) continue;

        // ---- the piece [piece0, it] of `tile` is summed
        const int vb = tile * WG_VT + 64 * wg + 16 * (warp & 3) + g;
        const int bf = wg_owner(tile * KC, T, G), bl = wg_owner(tile * KC + KC - 1, T, G);
        piece0 = it + 1;
        if (bf == bl) {  // the whole tile is this block's
            wg_store(out, acc, M, N, vb, t);
            continue;
        }
        // scratch slot 2 b for the block's first tile, 2 b + 1 for its last (a range cuts at most those two)
        const int slot = 2 * b + (tile != i0 / KC);
        float4* mine = reinterpret_cast<float4*>(scratch + (size_t)slot * WG_SLOT);
#pragma unroll
        for (int j = 0; j < WG_NACC / 4; ++j)
            mine[j * WG_CONSUMERS + tid] = make_float4(acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]);
        __threadfence();
        wg_sync_consumers();
        if (tid == 0) *flag = atomicAdd(&counters[tile], 1) == bl - bf;  // this piece is the tile's last
        wg_sync_consumers();
        const bool last = *flag;
        wg_sync_consumers();  // every consumer read the flag before the next piece's write of it
        if (!last) continue;
        __threadfence();
        // the pieces in block order (block p's slot for this tile), the first copied, the rest added
        float sum[WG_NACC];
        for (int p = bf; p <= bl; ++p) {
            const float4* src = reinterpret_cast<const float4*>(
                scratch + (size_t)(2 * p + (tile != wg_first(p, T, G) / KC)) * WG_SLOT);
#pragma unroll
            for (int j = 0; j < WG_NACC / 4; ++j) {
                const float4 z = __ldcg(src + j * WG_CONSUMERS + tid);
                const float w4[4] = {z.x, z.y, z.z, z.w};
#pragma unroll
                for (int e = 0; e < 4; ++e) sum[4 * j + e] = p == bf ? w4[e] : sum[4 * j + e] + w4[e];
            }
        }
        wg_store(out, sum, M, N, vb, t);
        if (tid == 0) counters[tile] = 0;  // ready for the next launch (kernels of one stream run in order)
    }
}

#else  // plain sm_90 (CI's build of every kernels_cu/*.cu): no wgmma; fast_wgemm.py builds sm_90a only
extern "C" __global__ void fast_wgemm(const WgMap, const WgMap, int, int, int, float*, float*, int*) { __trap(); }
#endif
