// Fast mode (kernels_cu/fast/head.py): the head GEMM with the per-row top-k in its epilogue, so
// candidate_topk / proposal_head read the head once and their logits never reach memory.
//
//   logits[n, v] = x[n, :] . W[v, :]   (x: HT_N padded hidden rows of BF16 bits, W: Vr head rows)
//
// then the best k (C4 order: value descending, ties to the lower head row, docs/contracts.md) of
// each hidden row among the head rows v < n_elig. Two kernels: fast_head_topk (this header) and
// fast_head_topk_pp (the ping-pong kernel, below, the one fast/head.py launches by default: the same
// stream and merge, 128-row tiles whose selection runs under the other warpgroup's stream, and lists that may
// hold fewer than k keys where another block's threshold was higher: HP_SHARED_THR).
// One block per multiprocessor (persistent): block b
// owns head rows [b Vr / G, (b + 1) Vr / G) (cut on 64-row boxes) and walks them in tiles of 256 rows, each tile over the
// whole K in stages of 64; it writes the best k keys of its rows per hidden row, and
// fast_topk_merge_warp (fast/topk.cu) merges the G lists of a row as it merges any partial lists,
// the score read back from the key (fk_key holds the logit's bits).
//
// The GEMM runs on wgmma (sm_90a only: __CUDA_ARCH_FEAT_SM90_ALL; the plain sm_90 build of this file,
// which CI makes of every kernels_cu/*.cu, leaves a kernel that traps, and fast/head.py never launches
// it). Two warpgroups a block; warpgroup w computes head rows [128 w, 128 w + 128) of the tile as two
// m64nNk16 wgmma chains (A = head rows, B = the hidden rows, N = HT_N, both K-major from shared memory in the
// tensor copies' 128-byte swizzle: rows of 128 bytes, 8-row groups 1024 bytes apart, ht_desc). FP32
// accumulation over K in order, 16 at a time, as the tensor cores do for cuBLAS.
//
// Stages: HT_STAGES buffers of [256 head rows x 64 K | HT_N hidden rows x 64 K], filled by the tensor copy
// engine (cp.async.bulk.tensor; maps from fast/head.py: boxes of 64 K x 64 head rows and 64 K x HT_N hidden rows,
// 128-byte swizzle, hidden rows past M read as zeros), HT_STAGES - 1 ahead, each completing on an mbarrier; one
// thread issues them. The H200 streamed the 27B head at 3.85-3.92 TB/s this way, against 2.1 TB/s with 16-byte
// cp.async copies by every thread.
//
// Epilogue (after a tile's last stage): every logit of a valid (hidden row, head row) is offered to its
// hidden row's candidate buffer in shared memory (HT_CAP slots) if its key beats the row's threshold
// (the k-th best key the block has kept, 0 while fewer than k; the first tile's seeded from group maxima);
// a float pre-filter first, the key compare on the rest; a slot is claimed by atomicAdd. A row whose buffer
// nears full is compacted (one warp: its keys sorted, the best k kept, the threshold raised), and the logits
// that found no slot are offered again, until none is left. A key
// is dropped only when k kept keys beat it, so each block's list is its range's exact top k (keys are
// distinct); the order of the atomics changes nothing.
#include "topk_keys.cuh"

typedef unsigned short u16;

#ifndef HT_N
#define HT_N 128  // fast/head.py defines it (the hidden rows rounded up to 8); the CI build of this file takes 128
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
// dynamic shared memory: up to 1 KiB of alignment slack, the stages, per hidden row HT_CAP keys and its threshold,
// a barrier a stage, a count a hidden row
#define HT_SMEM_BYTES (1024 + HT_STAGES * HT_STAGE_BYTES + HT_N * (HT_CAP * 8 + 8) + HT_STAGES * 8 + HT_N * 4)

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

#include "tma_wgmma.cuh"  // ht_smem_u32, ht_desc, ht_bar_wait, ht_tma

// Issued by one thread: the stage of VT head rows from row0 and K from k0 into the buffer at sw. The head rows come
// as boxes of 64 rows (those starting at or past r1 are skipped: their rows are never selected), then the hidden
// rows as one box of HT_N rows (rows >= M read as zeros: out of the map's bounds). The barrier expects every box's
// full bytes.
template <int VT>
__device__ __forceinline__ void ht_issue(unsigned sw, unsigned bar, const u64* wmap, const u64* xmap, int row0, int r1,
                                         int k0) {
    const int boxes = min(VT / 64, (r1 - row0 + 63) / 64);
    const unsigned bytes = boxes * 64 * HT_KC * 2 + HT_X_BYTES;
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
    for (int j = 0; j < boxes; ++j) ht_tma(sw + j * 64 * HT_KC * 2, wmap, k0, row0 + 64 * j, bar);
    ht_tma(sw + VT * HT_KC * 2, xmap, k0, 0, bar);
}

// Block b's head rows [r0, r1) of Vr, the G blocks' ranges cut on 64-row boxes.
// floor(b units / G) in 32-bit arithmetic (b <= G < 2^15, the grid): b q + floor(b r / G) for units = q G + r, no
// 64-bit division (a called subroutine whose register convention made ptxas spill the ping-pong kernel's row range).
__device__ __forceinline__ int ht_cut(int b, int G, int units) {
    const int q = units / G, r = units - q * G;
    return b * q + b * r / G;
}

__device__ __forceinline__ void ht_block_rows(int b, int G, int Vr, int& r0, int& r1) {
    const int units = (Vr + 63) / 64;
    r0 = ht_cut(b, G, units) * 64;
    r1 = min(Vr, ht_cut(b + 1, G, units) * 64);
}

// This block's list for each hidden row into partial [M, G, k]: its kept keys (descending where compacted), 0 past
// them; by `threads` threads from tid.
template <int BS = HT_CAP>  // BS: u64 from one hidden row's buffer to the next
__device__ __forceinline__ void ht_write_lists(u64* partial, const u64* buf, const int* cnt, int M, int k, int G,
                                               int b, int tid, int threads) {
    for (int i = tid; i < M * k; i += threads) {
        const int n = i / k, j = i - n * k;
        partial[((size_t)n * G + b) * k + j] = j < cnt[n] ? buf[n * BS + j] : 0ull;
    }
}

// One hidden row's buffer (its first c <= HT_CAP keys) sorted by the warp, the best k written to slots 0..k-1; returns
// the k-th, the row's new threshold. Warp-uniform (every compaction of both kernels but the lane form's tile end).
__device__ __forceinline__ u64 ht_keep_best(u64* row, int c, int k, int lane) {
    const u64 s = warp_sort_desc(lane < c ? row[lane] : 0ull, lane);
    __syncwarp();
    if (lane < k) row[lane] = s;
    return __shfl_sync(0xffffffffu, s, k - 1);
}

// Compact the candidate buffers of the hidden rows this warp owns (n = warp, warp + 8, ...) that hold more than
// `limit` keys (>= k): sorted, the best k kept in slots 0..k-1, the threshold the k-th. Warp-uniform.
template <int BS = HT_CAP>
__device__ __forceinline__ void ht_compact(u64* buf, u64* thr, int* cnt, int M, int k, int limit, int warp,
                                           int lane) {
    for (int n = warp; n < M; n += HT_THREADS / 32) {
        const int c = cnt[n];
        if (c <= limit) continue;
        const u64 kth = ht_keep_best(buf + n * BS, min(c, HT_CAP), k, lane);
        if (lane == 0) {
            thr[n] = kth;
            cnt[n] = k;
        }
        __syncwarp();
    }
}

extern "C" __global__ void __launch_bounds__(HT_THREADS, 1)
fast_head_topk(const u64* __restrict__ maps, int M, int Vr, int n_elig, int H, int k, u64* __restrict__ partial,
               float* __restrict__ dump, u64* __restrict__ gthr) {  // gthr: the ping-pong kernel's (unused here)
    extern __shared__ unsigned char ht_raw[];
    // the stages 1024-byte aligned (the swizzle pattern's period; HT_SMEM_BYTES has the slack)
    unsigned char* base = ht_raw + ((1024 - (ht_smem_u32(ht_raw) & 1023)) & 1023);
    u64* buf = reinterpret_cast<u64*>(base + HT_STAGES * HT_STAGE_BYTES);
    u64* thr = buf + HT_N * HT_CAP;
    u64* bars = thr + HT_N;
    int* cnt = reinterpret_cast<int*>(bars + HT_STAGES);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2;
    const int g = lane >> 2, t = lane & 3;
    const int G = gridDim.x, b = blockIdx.x;
    int r0, r1;
    ht_block_rows(b, G, Vr, r0, r1);
    const int elig = min(r1, n_elig);
    const int KC = H / HT_KC;
    const int total = r1 > r0 ? (r1 - r0 + HT_VT - 1) / HT_VT * KC : 0;
    const u64* wmap = maps;
    const u64* xmap = maps + 16;
    for (int i = tid; i < HT_N; i += HT_THREADS) {
        thr[i] = 0ull;
        cnt[i] = 0;
    }
    const unsigned s0 = ht_smem_u32(base), b0 = ht_smem_u32(bars);
    if (tid == 0) {
        for (int st = 0; st < HT_STAGES; ++st)
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(b0 + 8 * st) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        // the maps were written to global memory before the launch: acquired for the tensor-map proxy
        asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;\n" ::"l"(wmap) : "memory");
        asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;\n" ::"l"(xmap) : "memory");
        for (int p = 0; p < HT_STAGES - 1 && p < total; ++p)
            ht_issue<HT_VT>(s0 + p * HT_STAGE_BYTES, b0 + 8 * p, wmap, xmap, r0 + p / KC * HT_VT, r1, p % KC * HT_KC);
    }
    __syncthreads();
    float acc[2][HT_NACC];
#pragma unroll
    for (int mb = 0; mb < 2; ++mb)
#pragma unroll
        for (int j = 0; j < HT_NACC; ++j) acc[mb][j] = 0.f;
#pragma unroll 1
    for (int it = 0; it < total; ++it) {
        ht_bar_wait(b0 + 8 * (it % HT_STAGES), (it / HT_STAGES) & 1);  // stage `it` landed
        __syncthreads();  // and every wgmma of it - 1 retired: its buffer may be refilled
        if (tid == 0) {
            const int nx = it + HT_STAGES - 1;
            if (nx < total)
                ht_issue<HT_VT>(s0 + nx % HT_STAGES * HT_STAGE_BYTES, b0 + 8 * (nx % HT_STAGES), wmap, xmap,
                                r0 + nx / KC * HT_VT, r1, nx % KC * HT_KC);
        }
        const int kc = it % KC;
        const unsigned sw = s0 + it % HT_STAGES * HT_STAGE_BYTES, sx = sw + HT_W_BYTES;
#pragma unroll
        for (int mb = 0; mb < 2; ++mb)
#pragma unroll
            for (int j = 0; j < HT_NACC; ++j) asm volatile("" : "+f"(acc[mb][j])::"memory");
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int s = 0; s < HT_KC / 16; ++s) {
            const u64 db = ht_desc(sx + 32 * s);
#pragma unroll
            for (int mb = 0; mb < 2; ++mb)
                ht_wgmma(acc[mb], ht_desc(sw + (128 * wg + 64 * mb) * 128 + 32 * s), db, (kc | s) != 0);
        }
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        if (kc != KC - 1) continue;

        // ---- epilogue of the tile: value (mb, 4 i + e) is head row rowb + 64 mb + 8 (e / 2), hidden row
        // 8 i + 2 t + e % 2 (the m64nN accumulator layout)
        const int rowb = r0 + it / KC * HT_VT + 128 * wg + 16 * (warp & 3) + g;
        // pending bits: value (mb, 4 i + e) is bit 4 mb + e of byte i, so a chunk's 8 values are one byte
        u32 pend[HT_PEND];
#pragma unroll
        for (int w = 0; w < HT_PEND; ++w) pend[w] = 0u;
#pragma unroll
        for (int mb = 0; mb < 2; ++mb)
#pragma unroll
            for (int j = 0; j < HT_NACC; ++j) {
                const int v = rowb + 64 * mb + 8 * ((j & 3) >> 1), n = 8 * (j >> 2) + 2 * t + (j & 1);
                const int bit = 8 * (j >> 2) + 4 * mb + (j & 3);
                if (v < elig && n < M) pend[bit >> 5] |= 1u << (bit & 31);
#ifdef HT_DUMP  // tests' build (fast/head.py builds it when given a dump array): the logits to dump as well
                if (dump && v < r1 && n < M) dump[(size_t)n * Vr + v] = acc[mb][j];
#endif
            }
        if (it < KC) {
            // The block's first tile, thresholds still 0 (every logit would pass and the buffers overflow pass after
            // pass). Seed them: per hidden row, the largest logit of each of the 16 groups (warp, m64 block) of 16
            // head rows (NaN for a group with none: fmaxf skips NaNs) goes to slots 16.. of its still empty buffer.
            // If the k-th largest of those, f, is a number, k logits are >= f, so every key of a lower value can be
            // dropped: threshold = the smallest key of value f (row word 0, below every real row's key of value f,
            // which all pass it; k <= 16). No key - 1: below +0's ordered word sits -0's, which fk_key never makes
            // and which reads back as a float equal to +0.
#pragma unroll
            for (int i = 0; i < HT_N / 8; ++i)
#pragma unroll
                for (int mb = 0; mb < 2; ++mb)
#pragma unroll
                    for (int c = 0; c < 2; ++c) {
                        const int bl = 8 * i + 4 * mb + c, bh = bl + 2;
                        const float nan = __int_as_float(0x7fc00000);
                        float best = fmaxf((pend[bl >> 5] >> (bl & 31)) & 1u ? acc[mb][4 * i + c] : nan,
                                           (pend[bh >> 5] >> (bh & 31)) & 1u ? acc[mb][4 * i + 2 + c] : nan);
#pragma unroll
                        for (int o = 4; o < 32; o <<= 1) best = fmaxf(best, __shfl_xor_sync(0xffffffffu, best, o));
                        if (g == 0)
                            buf[(8 * i + 2 * t + c) * HT_CAP + 16 + 2 * warp + mb] = best == best ? fk_key(best, -1) : 0ull;
                    }
            __syncthreads();
            for (int n = warp; n < M; n += HT_THREADS / 32) {
                const u64 key = lane >= 16 ? buf[n * HT_CAP + lane] : 0ull;
                const u64 kth = __shfl_sync(0xffffffffu, warp_sort_desc(key, lane), k - 1);
                if (lane == 0 && kth) thr[n] = kth;
            }
            __syncthreads();
        }
        for (;;) {
#pragma unroll
            for (int i = 0; i < HT_N / 8; ++i) {
                const int n0 = 8 * i + 2 * t;
                const u32 mine = (pend[i >> 2] >> (8 * (i & 3))) & 0xffu;
                if (!mine) continue;
                // A float pre-filter first, one compare a value: !(z < f) with f the threshold key's float (-inf
                // for an empty list, NaN for a NaN key) keeps every value the exact filter could pass (z >= f,
                // and NaNs); once the thresholds are up most values fail it, and only the rest meet the exact
                // filter on the branch to a slot: the key itself against the threshold key (integer compares; a
                // float compare of equal values would see -ftz's flushed denormals as ties).
                const u64 t0 = thr[n0], t1 = thr[n0 + 1];
                const float f0 = key_float(t0), f1 = key_float(t1);
                u32 pass = 0u;
#pragma unroll
                for (int mb = 0; mb < 2; ++mb)
#pragma unroll
                    for (int e = 0; e < 4; ++e)
                        pass |= (u32)(!(acc[mb][4 * i + e] < ((e & 1) ? f1 : f0))) << (4 * mb + e);
                pass &= mine;
                u32 done = mine & ~pass;  // below the threshold's value: dropped (k kept keys beat them)
                if (pass) {
#pragma unroll
                    for (int mb = 0; mb < 2; ++mb)
#pragma unroll
                        for (int e = 0; e < 4; ++e) {
                            if (!((pass >> (4 * mb + e)) & 1u)) continue;
                            const u64 key = fk_key(acc[mb][4 * i + e], rowb + 64 * mb + 8 * (e >> 1));
                            if (key <= ((e & 1) ? t1 : t0)) {
                                done |= 1u << (4 * mb + e);
                                continue;
                            }
                            const int n = n0 + (e & 1);
                            const int pos = atomicAdd(&cnt[n], 1);
                            if (pos >= HT_CAP) continue;  // the row's buffer is full: offered again after compaction
                            buf[n * HT_CAP + pos] = key;
                            done |= 1u << (4 * mb + e);
                        }
                }
                pend[i >> 2] &= ~(done << (8 * (i & 3)));
            }
            u32 left = 0u;
#pragma unroll
            for (int w = 0; w < HT_PEND; ++w) left |= pend[w];
            const int again = __syncthreads_or(left != 0u);
            // compact rows near full only (a sort a row and tile otherwise); a row that overflowed is above this
            ht_compact(buf, thr, cnt, M, k, HT_CAP - 8, warp, lane);
            __syncthreads();
            if (!again) break;
        }
    }
    __syncthreads();
    ht_compact(buf, thr, cnt, M, k, k, warp, lane);  // every row down to its best k
    __syncthreads();
    ht_write_lists(partial, buf, cnt, M, k, G, b, tid, HT_THREADS);
}

// ---- Ping-pong kernel (fast_head_topk_pp; FastOptions.head_pingpong). The kernel above selects from registers: its
// accumulator layout gives each thread 2 hidden rows x 4 head rows a chunk, so the offer is unrolled over every
// chunk (about 6.7k instructions a warp and pass at N 120 on sm_90a) and runs while the stream waits; at 120 rows it
// took 24 % of the kernel (SM clock stamps). Here:
// - the two consumer warpgroups take turns over tiles of 128 head rows (warpgroup w: tiles w, w + 2, ...), so one
//   computes on the stream while the other selects;
// - a producer warpgroup (one lane of warp 8; setmaxnreg gives its registers to the consumers, whose code uses
//   176 at N 120 against the 168 a thread of 384 starts with) issues the tensor
//   copies of every stage in order, each once its buffer's empty barrier says the last consumer's wgmma retired;
// - a selection first stages the tile's logits in shared memory (hidden row n's 128 logits contiguous, rows
//   HP_LS floats apart: the accumulator stores and the float4 reads are free of bank conflicts), then lane n of
//   the warpgroup owns hidden row n (hp_select_lanes, below: a float maximum a set of 16 values against the
//   row's threshold, keys only for the sets that pass, each row compacted at the tile's end). The warp form, a
//   warp a hidden row (hp_select: each lane 4 keys, slots from ballots; HP_WARP_ROWS, the Ops' build at few rows):
//   its rows run one after another in a latency chain, 17.5k cycles a tile with nothing passing. While a row's list
//   is empty its threshold is seeded from the maxima of its 32 groups of 4 head rows: the k-th largest, f, has k
//   logits >= f, so the smallest key of value f (row word 0) may be the threshold. The lane form shares each row's
//   threshold with the other blocks through global memory (HP_SHARED_THR, at hp_shared_thr below). The block's last
//   tile, which nothing overlaps, is selected after the loop (the lane form: the first warpgroup; the warp form: both).
// Turns (two tokens in shared memory): the selections run in tile order, one at a time (they share the staging
// area and the buffers); the main loops start in tile order too, tile j once tile j - 1's owner saw its last
// stage land. A full barrier tells phases apart by parity alone: a warpgroup that ran ahead to tile j + 2 would
// wait on a buffer whose previous use (tile j + 1's stage) had not landed and read that phase's completion as its
// own (a hang at 3+ tiles a block).
#define HP_THREADS 384  // two consumer warpgroups and a producer warpgroup (one lane of it issues)
#define HP_VT 128       // head rows a tile (one warpgroup's two m64 blocks)
#ifndef HP_STAGES
#define HP_STAGES (4 - (HT_N > 120))  // what fits beside the staged logits (N 128: 3)
#endif
#define HP_W_BYTES (HP_VT * HT_KC * 2)
#define HP_STAGE_BYTES (HP_W_BYTES + HT_X_BYTES)
#define HP_LS 132  // floats a hidden row of the staged logits: 128, + 4 (2 t HP_LS is 8 t banks apart)
#define HP_BS (HT_CAP + 1)  // u64 a hidden row's buffer: HT_CAP slots + 1, so the lanes' stores to their rows' slot c
                            // fall on 16 bank pairs, not one (33 u64 = 66 words: row n at bank 2 n + 2 c mod 32)
// dynamic shared memory: the slack, the stages, the staged logits, per hidden row HP_BS keys' room and its threshold,
// a full and an empty barrier a stage, a count a hidden row, the two turn tokens
#define HP_SMEM_BYTES (1024 + HP_STAGES * HP_STAGE_BYTES + HT_N * HP_LS * 4 + HT_N * (HP_BS * 8 + 8) + 2 * HP_STAGES * 8 + HT_N * 4 + 8)

__device__ __forceinline__ void hp_bar_wg(int wg) { asm volatile("bar.sync %0, 128;\n" ::"r"(1 + wg) : "memory"); }

// One warp's share of a tile's selection (header above): hidden rows n = w, w + ws, ... < M (ws 4: a warpgroup's
// warps; 8: both warpgroups', the block's last tile), the tile's logits in lg (n HP_LS apart, head row tile0 + v at v),
// the first nv head rows eligible. The next row's loads are issued before this row's work (each selecting warp is
// alone on its scheduler but for the other warpgroup's main loop: nothing else hides their latency); a row is this
// warp's alone during the tile, so its values cannot change in between.
__device__ __forceinline__ void hp_select(const float* __restrict__ lg, u64* __restrict__ buf, u64* __restrict__ thr,
                                          int* __restrict__ cnt, int M, int k, int tile0, int nv, int w, int ws,
                                          int lane
) {
    const unsigned full = 0xffffffffu;
    const int v0 = 4 * lane;
    const u32 lt = (1u << lane) - 1u;  // the lanes below this one
    if (w >= M) return;
    u64 t_nx = thr[w];
    int c_nx = cnt[w];
    float4 z_nx = *reinterpret_cast<const float4*>(lg + w * HP_LS + v0);
#pragma unroll 1
    for (int n = w; n < M; n += ws) {
        u64 t = t_nx;
        int c = c_nx;
        const float4 z4 = z_nx;
        if (n + ws < M) {
            t_nx = thr[n + ws];
            c_nx = cnt[n + ws];
            z_nx = *reinterpret_cast<const float4*>(lg + (n + ws) * HP_LS + v0);
        }
        u64 key[4];
        key[0] = fk_key(z4.x, tile0 + v0);
        key[1] = fk_key(z4.y, tile0 + v0 + 1);
        key[2] = fk_key(z4.z, tile0 + v0 + 2);
        key[3] = fk_key(z4.w, tile0 + v0 + 3);
#pragma unroll
        for (int e = 0; e < 4; ++e)
            if (v0 + e >= nv) key[e] = 0ull;  // not eligible: below every threshold (key 0 is never a real key)
        if (t == 0ull && c == 0) {
            // The row's list is empty (its first tile): a threshold from the tile itself, row word 0 (below every
            // real key of its value), so a key below it is beaten k times.
       // words; for Gaussian logits about 20 of 128 keys pass at k 16)
            u32 mx = 0u;
#pragma unroll
            for (int e = 0; e < 4; ++e) mx = max(mx, (u32)(key[e] >> 32));
            t = (u64)__shfl_sync(full, warp_sort_desc(mx, lane), k - 1) << 32;
        }
        u32 bits = 0u;
#pragma unroll
        for (int e = 0; e < 4; ++e) bits |= (u32)(key[e] > t) << e;
        if (!__any_sync(full, bits != 0u)) continue;
        for (;;) {
            // slots c, c + 1, ...: value e of a lane after every value e' < e of the warp and value e of the lanes
            // below (four ballots, no prefix-sum chain)
            int base = c;
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const u32 bal = __ballot_sync(full, (bits >> e) & 1u);
                const int pos = base + __popc(bal & lt);
                if (((bits >> e) & 1u) && pos < HT_CAP) {
                    buf[n * HP_BS + pos] = key[e];
                    bits &= ~(1u << e);
                }
                base += __popc(bal);
            }
            if (base <= HT_CAP) {
                c = base;
                break;
            }
            // full with keys left: compact (sorted, the best k kept), raise the threshold, filter the rest again
            __syncwarp();
            t = ht_keep_best(buf + n * HP_BS, HT_CAP, k, lane);
            c = k;
#pragma unroll
            for (int e = 0; e < 4; ++e)
                if (!(key[e] > t)) bits &= ~(1u << e);
            __syncwarp();
            if (!__any_sync(full, bits != 0u)) break;
        }
        if (lane == 0) {
            thr[n] = t;
            cnt[n] = c;
        }
    }
}

// A hidden row's tile by one lane (fast_head_topk_pp's selection; HP_WARP_ROWS builds the warp-a-row form above):
// lane n of the warpgroup's 128 owns hidden row n (< M) for the tile, its threshold and count in registers (a warp
// with no row below M returns at once). The row's 128 logits are read as sets of HP_SET float4 (rows HP_LS floats
// apart: a quarter-warp's 16-byte reads fall on 8 distinct 4-bank sets), HP_AHEAD sets' loads in flight (a register
// ring, the set loop unrolled). A set is dropped whole when its largest float is below f, the threshold key's float
// (fmaxf skips NaN, and a NaN's key is below every number's, so below a number threshold; threshold words 0 and 1,
// an empty list or a NaN key, send every set on). In a set that passes, its values at or above f (eligible rows
// only) are the candidates: one a lane a step, picked from the registers, its key compared with the threshold and
// the key appended to the row's buffer. A lane whose buffer is full holds its candidate while the whole warp
// compacts the full rows, one at a time (sorted, the best k kept, the threshold raised). At the tile's end every
// row holding more than k keys is compacted by its own lane (below). While a row's list is empty
// its threshold is seeded: the k-th largest (k <= 16) of its 32 groups' largest ordered words (groups of 4 head
// rows, the warp form's lanes, so the same seed), kept by insertion into k registers, row word 0: k groups hold a
// key of at least that word, so a key below it is beaten k times. (tests/test_fast_head_model.py checks the set
// test, the seed and the compactions.)
#ifndef HP_SET
#define HP_SET 4  // float4 a set (16 head rows): one vote a set
#endif
#ifndef HP_AHEAD
#define HP_AHEAD 2  // sets whose loads are issued ahead of the one tested
#endif
__device__ __forceinline__ u32 hp_word(float z) { return (u32)(fk_key(z, 0) >> 32); }

// The set's value e (runtime) from its registers by a select tree on e's bits (depth 4 at HP_SET 4, not a chain of 15)
__device__ __forceinline__ float4 hp_sel4(bool p, const float4& a, const float4& b) {
    return make_float4(p ? b.x : a.x, p ? b.y : a.y, p ? b.z : a.z, p ? b.w : a.w);
}
__device__ __forceinline__ float hp_pick(const float4 (&z)[HP_SET], int e) {
    float4 q;
#if HP_SET == 4
    q = hp_sel4((e >> 3) & 1, hp_sel4((e >> 2) & 1, z[0], z[1]), hp_sel4((e >> 2) & 1, z[2], z[3]));
#else
    q = z[0];
#pragma unroll
    for (int i = 1; i < HP_SET; ++i) q = hp_sel4((e >> 2) == i, q, z[i]);
#endif
    const float lo = (e & 1) ? q.y : q.x, hi = (e & 1) ? q.w : q.z;
    return (e & 2) ? hi : lo;
}

// A candidate's key (set index e) offered to its row's buffer: dropped if not above the threshold, else appended while
// there is room (the candidate leaves `left` either way); with the buffer full the lane is stuck on it.
__device__ __forceinline__ void hp_offer(u64 key, int e, u64 t, u64* rowbuf, int& c, u32& left, bool& stuck) {
    if (!(key > t)) {
        left &= ~(1u << e);
    } else if (c < HT_CAP) {
        rowbuf[c++] = key;
        left &= ~(1u << e);
    } else {
        stuck = true;
    }
}

__device__ __forceinline__ float hp_max4(const float4& z) { return fmaxf(fmaxf(z.x, z.y), fmaxf(z.z, z.w)); }

// Shared thresholds (HP_SHARED_THR). Every key a block drops is beaten by k keys: its threshold t, a key of its own
// range or row word 0 below a value k of its keys reach, has k keys >= t. So t bounds the row's k-th best key over the
// whole head from below, and every block may drop what is below any block's t: a key z < t has k keys above it (keys
// are distinct; z == t only in t's own block, which keeps t). The lane form publishes each row's threshold after a tile
// (atomicMax into gthr[n], the kernel's last argument: a u64 a hidden row, zero at each launch's start by HP_CLEAN
// below, where it rose past the value read) and starts each tile from max(its own, gthr[n]), read from L2 (the other
// blocks' atomics). A block's list then holds only the keys of its range above the thresholds it
// saw, fewer than k where others did better; the merge's result is the same top k, since every key of the global
// top k passes every threshold. The sets' test drops most of a tile once the thresholds are shared (each block's
// first tile still seeds its own). The lists depend on the blocks' timing; the merged top k does not.
#ifndef HP_SHARED_THR
#define HP_SHARED_THR 1
#endif
// The launch leaves the shared thresholds zeroed for the next launch through the same words (HP_CLEAN):
// the block that finishes last, counted in the word after the rows' thresholds (gthr[HP_GTHR_ROWS], fast/head.py's
// NMAX), zeroes them and the count, once every block is past its last read and atomic of them. A memset before each
// launch would stand in the round's graph between the final norm and the head (about 4 us).
#ifndef HP_CLEAN
#define HP_CLEAN 1
#endif
#define HP_GTHR_ROWS 128
__device__ __forceinline__ u64 hp_shared_thr(const u64* gthr, int n, int M) {
#if HP_SHARED_THR
    return n < M ? __ldcg(gthr + n) : 0ull;
#else
    return 0ull;
#endif
}

__device__ __forceinline__ void hp_select_lanes(const float* __restrict__ lg, u64* __restrict__ buf,
                                                u64* __restrict__ thr, int* __restrict__ cnt, int M, int k, int tile0,
                                                int nv, int n, int lane, u64* __restrict__ gthr, u64 g
) {
    const unsigned full = 0xffffffffu;
    if (n - lane >= M) return;  // a warp without a live row (few hidden rows): nothing to do
    const bool live = n < M;
    const float4* row = reinterpret_cast<const float4*>(lg + (live ? n : 0) * HP_LS);
    // the row's threshold: its own, or the shared one where higher (HP_SHARED_THR; g is 0 without it)
    u64 t = live ? max(thr[n], g) : 0ull;
    int c = live ? cnt[n] : 0;
    if (__any_sync(full, live && t == 0ull && c == 0)) {  // a list still empty: the seed
        u32 top[16] = {0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u};  // descending (k <= 16)
#pragma unroll 4
        for (int q = 0; q < 32; ++q) {
            const float4 z = row[q];
            const int v = 4 * q;
            u32 w = max(max(v < nv ? hp_word(z.x) : 0u, v + 1 < nv ? hp_word(z.y) : 0u),
                        max(v + 2 < nv ? hp_word(z.z) : 0u, v + 3 < nv ? hp_word(z.w) : 0u));
#pragma unroll
            for (int i = 0; i < 16; ++i) {  // insertion: the larger stays, the smaller moves on (k steps: k is uniform)
                if (i == k) break;
                const u32 hi = max(top[i], w);
                w = min(top[i], w);
                top[i] = hi;
            }
        }
        u32 s = 0xffffffffu;  // the k-th: the least of the first k (a select by a runtime index would go to local memory)
#pragma unroll
        for (int i = 0; i < 16; ++i) s = i < k ? min(s, top[i]) : s;
        if (live && t == 0ull && c == 0) t = (u64)s << 32;
    }
    bool every = (t >> 32) <= 1ull;  // threshold words 0 / 1: the float test cannot decide
    float f = key_float(t);
    float4 zs[HP_AHEAD + 1][HP_SET];  // a ring of sets: HP_AHEAD sets' loads in flight beyond the one tested
#pragma unroll
    for (int a = 0; a < HP_AHEAD; ++a)
#pragma unroll
        for (int i = 0; i < HP_SET; ++i) zs[a][i] = row[HP_SET * a + i];
#pragma unroll
    for (int gi = 0; gi < 32 / HP_SET; ++gi) {  // unrolled: the ring's indices are constants
        if (gi + HP_AHEAD < 32 / HP_SET) {
#pragma unroll
            for (int i = 0; i < HP_SET; ++i) zs[(gi + HP_AHEAD) % (HP_AHEAD + 1)][i] = row[HP_SET * (gi + HP_AHEAD) + i];
        }
        const float4(&z)[HP_SET] = zs[gi % (HP_AHEAD + 1)];
        float m = hp_max4(z[0]);
#pragma unroll
        for (int i = 1; i < HP_SET; ++i) m = fmaxf(m, hp_max4(z[i]));
        if (!__any_sync(full, live && (every || m >= f))) continue;
        const int v0 = 4 * HP_SET * gi;
        // the set's candidates: values at or above f (every one while the float test cannot decide), eligible rows
        u32 left = 0u;
        if (live && (every || m >= f)) {
#pragma unroll
            for (int e = 0; e < 4 * HP_SET; ++e)
                left |= (u32)((every || hp_pick(z, e) >= f) && v0 + e < nv) << e;
        }
        // one candidate a lane a step, picked from
        // the set's registers (a shared-memory read would wait behind the other warpgroup's wgmma operand reads): a key
        // above the threshold goes to the buffer; a lane whose buffer is full keeps its candidate until the warp has
        // compacted its row
        while (__any_sync(full, left != 0u)) {
            bool stuck = false;
            if (left) {
                const int e1 = __ffs(left) - 1;
                const u64 key1 = fk_key(hp_pick(z, e1), tile0 + v0 + e1);
                hp_offer(key1, e1, t, buf + n * HP_BS, c, left, stuck);
            }
            // a full row is compacted at once, one at a time (full rows waiting until no lane could go on, sorted two at
            // once, measured slower: 0.688 against 0.666 ms at 120 rows, 0.366 against 0.320 at the 35B head)
            u32 fullrows = __ballot_sync(full, stuck);
            if (fullrows) __syncwarp();
            while (fullrows) {
                const int L = __ffs(fullrows) - 1;
                fullrows &= fullrows - 1u;
                const int nl = n - lane + L;
                const u64 kth = ht_keep_best(buf + nl * HP_BS, HT_CAP, k, lane);
                if (lane == L) {
                    t = max(t, kth);  // the buffer may hold keys of earlier tiles below a shared threshold
                    c = k;
                    every = (t >> 32) <= 1ull;
                    f = key_float(t);
                }
                __syncwarp();
            }
        }
    }
    // Tile-end compaction, each lane its own row, all of the warp's rows at once: a row holding more than k keys keeps
    // its best k in slots 0..k-1, the threshold the k-th, so the next tile starts from the exact k-th best key so far
    // and with HT_CAP - k free slots (mid-tile compactions, a warp sort each, become rare), and the block's last tile
    // leaves nothing to the final compaction. Slots k..c-1 are inserted into registers holding slots 0..k-1: a step
    // keeps the larger and moves the smaller on, so each insertion drops the least of the k + 1 keys, whatever the
    // registers' order (slots 0..k-1 are sorted after a warp compaction, in head-row order after a seed).
    if (__any_sync(full, live && c > k)) {
        if (live && c > k) {
            u64 top[16];
#pragma unroll
            for (int i = 0; i < 16; ++i) top[i] = i < k ? buf[n * HP_BS + i] : 0ull;
#pragma unroll 1
            for (int j = k; j < c; j += 4) {  // 4 loads at a time (one shared-memory latency, not 4); past c a 0 key,
                u64 w4[4];                       // which displaces nothing
#pragma unroll
                for (int q = 0; q < 4; ++q) w4[q] = j + q < c ? buf[n * HP_BS + j + q] : 0ull;
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    u64 w = w4[q];
#pragma unroll
                    for (int i = 0; i < 16; ++i) {
                        if (i == k) break;  // k steps (k is uniform)
                        const bool gt = w > top[i];
                        const u64 lo = gt ? top[i] : w;
                        top[i] = gt ? w : top[i];
                        w = lo;
                    }
                }
            }
            u64 kth = ~0ull;
#pragma unroll
            for (int i = 0; i < 16; ++i) {
                if (i < k) buf[n * HP_BS + i] = top[i];
                kth = i < k ? min(kth, top[i]) : kth;
            }
            t = max(t, kth);
            c = k;
        }
    }
    if (live) {
        thr[n] = t;
        cnt[n] = c;
#if HP_SHARED_THR
        if (t > g) atomicMax(reinterpret_cast<unsigned long long*>(gthr + n), (unsigned long long)t);
#endif
    }
}

extern "C" __global__ void __launch_bounds__(HP_THREADS, 1)
fast_head_topk_pp(const u64* __restrict__ maps, int M, int Vr, int n_elig, int H, int k, u64* __restrict__ partial,
                  float* __restrict__ dump, u64* __restrict__ gthr) {
    extern __shared__ unsigned char ht_raw[];
    unsigned char* base = ht_raw + ((1024 - (ht_smem_u32(ht_raw) & 1023)) & 1023);
    float* lg = reinterpret_cast<float*>(base + HP_STAGES * HP_STAGE_BYTES);
    u64* buf = reinterpret_cast<u64*>(lg + HT_N * HP_LS);
    u64* thr = buf + HT_N * HP_BS;
    u64* bars = thr + HT_N;  // full[HP_STAGES], then empty[HP_STAGES]
    int* cnt = reinterpret_cast<int*>(bars + 2 * HP_STAGES);
    volatile int* turn = cnt + HT_N;  // the tile whose selection may run next
    volatile int* mturn = turn + 1;   // the tile whose main loop may start
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2;
    const int G = gridDim.x, b = blockIdx.x;
    int r0, r1;
    ht_block_rows(b, G, Vr, r0, r1);
    const int elig = min(r1, n_elig);
    const int KC = H / HT_KC;
    const int tiles = r1 > r0 ? (r1 - r0 + HP_VT - 1) / HP_VT : 0;
    const int total = tiles * KC;
    const u64* wmap = maps;
    const u64* xmap = maps + 16;
    for (int i = tid; i < HT_N; i += HP_THREADS) {
        thr[i] = 0ull;
        cnt[i] = 0;
    }
    const unsigned s0 = ht_smem_u32(base), full0 = ht_smem_u32(bars), empty0 = full0 + 8 * HP_STAGES;
    if (tid == 0) {
        *turn = *mturn = 0;
        ht_init_stage_bars(full0, empty0, HP_STAGES, 128);
    }
    __syncthreads();
    if (wg == 2) {  // the producer warpgroup (384 threads start capped at 168 registers; it keeps 40)
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        if (warp == 8 && lane == 0) {
            asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;\n" ::"l"(wmap) : "memory");
            asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;\n" ::"l"(xmap) : "memory");
            for (int q = 0; q < total; ++q) {
                const int st = q % HP_STAGES, use = q / HP_STAGES;
                if (use > 0) ht_bar_wait(empty0 + 8 * st, (use - 1) & 1);  // its last consumer retired
                ht_issue<HP_VT>(s0 + st * HP_STAGE_BYTES, full0 + 8 * st, wmap, xmap, r0 + q / KC * HP_VT, r1,
                                q % KC * HT_KC);
            }
        }
        __syncwarp();
        __syncthreads();
        return;  // the tail is the consumers'
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    const int g = lane >> 2, t4 = lane & 3, w4 = warp & 3;
    float acc[2][HT_NACC];
#pragma unroll 1
    for (int j = wg; j < tiles; j += 2) {
        if (w4 == 0) {  // the warpgroup's first warp, all its lanes, waits for the main-loop turn
            while (*mturn != j) __nanosleep(32);
        }
        __syncwarp();
        hp_bar_wg(wg);
        // the accumulators anew (no read: the first wgmma of the tile overwrites them), so the last tile's values
        // are dead once staged and the selection has their registers
#pragma unroll
        for (int mb = 0; mb < 2; ++mb)
#pragma unroll
            for (int jj = 0; jj < HT_NACC; ++jj) asm volatile("" : "=f"(acc[mb][jj])::"memory");
#pragma unroll 1
        for (int kc = 0; kc < KC; ++kc) {
            const int q = j * KC + kc, st = q % HP_STAGES;
            ht_bar_wait(full0 + 8 * st, (q / HP_STAGES) & 1);
            if (kc == KC - 1 && (tid & 127) == 0) *mturn = j + 1;  // this thread saw the tile's last stage land
            const unsigned sw = s0 + st * HP_STAGE_BYTES, sx = sw + HP_W_BYTES;
#pragma unroll
            for (int mb = 0; mb < 2; ++mb)
#pragma unroll
                for (int jj = 0; jj < HT_NACC; ++jj) asm volatile("" : "+f"(acc[mb][jj])::"memory");
            asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
            for (int s = 0; s < HT_KC / 16; ++s) {
                const u64 db = ht_desc(sx + 32 * s);
#pragma unroll
                for (int mb = 0; mb < 2; ++mb)
                    ht_wgmma(acc[mb], ht_desc(sw + 64 * mb * 128 + 32 * s), db, (kc | s) != 0);
            }
            asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
            asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
            asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(empty0 + 8 * st) : "memory");
        }
        // this lane's row's shared threshold, read before the waits and the staging hide its latency
        const u64 shared_t = hp_shared_thr(gthr, 32 * w4 + lane, M);
        if (w4 == 0) {  // this tile's selection after tile j - 1's (the other warpgroup's)
            while (*turn != j) __nanosleep(32);
        }
        __syncwarp();
        hp_bar_wg(wg);
        const int tile0 = r0 + j * HP_VT;
        // stage the logits: value (mb, 4 i + e) is head row 64 mb + 16 w4 + g + 8 (e / 2) of the tile, hidden row
        // 8 i + 2 t4 + e % 2 (the m64nN accumulator layout)
#pragma unroll
        for (int mb = 0; mb < 2; ++mb)
#pragma unroll
            for (int jj = 0; jj < HT_NACC; ++jj) {
                const int v = 64 * mb + 16 * w4 + g + 8 * ((jj & 3) >> 1), n = 8 * (jj >> 2) + 2 * t4 + (jj & 1);
                lg[n * HP_LS + v] = acc[mb][jj];
#ifdef HT_DUMP  // tests' build (fast/head.py builds it when given a dump array): the logits to dump as well
                if (dump && tile0 + v < r1 && n < M) dump[(size_t)n * Vr + tile0 + v] = acc[mb][jj];
#endif
            }
        if (j == tiles - 1) break;  // the block's last tile: selected after the loop
        hp_bar_wg(wg);
#ifdef HP_WARP_ROWS
        hp_select(lg, buf, thr, cnt, M, k, tile0, min(HP_VT, elig - tile0), w4, 4, lane
#else
        hp_select_lanes(lg, buf, thr, cnt, M, k, tile0, min(HP_VT, elig - tile0), 32 * w4 + lane, lane, gthr, shared_t
#endif
        );
        hp_bar_wg(wg);  // the warpgroup's selection is done (its writes before the token)
        if ((tid & 127) == 0) {
            __threadfence_block();
            *turn = j + 1;
        }
    }
    __syncthreads();  // the last tile's logits are staged (its owner left the loop after staging them)
    if (tiles > 0) {
        const int tile0 = r0 + (tiles - 1) * HP_VT;
#ifdef HP_WARP_ROWS
        hp_select(lg, buf, thr, cnt, M, k, tile0, min(HP_VT, elig - tile0), warp, 8, lane
        );
#else
        if (warp < 4)  // a lane a hidden row: the first warpgroup's 128 lanes
            hp_select_lanes(lg, buf, thr, cnt, M, k, tile0, min(HP_VT, elig - tile0), 32 * warp + lane, lane, gthr,
                            hp_shared_thr(gthr, 32 * warp + lane, M)
            );
#endif
        asm volatile("bar.sync 3, 256;\n" ::: "memory");
    }
    ht_compact<HP_BS>(buf, thr, cnt, M, k, k, warp, lane);  // every row down to its best k (the consumers' 8 warps)
    asm volatile("bar.sync 3, 256;\n" ::: "memory");
    ht_write_lists<HP_BS>(partial, buf, cnt, M, k, G, b, tid, 256);
#if HP_SHARED_THR && HP_CLEAN && !defined(HP_WARP_ROWS)
    // every consumer thread is past its last use of gthr (its reads used, its atomics issued: the last selection came
    // before the barriers above). Each fences its own atomics, the barrier then lets one thread count the block, and
    // the block that counts last zeroes. (The barriers above and the counting thread's fence alone would order them
    // too, as cooperative groups' grid sync does; the fence in every thread makes it plain and costs nothing measured.)
    __threadfence();
    asm volatile("bar.sync 3, 256;\n" ::: "memory");
    if (tid == 0) {
        unsigned long long* done = reinterpret_cast<unsigned long long*>(gthr + HP_GTHR_ROWS);
        if (atomicAdd(done, 1ull) == (unsigned long long)(G - 1)) {
            __threadfence();
            for (int n = 0; n < M; ++n) gthr[n] = 0ull;
            *done = 0ull;
        }
    }
#endif
}

#else  // not sm_90a: no wgmma; fast/head.py launches this module only when built for sm_90a

extern "C" __global__ void fast_head_topk(const u64*, int, int, int, int, int, u64*, float*, u64*) { __trap(); }
extern "C" __global__ void fast_head_topk_pp(const u64*, int, int, int, int, int, u64*, float*, u64*) { __trap(); }

#endif
