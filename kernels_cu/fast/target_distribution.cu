// Fast mode target distribution (C5): the same numbers as the exact kernel (accept.cu
// row_distribution: penalties and temperature in fp32 with explicit _rn intrinsics, exp and
// sums in double from those fp32 values, probabilities rounded once to fp32), but the top-k
// and top-p thresholds are found by filtering, not by a 64-step bisection over the key
// space (which reads the row 64 times per filter).
//
// Selection by filtering: every token has a distinct 64-bit order key (value descending,
// then lower id, C4). A threshold is found in a few passes over the row:
//   pass 0: a 2048-bin histogram of (zmax - z) * 64 (monotone in the key, spread where the
//           probability mass is), counts for top-k, kept mass for top-p;
//   then 11-bit radix passes over the key, restricted to the chosen bin, until the bucket
//   that crosses the target is taken whole (top-k) or holds one token (top-p); one more
//   pass reads the smallest key of that bucket: the threshold.
// Mass histograms are summed with shared-memory atomics, so the order of the additions (and
// the last bits of a bin's mass) may vary from run to run; the probabilities themselves are
// summed in the exact kernel's fixed tree order.
#include "order_key.cuh"
#include "row_filter.cuh"
#include "philox.cuh"

using dflash::u32;
using dflash::u64;

#define FTD_THREADS 512
#define FTD_WARPS (FTD_THREADS / 32)
#define FTD_BINS 2048
#define FTD_BIN_SCALE 64.0f

namespace {

using rowf::neg_inf;

using okey::key_id;
using okey::order_key;

// The row's block reductions (device/row_filter.cuh, shared with the exact kernel: the sums' fixed tree
// makes the normaliser the same double as there) at this kernel's block size.
__device__ __forceinline__ u64 block_max_u64(u64 v) { return rowf::block_max_u64<FTD_WARPS>(v); }
__device__ __forceinline__ u64 block_min_u64(u64 v) { return rowf::block_min_u64<FTD_WARPS>(v); }
__device__ __forceinline__ int block_sum_int(int v) { return rowf::block_sum_int<FTD_WARPS>(v); }
__device__ __forceinline__ double block_sum_f64(double v) { return rowf::block_sum_f64<FTD_WARPS>(v); }

// Strided scan of v0 <= v < v1 with four independent loads in flight per thread (one load at a
// time left each block latency-bound at a few GB/s). Thread tid visits v0 + tid, v0 + tid + T,
// ... in the same order as a plain strided loop, so per-thread sums keep the exact kernel's
// order. row_scan is the whole row (the single-block kernel); the split path scans its chunk.
template <class F>
__device__ __forceinline__ void chunk_scan(const float* __restrict__ zs, int v0, int v1, F&& f) {
    const int T = FTD_THREADS;
    int v = v0 + threadIdx.x;
    for (; v + 3 * T < v1; v += 4 * T) {
        const float a = zs[v], b = zs[v + T], c = zs[v + 2 * T], d = zs[v + 3 * T];
        f(a, v);
        f(b, v + T);
        f(c, v + 2 * T);
        f(d, v + 3 * T);
    }
    for (; v < v1; v += T) f(zs[v], v);
}

template <class F>
__device__ __forceinline__ void row_scan(const float* __restrict__ zs, int Vr, F&& f) {
    chunk_scan(zs, 0, Vr, f);
}

using rowf::Keep;
using rowf::kept;
using rowf::row_params;
using rowf::RowParams;
using rowf::weight_of;

// Pass-0 bin: monotone non-increasing in the key. Keys above the best finite key (+inf,
// positive NaN) go to bin 0, keys below every finite one (-inf, negative NaN) to the last.
__device__ __forceinline__ int bin0(float z, u64 key, float zmaxf, u64 best_finite) {
    if (key > best_finite) return 0;
    if (!isfinite(z)) return FTD_BINS - 1;
    const float d = __fmul_rn(__fsub_rn(zmaxf, z), FTD_BIN_SCALE);
    return d >= (float)(FTD_BINS - 1) ? FTD_BINS - 1 : (int)d;  // d >= 0 here
}

struct Hist {
    int cnt[FTD_BINS];
    double mass[FTD_BINS];
};

// Scan bins in order idx = 0.. (bin = desc ? nb-1-idx : idx) and find the first whose
// cumulative count (mass mode: (above + cumulative mass) / total) reaches the target.
// Returns the bin (or the last non-empty one if rounding left the target unreached) and sets
// *before to the count / mass in earlier bins. Every thread gets the answer.
__device__ int find_crossing(const Hist& h, int nb, bool desc, bool mass_mode, int need, double above,
                             double total, double top_p, int* before_cnt, double* before_mass) {
    __shared__ int s_cnt[FTD_WARPS];
    __shared__ double s_mass[FTD_WARPS];
    __shared__ int r_bin, r_cnt;
    __shared__ double r_mass;
    const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
    const int per = (nb + FTD_THREADS - 1) / FTD_THREADS;
    const int i0 = tid * per;
    int c = 0;
    double m = 0.0;
    for (int j = 0; j < per; ++j) {
        const int i = i0 + j;
        if (i < nb) {
            const int b = desc ? nb - 1 - i : i;
            c += h.cnt[b];
            m = __dadd_rn(m, h.mass[b]);
        }
    }
    // inclusive scan over the block (warp shuffles, then the warp totals)
    int ci = c;
    double mi = m;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int tc = __shfl_up_sync(0xffffffffu, ci, o);
        const double tm = __shfl_up_sync(0xffffffffu, mi, o);
        if (lane >= o) {
            ci += tc;
            mi = __dadd_rn(mi, tm);
        }
    }
    if (tid == 0) {
        r_bin = -1;
        r_cnt = 0;
        r_mass = 0.0;
    }
    if (lane == 31) {
        s_cnt[wid] = ci;
        s_mass[wid] = mi;
    }
    __syncthreads();
    int wc = 0;
    double wm = 0.0;
    for (int w = 0; w < wid; ++w) {
        wc += s_cnt[w];
        wm = __dadd_rn(wm, s_mass[w]);
    }
    int ex_c = __shfl_up_sync(0xffffffffu, ci, 1);
    double ex_m = __shfl_up_sync(0xffffffffu, mi, 1);
    if (lane == 0) {
        ex_c = 0;
        ex_m = 0.0;
    }
    int cum_c = wc + ex_c;  // exclusive prefix of this thread's bins
    double cum_m = __dadd_rn(wm, ex_m);
    // does the target fall in this thread's bins?
    for (int j = 0; j < per; ++j) {
        const int i = i0 + j;
        if (i >= nb) break;
        const int b = desc ? nb - 1 - i : i;
        const int nc = cum_c + h.cnt[b];
        const double nm = __dadd_rn(cum_m, h.mass[b]);
        const bool hit = mass_mode ? (h.cnt[b] > 0 && __dadd_rn(above, nm) / total >= top_p) : (nc >= need);
        const bool was = mass_mode ? (cum_c > 0 && __dadd_rn(above, cum_m) / total >= top_p) : (cum_c >= need);
        if (hit && !was) {
            r_bin = b;
            r_cnt = cum_c;
            r_mass = cum_m;
        }
        cum_c = nc;
        cum_m = nm;
    }
    __syncthreads();
    if (r_bin < 0) {  // mass mode only, by rounding: take everything (the last non-empty bin)
        if (tid == 0) {
            int cc = 0;
            double mm = 0.0;
            for (int i = 0; i < nb; ++i) {
                const int b = desc ? nb - 1 - i : i;
                if (h.cnt[b] > 0) {
                    r_bin = b;
                    r_cnt = cc;
                    r_mass = mm;
                }
                cc += h.cnt[b];
                mm = __dadd_rn(mm, h.mass[b]);
            }
        }
        __syncthreads();
    }
    const int bin = r_bin;  // -1: nothing to select (mass mode with no kept token)
    *before_cnt = r_cnt;
    *before_mass = r_mass;
    __syncthreads();
    return bin;
}

// Threshold search, pass 0 (the 2048-bin histogram) done; the radix passes over the key inside
// bin b0 until the bucket that crosses the target is taken whole (top-k) or holds one token
// (top-p), then the smallest key of that bucket. need / above: the count still needed / the
// kept mass in earlier bins; taken: the tokens in bin b0. The single-block kernel runs it after
// its own pass 0; the split path's fallback (bin b0 too full to compact) after the split pass 0.
__device__ u64 radix_rest(const float* zs, int Vr, bool mass_mode, int need, double above, int taken, int b0,
                          const Keep& base, double total, double top_p, u64 best_finite, Hist& h) {
    const float zmaxf = dflash::f64_to_f32_rn(base.zmax);  // exact: zmax is an fp32 value
    int bc;
    double bm;
    u64 prefix = 0;
    int hi = 64;
    bool whole = mass_mode ? taken == 1 : taken == need;
    while (!whole && hi > 0) {
        const int w = hi >= 11 ? 11 : hi;
        const int lo = hi - w;
        const int nb = 1 << w;
        for (int i = threadIdx.x; i < nb; i += FTD_THREADS) {
            h.cnt[i] = 0;
            h.mass[i] = 0.0;
        }
        __syncthreads();
        row_scan(zs, Vr, [&](float z, int v) {
            const u64 key = order_key(z, v);
            if (hi < 64 && (key >> hi) != prefix) return;
            double e = 0.0;
            if (mass_mode && !kept(z, v, base, &e)) return;
            if (bin0(z, key, zmaxf, best_finite) != b0) return;
            const int d = (int)((key >> lo) & (u64)(nb - 1));
            atomicAdd(&h.cnt[d], 1);
            if (mass_mode) atomicAdd(&h.mass[d], e);
        });
        __syncthreads();
        const int d = find_crossing(h, nb, true, mass_mode, need, above, total, top_p, &bc, &bm);
        if (d < 0) return base.threshold;  // unreachable: bin b0 holds the crossing token
        above = __dadd_rn(above, bm);
        need -= bc;
        taken = h.cnt[d];
        __syncthreads();
        prefix = (prefix << w) | (u64)d;
        hi = lo;
        whole = mass_mode ? taken == 1 : taken == need;
    }
    if (hi == 0) return prefix;  // every bit known: the key itself
    // the smallest key of the chosen bucket
    u64 mn = ~0ull;
    row_scan(zs, Vr, [&](float z, int v) {
        const u64 key = order_key(z, v);
        if (hi < 64 && (key >> hi) != prefix) return;
        double e;
        if (mass_mode && !kept(z, v, base, &e)) return;
        if (bin0(z, key, zmaxf, best_finite) != b0) return;
        mn = key < mn ? key : mn;
    });
    return block_min_u64(mn);
}

// Pass 0 of the threshold search over columns [v0, v1): the 2048-bin histogram (counts, and in
// mass mode the kept mass) of the bin0 buckets, zeroed first; the whole row in the single-block
// kernel, one chunk in the split path. Ends with the block's histogram complete.
__device__ __forceinline__ void hist0(Hist& h, const float* zs, int v0, int v1, bool mass_mode, const Keep& base,
                                      float zmaxf, u64 best_finite) {
    for (int i = threadIdx.x; i < FTD_BINS; i += FTD_THREADS) {
        h.cnt[i] = 0;
        h.mass[i] = 0.0;
    }
    __syncthreads();
    chunk_scan(zs, v0, v1, [&](float z, int v) {
        const u64 key = order_key(z, v);
        if (mass_mode) {
            double e;
            if (!kept(z, v, base, &e)) return;
            const int b = bin0(z, key, zmaxf, best_finite);
            atomicAdd(&h.cnt[b], 1);
            atomicAdd(&h.mass[b], e);
        } else {
            atomicAdd(&h.cnt[bin0(z, key, zmaxf, best_finite)], 1);
        }
    });
    __syncthreads();
}

// Threshold search. mass_mode = false: the k-th largest key over all Vr keys (need = k).
// mass_mode = true: the key of the token where the kept mass, walked in key order, first
// reaches top_p of total (kept = finite and key >= base.threshold); the exact kernel's
// "largest t with S(t) / total >= top_p" selects the same set.
__device__ u64 filter_threshold(const float* zs, int Vr, bool mass_mode, int need, const Keep& base, double total,
                                double top_p, u64 best_finite, Hist& h) {
    const float zmaxf = dflash::f64_to_f32_rn(base.zmax);  // exact: zmax is an fp32 value
    // pass 0
    hist0(h, zs, 0, Vr, mass_mode, base, zmaxf, best_finite);
    int bc;
    double bm;
    const int b0 = find_crossing(h, FTD_BINS, false, mass_mode, need, 0.0, total, top_p, &bc, &bm);
    if (b0 < 0) return base.threshold;  // as the exact search with lo > hi: t = lo
    const int taken = h.cnt[b0];  // tokens in the current candidate set
    __syncthreads();
    return radix_rest(zs, Vr, mass_mode, need - bc, bm, taken, b0, base, total, top_p, best_finite, h);
}

// The processed logits (C5: repetition, frequency and presence penalties in fp32 with _rn
// intrinsics, then the temperature) of tokens v0 <= v < v1 into zs, thread tid at v0 + tid,
// v0 + tid + T, ... with four tokens' loads in flight; the thread's best order key, best finite
// key and finite count accumulate into best, best_finite, finite. The single-block kernel runs
// it over the whole row, the split path over its chunk.
__device__ __forceinline__ void process_range(const float* __restrict__ lg, const unsigned char* __restrict__ prompt,
                                              const int* __restrict__ counts, float* __restrict__ zs, int v0, int v1,
                                              int vocab_size, const RowParams& prm, u64& best, u64& best_finite,
                                              int& finite) {
    const bool greedy = prm.temperature <= 0.0f;
    auto process = [&](float z, int cnt, unsigned char pm, int v) {
        if (v >= vocab_size) z = neg_inf();
        const bool seen_out = cnt > 0;
        if (prm.rho != 1.0f && (pm != 0 || seen_out))
            z = z > 0.0f ? __fdiv_rn(z, prm.rho) : __fmul_rn(z, prm.rho);
        const float pen = __fadd_rn(__fmul_rn(prm.freq, (float)cnt), __fmul_rn(prm.pres, seen_out ? 1.0f : 0.0f));
        z = __fsub_rn(z, pen);
        if (!greedy) z = __fdiv_rn(z, prm.temperature);
        zs[v] = z;
        const u64 key = order_key(z, v);
        best = key > best ? key : best;
        if (isfinite(z)) {
            best_finite = key > best_finite ? key : best_finite;
            ++finite;
        }
    };
    {
        const int T = FTD_THREADS;
        int v = v0 + threadIdx.x;
        for (; v + 3 * T < v1; v += 4 * T) {
            float z[4];
            int c[4];
            unsigned char m[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                z[j] = lg[v + j * T];
                c[j] = counts[v + j * T];
                m[j] = prompt[v + j * T];
            }
#pragma unroll
            for (int j = 0; j < 4; ++j) process(z[j], c[j], m[j], v + j * T);
        }
        for (; v < v1; v += T) process(lg[v], counts[v], prompt[v], v);
    }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(FTD_THREADS)
fast_target_distribution_rows(const float* __restrict__ logits, const unsigned char* __restrict__ prompt_mask,
                              const int* __restrict__ output_counts, const float* temperature, const float* top_p,
                              const float* min_p, const float* rho, const float* freq, const float* pres,
                              const int* top_k, int N, int Vr, int vocab_size, float* __restrict__ scratch,
                              float* __restrict__ probs) {
    __shared__ Hist h;
    const int n = blockIdx.x;
    if (n >= N) return;
    const size_t off = (size_t)n * Vr;
    const RowParams prm = row_params(n, temperature, top_p, min_p, rho, freq, pres, top_k);
    const float* lg = logits + off;
    const unsigned char* prompt = prompt_mask + off;
    const int* counts = output_counts + off;
    float* zs = scratch + off;
    float* p = probs + off;

    const bool greedy = prm.temperature <= 0.0f;
    u64 best = 0, best_finite = 0;
    int finite = 0;
    process_range(lg, prompt, counts, zs, 0, Vr, vocab_size, prm, best, best_finite, finite);
    best = block_max_u64(best);
    best_finite = block_max_u64(best_finite);
    finite = block_sum_int(finite);
    const int top = key_id(best);
    if (greedy || finite == 0) {
        for (int v = threadIdx.x; v < Vr; v += FTD_THREADS) p[v] = v == top ? 1.0f : 0.0f;
        return;
    }
    Keep k;
    k.threshold = 0;
    k.min_e = 0.0;
    k.zmax = dflash::f32_to_f64(zs[key_id(best_finite)]);
    if (prm.top_k > 0 && prm.top_k < finite)
        k.threshold = filter_threshold(zs, Vr, false, prm.top_k, k, 1.0, 1.0, best_finite, h);
    if (prm.top_p < 1.0f) {
        double s = 0.0;
        row_scan(zs, Vr, [&](float z, int v) {
            double e;
            if (kept(z, v, k, &e)) s = __dadd_rn(s, e);
        });
        const double total = block_sum_f64(s);
        k.threshold = filter_threshold(zs, Vr, true, 0, k, total, dflash::f32_to_f64(prm.top_p), best_finite, h);
    }
    if (prm.min_p > 0.0f) k.min_e = dflash::f32_to_f64(prm.min_p);
    double s = 0.0;
    row_scan(zs, Vr, [&](float z, int v) {
        double e;
        if (kept(z, v, k, &e)) s = __dadd_rn(s, e);
    });
    const double total = block_sum_f64(s);
    row_scan(zs, Vr, [&](float z, int v) {
        double e;
        p[v] = kept(z, v, k, &e) ? dflash::f64_to_f32_rn(e / total) : 0.0f;
    });
}

// ------------------------------------------------------------------------------------------
// Split path (few rows): every row is cut into chunks of consecutive tokens, one block per
// (chunk, row), so that at N = 8 the whole GPU reads the row instead of 8 SMs. The same
// numbers as the single-block kernel above, step by step:
//   ftd_split_process   processed logits zs, the row's best keys and finite count (atomics:
//                       max and integer sums are order-free);
//   per filter (stage 0: top-k, counts; stage 1: top-p, kept mass):
//     ftd_split_hist0    pass 0 per chunk into global partial histograms; the last block of
//                        the row merges them (chunk order fixed) and finds bin b0;
//     ftd_split_compact  bin b0 (at most FTD_CAP tokens: the usual case) compacted; the last
//                        block sorts its keys and walks them (count, or cumulative mass from
//                        the mass above b0): the threshold;
//     ftd_split_fallback bin b0 too full (massive ties): one block per row runs the
//                        single-block kernel's radix passes (radix_rest) from b0;
//   ftd_split_chain     the normalisers (the top-p total, the final total);
//   ftd_split_write     the probabilities.
// Every launch has a fixed shape per (N, Vr); a stage a row does not need exits at once; no
// host synchronisation (CUDA-graph capturable). "Last block" hand-offs: each block writes its
// part, fences, takes a ticket; the block that takes the last ticket of its row goes on.
//
// Normalisers: the exact kernel sums kept weights per thread t of 512 (tokens t, t + 512, ...
// in order, rounded double additions), then warp shuffles and the 16 warp sums in order.
// ftd_split_chain runs those same 512 chains (16 blocks of one warp per row, so a row's chains
// spread over 16 SMs) and the same tree, so both totals are the exact kernel's doubles bit for
// bit, and so is every probability fp32(e / total). Only the mass histograms (which steer the
// top-p threshold, never a probability) are summed in another order: shared-memory atomics
// within a chunk, as in the single-block kernel, then the chunks in a fixed order; a decision
// could differ only if S(t) / total were within a few double ulps of top_p.

#define FTD_CAP 2048       // largest bin b0 the split path compacts (sorted in shared memory)
#define FTD_CHAINS 16      // ftd_split_chain blocks per row (32 chains each: 512)

namespace {

struct RowState {
    u64 best, best_finite;  // atomicMax over the chunks
    int finite;             // atomicAdd over the chunks
    int pad0;
    u64 threshold;          // the filters' result so far (0: keep all)
    double total_p;         // top-p total (kept after top-k)
    double total;           // final normaliser
    int b0[2], need[2], taken[2], mode[2];  // per stage; mode 1: compact, 2: fallback, 0: done
    double above[2];
    unsigned ncand[2];
    unsigned ticket[8];
    double wsum[2][FTD_CHAINS];
};
static_assert(sizeof(RowState) <= 512, "RowState: fast.py allocates 512 bytes per row");

enum { TK_HIST0 = 0, TK_COMPACT = 2, TK_CHAIN = 4 };

__device__ __forceinline__ float key_z(u64 key) {
    const u32 ord = (u32)(key >> 32);
    return __uint_as_float((ord & 0x80000000u) ? (ord & 0x7fffffffu) : ~ord);
}


// Every thread of the block calls it after writing its part; true in the block that took the
// row's last ticket (every thread), which may then read the others' parts (through L2).
__device__ bool last_block(unsigned* ticket, unsigned blocks) {
    __shared__ int s_last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) s_last = atomicAdd(ticket, 1u) == blocks - 1;
    __syncthreads();
    const bool last = s_last != 0;
    if (last) __threadfence();
    return last;
}

__device__ __forceinline__ bool row_live(const RowState* st, const RowParams& prm) {
    return !(prm.temperature <= 0.0f) && st->finite > 0;
}

__device__ __forceinline__ bool stage_active(const RowState* st, const RowParams& prm, int stage) {
    if (!row_live(st, prm)) return false;
    return stage == 0 ? (prm.top_k > 0 && prm.top_k < st->finite) : prm.top_p < 1.0f;
}

// The Keep of a stage: the threshold so far, min-p only for the final normaliser.
__device__ __forceinline__ Keep stage_keep(const RowState* st, const float* zs, bool with_min_p, const RowParams& prm) {
    Keep k;
    k.threshold = st->threshold;
    k.min_e = with_min_p && prm.min_p > 0.0f ? dflash::f32_to_f64(prm.min_p) : 0.0;
    k.zmax = dflash::f32_to_f64(zs[key_id(st->best_finite)]);
    return k;
}

#define FTD_SAMPLING_PARAMS                                                                              \
    const float *temperature, const float *top_p, const float *min_p, const float *rho, const float *freq, \
        const float *pres, const int *top_k

}  // namespace

extern "C" __global__ void __launch_bounds__(FTD_THREADS)
ftd_split_process(const float* __restrict__ logits, const unsigned char* __restrict__ prompt_mask,
                  const int* __restrict__ output_counts, FTD_SAMPLING_PARAMS, int N, int Vr, int vocab_size,
                  int chunk, float* __restrict__ scratch, RowState* __restrict__ states) {
    const int n = blockIdx.y;
    if (n >= N) return;
    const size_t off = (size_t)n * Vr;
    const RowParams prm = row_params(n, temperature, top_p, min_p, rho, freq, pres, top_k);
    const float* lg = logits + off;
    const unsigned char* prompt = prompt_mask + off;
    const int* counts = output_counts + off;
    float* zs = scratch + off;
    const int v0 = blockIdx.x * chunk;
    const int v1 = min(Vr, v0 + chunk);
    u64 best = 0, best_finite = 0;
    int finite = 0;
    process_range(lg, prompt, counts, zs, v0, v1, vocab_size, prm, best, best_finite, finite);
    best = block_max_u64(best);
    best_finite = block_max_u64(best_finite);
    finite = block_sum_int(finite);
    if (threadIdx.x == 0) {
        RowState* st = states + n;
        atomicMax(&st->best, best);
        atomicMax(&st->best_finite, best_finite);
        atomicAdd(&st->finite, finite);
    }
}

// Pass 0 of stage `stage` over one chunk (hchunk tokens), partial histograms to
// pcnt / pmass [N][HC][FTD_BINS]; the row's last block merges them and finds bin b0.
extern "C" __global__ void __launch_bounds__(FTD_THREADS)
ftd_split_hist0(const float* __restrict__ scratch, FTD_SAMPLING_PARAMS, int N, int Vr, int hchunk, int stage,
                RowState* __restrict__ states, int* __restrict__ pcnt, double* __restrict__ pmass) {
    __shared__ Hist h;
    const int n = blockIdx.y;
    if (n >= N) return;
    RowState* st = states + n;
    const RowParams prm = row_params(n, temperature, top_p, min_p, rho, freq, pres, top_k);
    if (!stage_active(st, prm, stage)) return;
    const bool mass_mode = stage == 1;
    const float* zs = scratch + (size_t)n * Vr;
    const Keep base = stage_keep(st, zs, false, prm);
    const u64 best_finite = st->best_finite;
    const float zmaxf = dflash::f64_to_f32_rn(base.zmax);
    const int HC = gridDim.x;
    const int v0 = blockIdx.x * hchunk;
    hist0(h, zs, v0, min(Vr, v0 + hchunk), mass_mode, base, zmaxf, best_finite);  // the single-block pass 0
    const size_t row0 = (size_t)n * HC * FTD_BINS;
    {
        const size_t mine = row0 + (size_t)blockIdx.x * FTD_BINS;
        for (int i = threadIdx.x; i < FTD_BINS; i += FTD_THREADS) {
            pcnt[mine + i] = h.cnt[i];
            if (mass_mode) pmass[mine + i] = h.mass[i];
        }
    }
    if (!last_block(&st->ticket[TK_HIST0 + stage], HC)) return;
    // the row's last block: merge (chunks in order), then the crossing bin
    for (int i = threadIdx.x; i < FTD_BINS; i += FTD_THREADS) {
        int c = 0;
        double m = 0.0;
        for (int j = 0; j < HC; ++j) {
            c += __ldcg(pcnt + row0 + (size_t)j * FTD_BINS + i);
            if (mass_mode) m = __dadd_rn(m, __ldcg(pmass + row0 + (size_t)j * FTD_BINS + i));
        }
        h.cnt[i] = c;
        h.mass[i] = m;
    }
    __syncthreads();
    const double total = mass_mode ? st->total_p : 1.0;
    const double tp = mass_mode ? dflash::f32_to_f64(prm.top_p) : 1.0;
    const int need = mass_mode ? 0 : prm.top_k;
    int bc;
    double bm;
    const int b0 = find_crossing(h, FTD_BINS, false, mass_mode, need, 0.0, total, tp, &bc, &bm);
    if (threadIdx.x == 0) {
        if (b0 < 0) {
            st->mode[stage] = 0;  // as the exact search with lo > hi: the threshold stays
        } else {
            const int taken = h.cnt[b0];
            st->b0[stage] = b0;
            st->need[stage] = need - bc;
            st->above[stage] = bm;
            st->taken[stage] = taken;
            st->mode[stage] = taken <= FTD_CAP ? 1 : 2;
        }
    }
}

// Bin b0 of stage `stage` compacted into cand [N][FTD_CAP]; the row's last block sorts the keys
// (descending) and takes the need-th (top-k) or the first whose cumulative kept mass, added to
// the mass above b0, reaches top_p of the total (top-p).
extern "C" __global__ void __launch_bounds__(FTD_THREADS)
ftd_split_compact(const float* __restrict__ scratch, FTD_SAMPLING_PARAMS, int N, int Vr, int chunk, int stage,
                  RowState* __restrict__ states, u64* __restrict__ cand) {
    __shared__ Hist h;
    __shared__ u64 keys[FTD_CAP];
    const int n = blockIdx.y;
    if (n >= N) return;
    RowState* st = states + n;
    const RowParams prm = row_params(n, temperature, top_p, min_p, rho, freq, pres, top_k);
    if (!stage_active(st, prm, stage) || st->mode[stage] != 1) return;
    const bool mass_mode = stage == 1;
    const float* zs = scratch + (size_t)n * Vr;
    const Keep base = stage_keep(st, zs, false, prm);
    const u64 best_finite = st->best_finite;
    const float zmaxf = dflash::f64_to_f32_rn(base.zmax);
    const int b0 = st->b0[stage];
    u64* mine = cand + (size_t)n * FTD_CAP;
    const int v0 = blockIdx.x * chunk;
    chunk_scan(zs, v0, min(Vr, v0 + chunk), [&](float z, int v) {  // the single-block radix filter
        const u64 key = order_key(z, v);
        double e;
        if (mass_mode && !kept(z, v, base, &e)) return;
        if (bin0(z, key, zmaxf, best_finite) != b0) return;
        const unsigned i = atomicAdd(&st->ncand[stage], 1u);
        if (i < FTD_CAP) mine[i] = key;
    });
    if (!last_block(&st->ticket[TK_COMPACT + stage], gridDim.x)) return;
    const int m = min((int)atomicAdd(&st->ncand[stage], 0u), FTD_CAP);  // == taken
    int P = 1;
    while (P < m) P <<= 1;
    for (int i = threadIdx.x; i < P; i += FTD_THREADS) keys[i] = i < m ? __ldcg(mine + i) : 0ull;  // 0: below all
    __syncthreads();
    for (int k = 2; k <= P; k <<= 1) {  // bitonic sort, descending (keys are distinct)
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = threadIdx.x; i < P; i += FTD_THREADS) {
                const int l = i ^ j;
                if (l > i) {
                    const u64 a = keys[i], b = keys[l];
                    const bool down = (i & k) == 0;
                    if (down ? a < b : a > b) {
                        keys[i] = b;
                        keys[l] = a;
                    }
                }
            }
            __syncthreads();
        }
    }
    u64 thr = base.threshold;
    if (!mass_mode) {
        const int need = st->need[stage];  // 1 <= need <= taken
        if (need >= 1 && need <= m) thr = keys[need - 1];
    } else {
        for (int i = threadIdx.x; i < m; i += FTD_THREADS) {
            h.cnt[i] = 1;
            h.mass[i] = weight_of(key_z(keys[i]), base.zmax);
        }
        __syncthreads();
        int bc;
        double bm;
        const int d = find_crossing(h, m, false, true, 0, st->above[stage], st->total_p,
                                    dflash::f32_to_f64(prm.top_p), &bc, &bm);
        if (d >= 0) thr = keys[d];
    }
    if (threadIdx.x == 0) {
        st->threshold = thr;
        st->mode[stage] = 0;
    }
}

// Bin b0 holds more than FTD_CAP tokens: the single-block radix passes over the row.
extern "C" __global__ void __launch_bounds__(FTD_THREADS)
ftd_split_fallback(const float* __restrict__ scratch, FTD_SAMPLING_PARAMS, int N, int Vr, int stage,
                   RowState* __restrict__ states) {
    __shared__ Hist h;
    const int n = blockIdx.x;
    if (n >= N) return;
    RowState* st = states + n;
    const RowParams prm = row_params(n, temperature, top_p, min_p, rho, freq, pres, top_k);
    if (!stage_active(st, prm, stage) || st->mode[stage] != 2) return;
    const bool mass_mode = stage == 1;
    const float* zs = scratch + (size_t)n * Vr;
    const Keep base = stage_keep(st, zs, false, prm);
    const double total = mass_mode ? st->total_p : 1.0;
    const double tp = mass_mode ? dflash::f32_to_f64(prm.top_p) : 1.0;
    const u64 thr = radix_rest(zs, Vr, mass_mode, st->need[stage], st->above[stage], st->taken[stage],
                               st->b0[stage], base, total, tp, st->best_finite, h);
    __syncthreads();
    if (threadIdx.x == 0) {
        st->threshold = thr;
        st->mode[stage] = 0;
    }
}

// The normaliser of stage `stage` (0: the top-p total, min-p off; 1: the final total): chain
// t = 32 * blockIdx.x + lane sums the kept weights of tokens t, t + 512, ... in order, as thread
// t of the exact kernel's block; the warp and the 16 warp sums as its block_sum_f64.
extern "C" __global__ void __launch_bounds__(32)
ftd_split_chain(const float* __restrict__ scratch, FTD_SAMPLING_PARAMS, int N, int Vr, int stage,
                RowState* __restrict__ states) {
    const int n = blockIdx.y;
    if (n >= N) return;
    RowState* st = states + n;
    const RowParams prm = row_params(n, temperature, top_p, min_p, rho, freq, pres, top_k);
    if (!row_live(st, prm) || (stage == 0 && !(prm.top_p < 1.0f))) return;
    const float* zs = scratch + (size_t)n * Vr;
    const Keep k = stage_keep(st, zs, stage == 1, prm);
    const int lane = threadIdx.x;
    const int T = FTD_THREADS;  // the exact kernel's stride
    double s = 0.0;
    int v = blockIdx.x * 32 + lane;
    constexpr int B = 16;  // loads in flight per chain; the additions stay in token order
    for (; v + (B - 1) * T < Vr; v += B * T) {
        float z[B];
#pragma unroll
        for (int j = 0; j < B; ++j) z[j] = zs[v + j * T];
#pragma unroll
        for (int j = 0; j < B; ++j) {
            double e;
            if (kept(z[j], v + j * T, k, &e)) s = __dadd_rn(s, e);
        }
    }
    for (; v < Vr; v += T) {
        double e;
        if (kept(zs[v], v, k, &e)) s = __dadd_rn(s, e);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s = __dadd_rn(s, __shfl_xor_sync(0xffffffffu, s, o));
    if (lane == 0) st->wsum[stage][blockIdx.x] = s;
    if (!last_block(&st->ticket[TK_CHAIN + stage], gridDim.x)) return;
    if (lane == 0) {
        double r = 0.0;
        for (int w = 0; w < FTD_CHAINS; ++w) r = __dadd_rn(r, __ldcg(&st->wsum[stage][w]));
        if (stage == 0)
            st->total_p = r;
        else
            st->total = r;
    }
}

extern "C" __global__ void __launch_bounds__(FTD_THREADS)
ftd_split_write(const float* __restrict__ scratch, FTD_SAMPLING_PARAMS, int N, int Vr, int chunk,
                const RowState* __restrict__ states, float* __restrict__ probs) {
    const int n = blockIdx.y;
    if (n >= N) return;
    const RowState* st = states + n;
    const RowParams prm = row_params(n, temperature, top_p, min_p, rho, freq, pres, top_k);
    const size_t off = (size_t)n * Vr;
    const float* zs = scratch + off;
    float* p = probs + off;
    const int v0 = blockIdx.x * chunk;
    const int v1 = min(Vr, v0 + chunk);
    if (!row_live(st, prm)) {  // greedy, or no finite logit: the one-hot of the best key
        const int top = key_id(st->best);
        for (int v = v0 + threadIdx.x; v < v1; v += FTD_THREADS) p[v] = v == top ? 1.0f : 0.0f;
        return;
    }
    const Keep k = stage_keep(st, zs, true, prm);
    const double total = st->total;
    chunk_scan(zs, v0, v1, [&](float z, int v) {
        double e;
        p[v] = kept(z, v, k, &e) ? dflash::f64_to_f32_rn(e / total) : 0.0f;
    });
}
