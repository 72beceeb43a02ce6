// Fast mode (kernels_cu/fast/backend.py): stable top-k / argmax over fp32 logit rows that one BF16
// GEMM (cuBLAS, FP32 accumulation) produced for every hidden row at once. CONTRACTS C4: value
// descending, ties to the lower head row; rows whose global id (row, or shortlist[row]) is
// outside [0, vocab_size) never compete. Selection is exact on the given fp32 logits; only the
// logits themselves round differently from the exact mode (FP32 tensor-core accumulation
// instead of one rounding from a double sum), which the suite judges like any engine's.
//
// Two launches: a partial kernel splits each row over S blocks (each keeps its chunk's best k:
// fast_topk_partial_vec for k <= 32 without a shortlist, fast_topk_partial_warp for k <= 32
// otherwise, fast_topk_partial above 32), a merge kernel (fast_topk_merge_warp for k <= 32,
// fast_topk_merge above) takes the survivors of a row to the final sorted k and applies
// u = c * tanh(m * z / c) to the selected raw logits (in double, as the exact kernel). Every
// variant selects the same keys: keys are distinct, so the top k does not depend on the order
// in which a kernel meets them.
#include "topk_keys.cuh"  // fk_key, fk_row, key_float, KeyFilter, warp_sort_desc

#define FT_THREADS 256
#define FT_WARPS (FT_THREADS / 32)
#define FT_KMAX 64
#define FT_BATCH_MIN 3  // more candidates than this in one warp-wide step: offered as a sorted batch

namespace {

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

// One key offered by lane `src` of the warp (warp-uniform call) to the warp's register list (lane i
// holds rank i of at most k <= 32 keys, 0 = none; thr = rank k-1's key).
__device__ __forceinline__ void warp_offer(u64& mine, u64& thr, u64 c, int k, int lane) {
    if (c <= thr) return;
    const int pos = __popc(__ballot_sync(0xffffffffu, lane < k && mine > c));
    const u64 up = __shfl_up_sync(0xffffffffu, mine, 1);
    if (lane > pos && lane < k) mine = up;
    if (lane == pos) mine = c;
    thr = __shfl_sync(0xffffffffu, mine, k - 1);
}

// Many keys offered at once (the first columns of a warp, while the list is not yet selective):
// `key` is this lane's key (0 for none). The batch is sorted, the top 32 of list and batch are
// max(list[i], batch[31 - i]) (a bitonic sequence), and a bitonic merge orders them; the list keeps
// its first k. Same list as offering the keys one by one (the top k of distinct keys).
__device__ __noinline__ void warp_offer_all(u64& mine, u64& thr, u64 key, int k, int lane) {
    const u64 b = warp_sort_desc(key, lane);
    const u64 rev = __shfl_sync(0xffffffffu, b, 31 - lane);
    const u64 cur = lane < k ? mine : 0ull;
    u64 c = cur > rev ? cur : rev;
#pragma unroll
    for (int stride = 16; stride > 0; stride >>= 1) {
        const u64 y = __shfl_xor_sync(0xffffffffu, c, stride);
        c = (lane & stride) == 0 ? (c > y ? c : y) : (c < y ? c : y);
    }
    mine = lane < k ? c : 0ull;
    thr = __shfl_sync(0xffffffffu, mine, k - 1);
}

// Offer this lane's key (0 for none) of a warp-wide step: few candidates one at a time, many as a batch.
__device__ __forceinline__ void warp_offer_step(u64& mine, u64& thr, u64 key, int k, int lane) {
    unsigned cand = __ballot_sync(0xffffffffu, key > thr);
    if (__popc(cand) > FT_BATCH_MIN) {
        warp_offer_all(mine, thr, key > thr ? key : 0ull, k, lane);
        return;
    }
    while (cand) {  // warp-uniform loop
        const int src = __ffs(cand) - 1;
        cand &= cand - 1;
        warp_offer(mine, thr, __shfl_sync(0xffffffffu, key, src), k, lane);
    }
}

// The warp list's output: one list per warp (merged == 0) at partial[(row_list + warp) * k ...], or the
// block's 8 lists merged (k rounds of a block max) into one at partial[row_list * k ...].
__device__ __forceinline__ void warp_lists_out(u64 mine, int k, int merged, int lane, int wid, u64* __restrict__ out_w,
                                               u64* __restrict__ out_b) {
    if (!merged) {
        if (lane < k) out_w[(size_t)wid * k + lane] = mine;
        return;
    }
    __shared__ u64 warp_best[FT_WARPS];
    __shared__ u64 chosen[FT_KMAX];
    const u64 one = lane < k ? mine : 0ull;  // each thread a list of at most one key (distinct keys)
    block_merge(&one, one ? 1 : 0, k, warp_best, chosen);
    if (threadIdx.x < k) out_b[threadIdx.x] = chosen[threadIdx.x];
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
                warp_offer(mine, thr, __shfl_sync(0xffffffffu, keys[j], src), k, lane);
            }
        }
    }
    warp_lists_out(mine, k, merged, lane, wid, partial + ((size_t)m * S + s) * FT_WARPS * k,
                   partial + ((size_t)m * S + s) * k);
}

// A lower bound of each row's k-th best key, for fast_topk_partial_vec's filter (grid M, FT_THREADS; the
// vec kernel's conditions: Vr % 4 == 0, 16-byte aligned rows). Sampled columns, all distinct: up to
// FT_BOUND_SEGS disjoint segments of FT_THREADS x 4 contiguous columns spread over the eligible ones (each
// thread one 16-byte group per segment), or, in a row shorter than one segment, every eligible column
// (strided); each thread's best key, and the k-th best of those FT_THREADS keys. Those k keys are k
// distinct columns of the row, so the row's k-th best key is at least the bound (0, no bound, when fewer
// than k threads sampled), and every key of the row's top k passes a filter `key >= bound`. With 16
// segments the bound is about the row's 0.1 % quantile for k 16 on i.i.d. logits (16 x 1024 samples).
#define FT_BOUND_SEGS 16
extern "C" __global__ void __launch_bounds__(FT_THREADS)
fast_topk_bound(const float* __restrict__ logits, int M, int Vr, int vocab_size, int k, u64* __restrict__ bound) {
    __shared__ u64 warp_best[FT_WARPS];
    __shared__ u64 chosen[FT_KMAX];
    const int m = blockIdx.x;
    if (m >= M) return;
    const float* z = logits + (size_t)m * Vr;
    const int veff = min(Vr, vocab_size);
    const int seg = FT_THREADS * 4;
    const int nseg = min(FT_BOUND_SEGS, veff / seg);
    u64 best = 0ull;
    if (nseg > 0) {  // block-uniform
        const int span = (veff / nseg) & ~3;  // >= seg: segment j is [j span, j span + seg), inside veff
        float4 x[FT_BOUND_SEGS];
#pragma unroll
        for (int j = 0; j < FT_BOUND_SEGS; ++j)  // every load issued before any is used
            x[j] = __ldg(reinterpret_cast<const float4*>(z + (size_t)(j < nseg ? j : 0) * span + threadIdx.x * 4));
#pragma unroll
        for (int j = 0; j < FT_BOUND_SEGS; ++j) {
            const int c = (j < nseg ? j : 0) * span + threadIdx.x * 4;
            const u64 k4 = max(max(fk_key(x[j].x, c), fk_key(x[j].y, c + 1)), max(fk_key(x[j].z, c + 2), fk_key(x[j].w, c + 3)));
            best = j < nseg && k4 > best ? k4 : best;
        }
    } else {
        for (int c = threadIdx.x; c < veff; c += FT_THREADS) {
            const u64 key = fk_key(__ldg(z + c), c);
            best = key > best ? key : best;
        }
    }
    block_merge(&best, best ? 1 : 0, k, warp_best, chosen);
    if (threadIdx.x == 0) bound[m] = chosen[k - 1];
}

// fast_topk_partial_warp for the common case (k <= 32, no shortlist, Vr % 4 == 0, a 16-byte aligned
// logits array, chunk % 4 == 0: kernels_cu/fast/backend.py topk_vec_applies and topk_plan): 16-byte loads, FT_VEC of them in
// flight per lane, and a filter against the warp's k-th key on the float and the column (KeyFilter),
// so a batch of 4 columns that cannot enter the list costs a few compares each and one vote, not a
// 64-bit key and a ballot per column;
// a step with many candidates (a warp's first columns) is offered as one sorted batch (warp_offer_all).
// Without a shortlist the global id is the column, so columns >= vocab_size are cut by the loop bound.
// Same keys, same lists (the top k of distinct keys does not depend on the order they are offered in).
#define FT_VEC 4  // 16-byte loads in flight per lane (the candidate mask below holds 4 FT_VEC bits)
extern "C" __global__ void __launch_bounds__(FT_THREADS)
fast_topk_partial_vec(const float* __restrict__ logits, const u64* __restrict__ bound, int M, int Vr, int vocab_size,
                      int k, int chunk, int merged, u64* __restrict__ partial) {
    const int s = blockIdx.x, S = gridDim.x, m = blockIdx.y;
    if (m >= M) return;
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    const float* z = logits + (size_t)m * Vr;
    const int v0 = s * chunk;
    const int v1 = min(min(Vr, vocab_size), v0 + chunk);
    // keys below the row's bound (fast_topk_bound) cannot rank; the bound itself is a key and may
    const u64 floor_key = bound ? bound[m] : 0ull;
    const u64 lo = floor_key ? floor_key - 1 : 0ull;
    u64 mine = 0ull, thr = lo;
    KeyFilter flt(thr);
    for (int wb = v0 + wid * 128; wb < v1; wb += FT_VEC * FT_THREADS * 4) {  // warp-uniform bound
        // every load issued before any is used: past v1 a lane re-reads the last 16-byte group in the row
        // ([vmax, vmax + 4) lies in the row: Vr % 4 == 0, v1 <= Vr) and `n` below drops what it read
        const int vmax = (v1 - 1) & ~3;
        float4 x[FT_VEC];
#pragma unroll
        for (int u = 0; u < FT_VEC; ++u)
            x[u] = __ldg(reinterpret_cast<const float4*>(z + min(wb + u * FT_THREADS * 4 + lane * 4, vmax)));
        // the filter unrolled, the rare candidate path once (its code is not copied 16 times: the
        // kernel's hot loop stays small enough for the instruction cache)
        unsigned pm = 0u;  // bit 4u + e: column e of group u passes the filter
#pragma unroll
        for (int u = 0; u < FT_VEC; ++u) {
            const int v = wb + u * FT_THREADS * 4 + lane * 4;
            const int n = max(0, min(4, v1 - v));
            pm |= ((unsigned)((0 < n) & flt.passes(x[u].x, v)) << (4 * u)) |
                  ((unsigned)((1 < n) & flt.passes(x[u].y, v + 1)) << (4 * u + 1)) |
                  ((unsigned)((2 < n) & flt.passes(x[u].z, v + 2)) << (4 * u + 2)) |
                  ((unsigned)((3 < n) & flt.passes(x[u].w, v + 3)) << (4 * u + 3));
        }
        unsigned todo = __reduce_or_sync(0xffffffffu, pm);
        while (todo) {  // warp-uniform: the (group, column) steps some lane has a candidate in
            const int i = __ffs(todo) - 1;
            todo &= todo - 1;
            const int u = i >> 2, e = i & 3;
            const float4 xu = u == 0 ? x[0] : u == 1 ? x[1] : u == 2 ? x[2] : x[3];
            const float ze = e == 0 ? xu.x : e == 1 ? xu.y : e == 2 ? xu.z : xu.w;
            const int v = wb + u * FT_THREADS * 4 + lane * 4 + e;
            warp_offer_step(mine, thr, (((pm >> i) & 1u) != 0u) & flt.passes(ze, v) ? fk_key(ze, v) : 0ull, k, lane);
            thr = thr > lo ? thr : lo;  // a list not yet full keeps the row's bound
            flt = KeyFilter(thr);
        }
    }
    warp_lists_out(mine, k, merged, lane, wid, partial + ((size_t)m * S + s) * FT_WARPS * k,
                   partial + ((size_t)m * S + s) * k);
}

// The final top-k of row m from its merged keys (descending, 0 = none): global ids (shortlist remap)
// and u = c * tanh(m * z / c) of the selected raw logits in double, as the exact kernel; scores/ids
// may be null (argmax only needs ids); -1 and -inf pad missing candidates.
__device__ __forceinline__ void topk_write(const u64* chosen, const float* __restrict__ logits,
                                           const int* __restrict__ shortlist, int m, int Vr, int k, float multiplier,
                                           float softcap, float* __restrict__ scores, int* __restrict__ ids) {
    if (threadIdx.x < k) {
        const u64 key = chosen[threadIdx.x];
        float u = __int_as_float(0xff800000);
        int id = -1;
        if (key) {
            const int row = fk_row(key);
            id = shortlist ? shortlist[row] : row;
            // no logits array (fast/head.cu's fused head: the logits never reach memory): the key holds the
            // logit's bits (a -0 logit reads back +0, which fk_key folded; a NaN, the canonical NaN)
            double x = dflash::f32_to_f64(logits ? logits[(size_t)m * Vr + row] : key_float(key));
            if (multiplier > 0.0f) x *= (double)multiplier;
            if (softcap > 0.0f) x = (double)softcap * tanh(x / (double)softcap);
            u = dflash::f64_to_f32_rn(x);
        }
        if (scores) scores[(size_t)m * k + threadIdx.x] = u;
        ids[(size_t)m * k + threadIdx.x] = id;
    }
}

// Grid M: the S * k partial keys of row m -> the final top-k (any k <= FT_KMAX: per-thread lists).
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
    topk_write(chosen, logits, shortlist, m, Vr, k, multiplier, softcap, scores, ids);
}

// fast_topk_merge for k <= 32: each warp keeps a register list of the keys it reads (32 at a time, a
// ballot against its k-th key), then the 8 lists are merged in k rounds (no per-thread local arrays).
extern "C" __global__ void __launch_bounds__(FT_THREADS)
fast_topk_merge_warp(const u64* __restrict__ partial, const float* __restrict__ logits,
                     const int* __restrict__ shortlist, int M, int Vr, int S, int k, float multiplier, float softcap,
                     float* __restrict__ scores, int* __restrict__ ids) {
    __shared__ u64 warp_best[FT_WARPS];
    __shared__ u64 chosen[FT_KMAX];
    const int m = blockIdx.x;
    if (m >= M) return;
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    const u64* p = partial + (size_t)m * S * k;
    const int n = S * k;
    u64 mine = 0ull, thr = 0ull;
    for (int wb = wid * 32; wb < n; wb += 4 * FT_THREADS) {  // warp-uniform bound; 4 loads in flight per lane
        u64 keys[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) keys[j] = p[min(wb + j * FT_THREADS + lane, n - 1)];
#pragma unroll 1
        for (int j = 0; j < 4; ++j) {
            const u64 key = j == 0 ? keys[0] : j == 1 ? keys[1] : j == 2 ? keys[2] : keys[3];
            warp_offer_step(mine, thr, wb + j * FT_THREADS + lane < n ? key : 0ull, k, lane);
        }
    }
    const u64 one = lane < k ? mine : 0ull;
    block_merge(&one, one ? 1 : 0, k, warp_best, chosen);
    topk_write(chosen, logits, shortlist, m, Vr, k, multiplier, softcap, scores, ids);
}
