// Fast mode (kernels_cu/fast.py): stable top-k / argmax over fp32 logit rows that one BF16
// GEMM (cuBLAS, FP32 accumulation) produced for every hidden row at once. CONTRACTS C4: value
// descending, ties to the lower head row; rows whose global id (row, or shortlist[row]) is
// outside [0, vocab_size) never compete. Selection is exact on the given fp32 logits; only the
// logits themselves round differently from the exact mode (FP32 tensor-core accumulation
// instead of one rounding from a double sum), which the suite judges like any engine's.
//
// Two launches: fast_topk_partial splits each row over S blocks (each keeps its chunk's
// best k), fast_topk_merge takes the S*k survivors of a row to the final sorted k and applies
// u = c * tanh(m * z / c) to the selected raw logits (in double, as the exact kernel).
#include "philox.cuh"

using dflash::u32;
using dflash::u64;

#define FT_THREADS 256
#define FT_WARPS (FT_THREADS / 32)
#define FT_KMAX 64

namespace {

// Distinct 64-bit key: ordered float in the high word (-0 folded onto +0), ~row in the low
// word, so a larger key is a better candidate. Key 0 is never a real key. A NaN logit ranks
// after every number, -inf included (docs/contracts.md, C4): ordered word 1, below -inf's.
__device__ __forceinline__ u64 fk_key(float z, int row) {
    if (z == 0.0f) z = 0.0f;
    const u32 b = __float_as_uint(z);
    const u32 ord = (z != z) ? 1u : ((b & 0x80000000u) ? ~b : (b | 0x80000000u));
    return ((u64)ord << 32) | (u64)(0xffffffffu - (u32)row);
}

__device__ __forceinline__ int fk_row(u64 key) { return (int)(0xffffffffu - (u32)(key & 0xffffffffull)); }

__device__ __forceinline__ u64 warp_max_u64(u64 v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const u64 t = __shfl_xor_sync(0xffffffffu, v, o);
        v = t > v ? t : v;
    }
    return v;
}

// Insert into a thread's descending list of at most k keys.
__device__ __forceinline__ void list_insert(u64* list, int& cnt, int k, u64 key) {
    if (cnt == k && key <= list[k - 1]) return;
    int pos = cnt < k ? cnt++ : k - 1;
    while (pos > 0 && list[pos - 1] < key) {
        list[pos] = list[pos - 1];
        --pos;
    }
    list[pos] = key;
}

// k rounds of a block max over the threads' sorted lists -> out[0..k) descending (0 = none).
__device__ __forceinline__ void block_merge(const u64* list, int cnt, int k, u64* warp_best, u64* out) {
    const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
    int head = 0;
    for (int r = 0; r < k; ++r) {
        u64 mine = head < cnt ? list[head] : 0ull;
        mine = warp_max_u64(mine);
        if (lane == 0) warp_best[wid] = mine;
        __syncthreads();
        u64 best = 0ull;
#pragma unroll
        for (int w = 0; w < FT_WARPS; ++w) best = warp_best[w] > best ? warp_best[w] : best;
        if (best && head < cnt && list[head] == best) ++head;  // keys are distinct: one owner
        if (tid == 0) out[r] = best;
        __syncthreads();
    }
}

}  // namespace

// Grid (S, M): block (s, m) scans columns [s * chunk, min(Vr, (s + 1) * chunk)) of row m and
// writes its best k keys (descending, 0-padded) to partial[(m * S + s) * k ...].
extern "C" __global__ void __launch_bounds__(FT_THREADS)
fast_topk_partial(const float* __restrict__ logits, const int* __restrict__ shortlist, int M, int Vr,
                  int vocab_size, int k, int chunk, u64* __restrict__ partial) {
    __shared__ u64 warp_best[FT_WARPS];
    __shared__ u64 chosen[FT_KMAX];
    const int s = blockIdx.x, S = gridDim.x, m = blockIdx.y;
    if (m >= M) return;
    const float* z = logits + (size_t)m * Vr;
    const int v0 = s * chunk;
    const int v1 = min(Vr, v0 + chunk);
    u64 list[FT_KMAX];
    int cnt = 0;
    // eight loads in flight per thread before any insert (a load at a time is latency-bound)
    for (int base = v0 + threadIdx.x; base < v1; base += 8 * FT_THREADS) {
        float zv[8];
        int gv[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int v = base + j * FT_THREADS;
            zv[j] = v < v1 ? __ldg(z + v) : 0.0f;
            gv[j] = v < v1 ? (shortlist ? __ldg(shortlist + v) : v) : -1;
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            if (gv[j] < 0 || gv[j] >= vocab_size) continue;
            list_insert(list, cnt, k, fk_key(zv[j], base + j * FT_THREADS));
        }
    }
    block_merge(list, cnt, k, warp_best, chosen);
    if (threadIdx.x < k) partial[((size_t)m * S + s) * k + threadIdx.x] = chosen[threadIdx.x];
}

// k <= 32: each warp keeps its best k in registers, lane i holding rank i (0 = none), and a
// batch of 32 logits only costs a ballot against the warp's k-th key; the rare candidates are
// inserted with a ballot (position) and a shuffle (shift). Grid (S, M). merged != 0: the block
// merges its FT_WARPS warp lists (k rounds of a block max) and writes one list, as
// fast_topk_partial: partial[(m * S + s) * k ...], so the merge kernel reads S * k keys per row,
// not 8x that (measured on the H200: 0.097 -> 0.059 ms at 7 rows, k 16; at 120 rows the extra
// rounds cost more than they save, 0.171 -> 0.191 ms). merged == 0: every warp writes its own
// list, partial[((m * S + s) * FT_WARPS + warp) * k ...].
extern "C" __global__ void __launch_bounds__(FT_THREADS)
fast_topk_partial_warp(const float* __restrict__ logits, const int* __restrict__ shortlist, int M, int Vr,
                       int vocab_size, int k, int chunk, int merged, u64* __restrict__ partial) {
    const int s = blockIdx.x, S = gridDim.x, m = blockIdx.y;
    if (m >= M) return;
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    const float* z = logits + (size_t)m * Vr;
    const int v0 = s * chunk;
    const int v1 = min(Vr, v0 + chunk);
    u64 mine = 0ull, thr = 0ull;
    for (int base = v0 + wid * 32 + lane; base - lane < v1; base += 8 * FT_THREADS) {
        u64 keys[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) {  // eight coalesced loads in flight per lane
            const int v = base + j * FT_THREADS;
            const float zv = v < v1 ? __ldg(z + v) : 0.0f;
            const int gid = v < v1 ? (shortlist ? __ldg(shortlist + v) : v) : -1;
            keys[j] = (gid >= 0 && gid < vocab_size) ? fk_key(zv, v) : 0ull;
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            unsigned cand = __ballot_sync(0xffffffffu, keys[j] > thr);
            while (cand) {  // warp-uniform loop
                const int src = __ffs(cand) - 1;
                cand &= cand - 1;
                const u64 c = __shfl_sync(0xffffffffu, keys[j], src);
                if (c <= thr) continue;
                const int pos = __popc(__ballot_sync(0xffffffffu, lane < k && mine > c));
                const u64 up = __shfl_up_sync(0xffffffffu, mine, 1);
                if (lane > pos && lane < k) mine = up;
                if (lane == pos) mine = c;
                thr = __shfl_sync(0xffffffffu, mine, k - 1);
            }
        }
    }
    if (!merged) {
        if (lane < k) partial[(((size_t)m * S + s) * FT_WARPS + wid) * k + lane] = mine;
        return;
    }
    __shared__ u64 warp_best[FT_WARPS];
    __shared__ u64 chosen[FT_KMAX];
    const u64 one = lane < k ? mine : 0ull;  // each thread a list of at most one key (distinct keys)
    block_merge(&one, one ? 1 : 0, k, warp_best, chosen);
    if (threadIdx.x < k) partial[((size_t)m * S + s) * k + threadIdx.x] = chosen[threadIdx.x];
}

// Grid M: the S * k partial keys of row m -> the final top-k. scores/ids may be null (argmax
// only needs ids). ids are global ids (shortlist remap); -1 and -inf pad missing candidates.
extern "C" __global__ void __launch_bounds__(FT_THREADS)
fast_topk_merge(const u64* __restrict__ partial, const float* __restrict__ logits, const int* __restrict__ shortlist,
                int M, int Vr, int S, int k, float multiplier, float softcap, float* __restrict__ scores,
                int* __restrict__ ids) {
    __shared__ u64 warp_best[FT_WARPS];
    __shared__ u64 chosen[FT_KMAX];
    const int m = blockIdx.x;
    if (m >= M) return;
    const u64* p = partial + (size_t)m * S * k;
    u64 list[FT_KMAX];
    int cnt = 0;
    for (int i = threadIdx.x; i < S * k; i += FT_THREADS) {
        const u64 key = p[i];
        if (key) list_insert(list, cnt, k, key);
    }
    block_merge(list, cnt, k, warp_best, chosen);
    if (threadIdx.x < k) {
        const u64 key = chosen[threadIdx.x];
        float u = __int_as_float(0xff800000);
        int id = -1;
        if (key) {
            const int row = fk_row(key);
            id = shortlist ? shortlist[row] : row;
            double x = dflash::f32_to_f64(logits[(size_t)m * Vr + row]);
            if (multiplier > 0.0f) x *= (double)multiplier;
            if (softcap > 0.0f) x = (double)softcap * tanh(x / (double)softcap);
            u = dflash::f64_to_f32_rn(x);
        }
        if (scores) scores[(size_t)m * k + threadIdx.x] = u;
        ids[(size_t)m * k + threadIdx.x] = id;
    }
}
