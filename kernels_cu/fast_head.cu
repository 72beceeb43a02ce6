// Fast mode (kernels_cu/fast_head.py): the head GEMM with the per-row top-k in its epilogue, so
// candidate_topk / proposal_head read the head once and their logits never reach memory.
//
//   logits[n, v] = x[n, :] . W[v, :]   (x: HT_N padded hidden rows of BF16 bits, W: Vr head rows)
//
// then the best k (C4 order: value descending, ties to the lower head row, docs/contracts.md) of
// each hidden row among the head rows v < n_elig. One block per multiprocessor (persistent): block b
// owns head rows [b Vr / G, (b + 1) Vr / G) and walks them in tiles of 256 rows, each tile over the
// whole K in stages of 64; it writes the best k keys of its rows per hidden row, and
// fast_topk_merge_warp (fast_select.cu) merges the G lists of a row as it merges any partial lists,
// the score read back from the key (fk_key holds the logit's bits).
//
// The GEMM runs on wgmma (sm_90a only: __CUDA_ARCH_FEAT_SM90_ALL; the plain sm_90 build of this file,
// which CI makes of every kernels_cu/*.cu, leaves a kernel that traps, and fast_head.py never launches
// it). Two warpgroups a block; warpgroup w computes head rows [128 w, 128 w + 128) of the tile as two
// m64nNk16 wgmma chains (A = head rows, B = the hidden rows, N = HT_N, both K-major from shared memory,
// no swizzle: 8 x 8 core matrices of 128 contiguous bytes, the next 8 K 128 bytes on, the next 8 rows
// 1024 bytes on; benchmarks/wgmma_probe.py measured which descriptor offset is which). FP32
// accumulation over K in order, 16 at a time, as the tensor cores do for cuBLAS.
//
// Stages: HT_STAGES buffers of [256 head rows x 64 K | HT_N hidden rows x 64 K], filled by cp.async
// (16 bytes a copy; rows past the block's range and hidden rows past M zero-filled) HT_STAGES - 1
// ahead, so the next tile's first stages are in flight while a tile's epilogue runs.
//
// Epilogue (after a tile's last stage): every logit of a valid (hidden row, head row) is offered to its
// hidden row's candidate buffer in shared memory (HT_CAP slots) if its key beats the row's threshold
// (the k-th best key the block has kept, 0 while fewer than k: KeyFilter); a slot is claimed by
// atomicAdd. A row whose buffer fills is compacted (one warp: its keys sorted, the best k kept, the
// threshold raised), and the logits that found no slot are offered again, until none is left. A key
// is dropped only when k kept keys beat it, so each block's list is its range's exact top k (keys are
// distinct); the order of the atomics changes nothing.
#include "topk_keys.cuh"

typedef unsigned short u16;

#ifndef HT_N
#define HT_N 128  // fast_head.py defines it (the hidden rows rounded up to 8); the CI build of this file takes 128
#endif
#define HT_THREADS 256
#define HT_VT 256  // head rows a tile
#define HT_KC 64   // K a stage
#ifndef HT_STAGES
#define HT_STAGES 4
#endif
#define HT_CAP 32  // candidate slots a hidden row (one per lane of the compacting warp); k <= 16
#define HT_W_BYTES (HT_VT * HT_KC * 2)
#define HT_X_BYTES (HT_N * HT_KC * 2)
#define HT_STAGE_BYTES (HT_W_BYTES + HT_X_BYTES)
#define HT_NACC (HT_N / 2)  // fp32 accumulators a thread for one m64 block
#define HT_PEND ((2 * HT_NACC + 31) / 32)
// dynamic shared memory: the stages, then per hidden row HT_CAP keys, its threshold and its count
#define HT_SMEM_BYTES (HT_STAGES * HT_STAGE_BYTES + HT_N * (HT_CAP * 8 + 8 + 4))

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

__device__ __forceinline__ unsigned ht_smem_u32(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// no-swizzle K-major descriptor: start address, leading offset 128 B (the next 8 K), stride offset 1024 B (the
// next 8 rows), each >> 4
__device__ __forceinline__ u64 ht_desc(unsigned addr) {
    return (u64)((addr & 0x3FFFF) >> 4) | ((u64)(128 >> 4) << 16) | ((u64)(1024 >> 4) << 32);
}

__device__ __forceinline__ void ht_cp16(unsigned dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
                 : "memory");
}

// One stage: head rows [row0, row0 + 256) (those >= r1 zero) and the HT_N hidden rows (those >= M zero), K
// [k0, k0 + 64). Copy q of a [rows x 64] operand lands at byte 16 q of it: row 8 (q / 64) + q % 8, K
// chunk (q / 8) % 8, so 8 consecutive copies fill one core matrix.
__device__ __forceinline__ void ht_load(unsigned sw, const u16* __restrict__ X, const u16* __restrict__ W, int M,
                                        int H, int r1, int row0, int k0, int tid) {
#pragma unroll
    for (int i = 0; i < HT_VT * 8 / HT_THREADS; ++i) {
        const int q = i * HT_THREADS + tid;
        const int v = row0 + (((q >> 6) << 3) | (q & 7)), c = (q >> 3) & 7;
        const bool ok = v < r1;
        ht_cp16(sw + 16 * q, ok ? W + (size_t)v * H + k0 + 8 * c : W, ok);
    }
    const unsigned sx = sw + HT_W_BYTES;
#pragma unroll
    for (int q = tid; q < HT_N * 8; q += HT_THREADS) {
        const int n = ((q >> 6) << 3) | (q & 7), c = (q >> 3) & 7;
        const bool ok = n < M;
        ht_cp16(sx + 16 * q, ok ? X + (size_t)n * H + k0 + 8 * c : X, ok);
    }
}

// Compact the candidate buffers of the hidden rows this warp owns (n = warp, warp + 8, ...) that hold more
// than k keys, or exactly k with no threshold yet: sorted, the best k kept in slots 0..k-1, the threshold the
// k-th. Warp-uniform.
__device__ __forceinline__ void ht_compact(u64* buf, u64* thr, int* cnt, int M, int k, int warp, int lane) {
    for (int n = warp; n < M; n += HT_THREADS / 32) {
        const int c = cnt[n];
        const u64 t = thr[n];
        if (!(c > k || (c == k && t == 0ull))) continue;
        const u64 key = lane < min(c, HT_CAP) ? buf[n * HT_CAP + lane] : 0ull;
        const u64 s = warp_sort_desc(key, lane);
        __syncwarp();
        if (lane < k) buf[n * HT_CAP + lane] = s;
        const u64 kth = __shfl_sync(0xffffffffu, s, k - 1);
        if (lane == 0) {
            thr[n] = kth;
            cnt[n] = k;
        }
        __syncwarp();
    }
}

extern "C" __global__ void __launch_bounds__(HT_THREADS, 1)
fast_head_topk(const u16* __restrict__ X, const u16* __restrict__ W, int M, int Vr, int n_elig, int H, int k,
               u64* __restrict__ partial, float* __restrict__ dump) {
    extern __shared__ __align__(1024) unsigned char ht_raw[];
    u64* buf = reinterpret_cast<u64*>(ht_raw + HT_STAGES * HT_STAGE_BYTES);
    u64* thr = buf + HT_N * HT_CAP;
    int* cnt = reinterpret_cast<int*>(thr + HT_N);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2;
    const int g = lane >> 2, t = lane & 3;
    const int G = gridDim.x, b = blockIdx.x;
    const int r0 = (int)((long long)b * Vr / G), r1 = (int)((long long)(b + 1) * Vr / G);
    const int elig = min(r1, n_elig);
    const int KC = H / HT_KC;
    const int total = (r1 - r0 + HT_VT - 1) / HT_VT * KC;
    for (int i = tid; i < HT_N; i += HT_THREADS) {
        thr[i] = 0ull;
        cnt[i] = 0;
    }
    const unsigned s0 = ht_smem_u32(ht_raw);
#pragma unroll 1
    for (int p = 0; p < HT_STAGES - 1; ++p) {
        if (p < total) ht_load(s0 + p * HT_STAGE_BYTES, X, W, M, H, r1, r0 + p / KC * HT_VT, p % KC * HT_KC, tid);
        asm volatile("cp.async.commit_group;\n" ::: "memory");
    }
    float acc[2][HT_NACC];
#pragma unroll
    for (int mb = 0; mb < 2; ++mb)
#pragma unroll
        for (int j = 0; j < HT_NACC; ++j) acc[mb][j] = 0.f;
#pragma unroll 1
    for (int it = 0; it < total; ++it) {
        asm volatile("cp.async.wait_group %0;\n" ::"n"(HT_STAGES - 2) : "memory");
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // cp.async writes, read by wgmma
        __syncthreads();  // every thread's copies of stage `it` landed; every wgmma of it - 1 retired
        {
            const int nx = it + HT_STAGES - 1;
            if (nx < total)
                ht_load(s0 + nx % HT_STAGES * HT_STAGE_BYTES, X, W, M, H, r1, r0 + nx / KC * HT_VT,
                        nx % KC * HT_KC, tid);
            asm volatile("cp.async.commit_group;\n" ::: "memory");
        }
        const int kc = it % KC;
        const unsigned sw = s0 + it % HT_STAGES * HT_STAGE_BYTES, sx = sw + HT_W_BYTES;
#pragma unroll
        for (int mb = 0; mb < 2; ++mb)
#pragma unroll
            for (int j = 0; j < HT_NACC; ++j) asm volatile("" : "+f"(acc[mb][j])::"memory");
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#ifndef HT_PROBE_NO_MMA  // probe switch (benchmarks/fast_head_probe.py): the stream without the tensor cores
#pragma unroll
        for (int s = 0; s < HT_KC / 16; ++s) {
            const u64 db = ht_desc(sx + 256 * s);
#pragma unroll
            for (int mb = 0; mb < 2; ++mb)
                ht_wgmma(acc[mb], ht_desc(sw + (16 * wg + 8 * mb) * 1024 + 256 * s), db, (kc | s) != 0);
        }
#endif
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        if (kc != KC - 1) continue;

        // ---- epilogue of the tile: value (mb, 4 i + e) is head row rowb + 64 mb + 8 (e / 2), hidden row
        // 8 i + 2 t + e % 2 (the m64nN accumulator layout)
        const int rowb = r0 + it / KC * HT_VT + 128 * wg + 16 * (warp & 3) + g;
        u32 pend[HT_PEND];
#pragma unroll
        for (int w = 0; w < HT_PEND; ++w) pend[w] = 0u;
#pragma unroll
        for (int mb = 0; mb < 2; ++mb)
#pragma unroll
            for (int j = 0; j < HT_NACC; ++j) {
                const int v = rowb + 64 * mb + 8 * ((j & 3) >> 1), n = 8 * (j >> 2) + 2 * t + (j & 1);
                if (v < elig && n < M) pend[(mb * HT_NACC + j) >> 5] |= 1u << ((mb * HT_NACC + j) & 31);
                if (dump && v < r1 && n < M) dump[(size_t)n * Vr + v] = acc[mb][j];
            }
#ifdef HT_PROBE_NO_EPILOGUE  // probe switch: the tile's GEMM without the selection
        continue;
#endif
        for (;;) {
#pragma unroll
            for (int i = 0; i < HT_N / 8; ++i) {
                // the 8 values of chunk i: bits 4 i .. 4 i + 3 of each m64 block
                const int n0 = 8 * i + 2 * t;
                const KeyFilter f0(thr[n0]), f1(thr[n0 + 1]);
#pragma unroll
                for (int mb = 0; mb < 2; ++mb)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int bit = mb * HT_NACC + 4 * i + e;
                        const u32 mask = 1u << (bit & 31);
                        if (!(pend[bit >> 5] & mask)) continue;
                        const float z = acc[mb][4 * i + e];
                        const int v = rowb + 64 * mb + 8 * (e >> 1), n = n0 + (e & 1);
                        if ((e & 1) ? f1.passes(z, v) : f0.passes(z, v)) {
                            const int pos = atomicAdd(&cnt[n], 1);
                            if (pos >= HT_CAP) continue;  // the row's buffer is full: offered again after compaction
                            buf[n * HT_CAP + pos] = fk_key(z, v);
                        }
                        pend[bit >> 5] &= ~mask;
                    }
            }
            u32 left = 0u;
#pragma unroll
            for (int w = 0; w < HT_PEND; ++w) left |= pend[w];
            const int again = __syncthreads_or(left != 0u);
            ht_compact(buf, thr, cnt, M, k, warp, lane);
            __syncthreads();
            if (!again) break;
        }
    }
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    __syncthreads();
    // this block's list for each hidden row: its kept keys (descending once compacted), 0 past them
    for (int i = tid; i < M * k; i += HT_THREADS) {
        const int n = i / k, j = i - n * k;
        partial[((size_t)n * G + b) * k + j] = j < cnt[n] ? buf[n * HT_CAP + j] : 0ull;
    }
}

#else  // not sm_90a: no wgmma; fast_head.py launches this module only when built for sm_90a

extern "C" __global__ void fast_head_topk(const u16*, const u16*, int, int, int, int, int, u64*, float*) { __trap(); }

#endif
