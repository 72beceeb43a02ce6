// Target distribution (C5) and speculative acceptance (spec: verification; C3, C6).
// Semantics follow reference/target_distribution.py and reference/speculative_accept.py.
//
// One block per row. Steps 1-3 and the temperature division run in fp32 with explicit
// _rn intrinsics in the reference's operation order, so the processed logits are the
// float32 baseline's own values bit for bit (FMA contraction cannot merge them).
// Everything after that (exp, sums, filters, normalisation) runs in double from those
// fp32 values and rounds once to the fp32 probabilities: the remaining error is the
// baseline's unavoidable part (its processed logits), never more than it.
//
// Filters without a sort: every token has a distinct 64-bit order key (value
// descending, then lower id, C4), so "rank < k" and "shortest top-p prefix" are
// thresholds on the key, found by bisection over the key space with block reductions.
// The top-p mass sum is monotone in the threshold because it is one fixed reduction
// tree over non-negative terms (rounded addition is monotone in each operand).
#include "order_key.cuh"
#include "row_filter.cuh"
#include "philox.cuh"

using dflash::u32;
using dflash::u64;

#define ROW_THREADS 512
#define ROW_WARPS (ROW_THREADS / 32)
#define MAX_DRAFTS 64
#define MAX_QK 64

namespace {

using rowf::neg_inf;

using okey::key_id;
using okey::order_key;

// The row's block reductions (device/row_filter.cuh) at this kernel's block size.
__device__ __forceinline__ u64 block_max_u64(u64 v) { return rowf::block_max_u64<ROW_WARPS>(v); }
__device__ __forceinline__ int block_sum_int(int v) { return rowf::block_sum_int<ROW_WARPS>(v); }
__device__ __forceinline__ double block_sum_f64(double v) { return rowf::block_sum_f64<ROW_WARPS>(v); }

__device__ dflash::RaceEntry block_race(dflash::RaceEntry e) {
    __shared__ double sh_s[ROW_WARPS];
    __shared__ int sh_i[ROW_WARPS];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    e = dflash::warp_race(e);
    __syncthreads();
    if (lane == 0) {
        sh_s[wid] = e.score;
        sh_i[wid] = e.index;
    }
    __syncthreads();
    dflash::RaceEntry r = dflash::race_empty();
    for (int w = 0; w < ROW_WARPS; ++w) {
        dflash::RaceEntry t;
        t.score = sh_s[w];
        t.index = sh_i[w];
        if (dflash::race_better(t, r)) r = t;
    }
    return r;
}

using rowf::Keep;
using rowf::kept;
using rowf::row_params;
using rowf::RowParams;
using rowf::weight_of;

// Largest t in [0, hi] with count(key >= t) >= k: the k-th largest key (keys distinct).
__device__ u64 kth_key(const float* zs, int Vr, int k, u64 hi) {
    u64 lo = 0;
    while (lo < hi) {
        const u64 span = hi - lo;
        const u64 mid = lo + (span >> 1) + (span & 1ull);
        int c = 0;
        for (int v = threadIdx.x; v < Vr; v += ROW_THREADS) c += order_key(zs[v], v) >= mid;
        if (block_sum_int(c) >= k)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

// Largest t in [lo, hi] whose kept mass S(t) (keys >= t) reaches top_p of the total:
// the shortest prefix in C4 order with cumulative probability >= top_p. t = lo keeps
// everything (S = total >= top_p * total), and hi is the best key, so one token stays.
__device__ u64 top_p_key(const float* zs, int Vr, const Keep& base, double total, double top_p, u64 hi) {
    u64 lo = base.threshold;
    while (lo < hi) {
        const u64 span = hi - lo;
        const u64 mid = lo + (span >> 1) + (span & 1ull);
        Keep k = base;
        k.threshold = mid;
        double s = 0.0, e;
        for (int v = threadIdx.x; v < Vr; v += ROW_THREADS)
            if (kept(zs[v], v, k, &e)) s = __dadd_rn(s, e);
        if (block_sum_f64(s) / total >= top_p)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

// p for one logit row (C5). `extra` lists accepted proposals that join the output
// history (count + 1 each) on top of `counts`. zs is [Vr] scratch for the processed
// logits, p the [Vr] output. Returns the C4 argmax id of the processed logits (the
// greedy choice). Every thread of the block must call it; it ends synchronised.
__device__ int row_distribution(const float* __restrict__ logits, const unsigned char* __restrict__ prompt,
                                const int* __restrict__ counts, const int* extra, int n_extra, int Vr,
                                int vocab_size, const RowParams& prm, float* zs, float* p) {
    const bool greedy = prm.temperature <= 0.0f;
    u64 best = 0, best_finite = 0;
    int finite = 0;
    for (int v = threadIdx.x; v < Vr; v += ROW_THREADS) {
        float z = v < vocab_size ? logits[v] : neg_inf();
        int cnt = counts[v];
        for (int j = 0; j < n_extra; ++j) cnt += extra[j] == v;
        const bool seen_out = cnt > 0;
        if (prm.rho != 1.0f && (prompt[v] != 0 || seen_out))
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
    }
    best = block_max_u64(best);  // also makes every zs write visible to the block
    best_finite = block_max_u64(best_finite);
    finite = block_sum_int(finite);
    const int top = key_id(best);
    if (greedy || finite == 0) {
        // finite == 0 has no distribution; the one-hot keeps the output well formed
        for (int v = threadIdx.x; v < Vr; v += ROW_THREADS) p[v] = v == top ? 1.0f : 0.0f;
        __syncthreads();
        return top;
    }
    Keep k;
    k.threshold = 0;
    k.min_e = 0.0;
    k.zmax = dflash::f32_to_f64(zs[key_id(best_finite)]);
    if (prm.top_k > 0 && prm.top_k < finite) k.threshold = kth_key(zs, Vr, prm.top_k, best);
    if (prm.top_p < 1.0f) {
        double s = 0.0, e;
        for (int v = threadIdx.x; v < Vr; v += ROW_THREADS)
            if (kept(zs[v], v, k, &e)) s = __dadd_rn(s, e);
        const double total = block_sum_f64(s);
        k.threshold = top_p_key(zs, Vr, k, total, dflash::f32_to_f64(prm.top_p), best_finite);
    }
    // min-p compares p to min_p * max p; the largest kept weight is exp(0) = 1, so the
    // test is e < min_p whatever the normaliser.
    if (prm.min_p > 0.0f) k.min_e = dflash::f32_to_f64(prm.min_p);
    double s = 0.0, e;
    for (int v = threadIdx.x; v < Vr; v += ROW_THREADS)
        if (kept(zs[v], v, k, &e)) s = __dadd_rn(s, e);
    const double total = block_sum_f64(s);
    for (int v = threadIdx.x; v < Vr; v += ROW_THREADS) p[v] = kept(zs[v], v, k, &e) ? dflash::f64_to_f32_rn(e / total) : 0.0f;
    __syncthreads();
    return top;
}

}  // namespace

extern "C" __global__ void __launch_bounds__(ROW_THREADS)
    target_distribution_rows(const float* __restrict__ logits, const unsigned char* __restrict__ prompt_mask,
                             const int* __restrict__ output_counts, const float* temperature, const float* top_p,
                             const float* min_p, const float* rho, const float* freq, const float* pres,
                             const int* top_k, int N, int Vr, int vocab_size, float* __restrict__ scratch,
                             float* __restrict__ probs) {
    const int n = blockIdx.x;
    if (n >= N) return;
    const size_t off = (size_t)n * Vr;
    const RowParams prm = row_params(n, temperature, top_p, min_p, rho, freq, pres, top_k);
    row_distribution(logits + off, prompt_mask + off, output_counts + off, nullptr, 0, Vr, vocab_size, prm,
                     scratch + off, probs + off);
}

// The acceptance scan of one request per block. For i = 0 .. P: p_i from logit row i with
// d_1 .. d_i added to the output history; test d_(i+1) (greedy: equals the argmax of the
// processed logits; sampled: U * q_i(d) < p_i(d), U at (seed, F+1+i, ACCEPT, 0)); on the
// first rejection the correction (greedy: that argmax; sampled: race over
// max(p_i - q_i, 0) at (F+1+i, CORRECTION, token id), over p_i if that is all zero);
// after P acceptances the bonus from p_P (race at (F+1+P, BONUS, token id)).
// q_i is one-hot at d_(i+1) without has_q, else q_i(v) = sum of q[b,i,c] over q_ids[b,i,c] = v.
extern "C" __global__ void __launch_bounds__(ROW_THREADS)
    speculative_accept_rows(const float* __restrict__ logits, const int* __restrict__ proposals,
                            const int* __restrict__ live, const float* __restrict__ q, const int* __restrict__ q_ids,
                            int has_q, int kq, const long long* __restrict__ frontier, const u64* __restrict__ seed,
                            const unsigned char* __restrict__ prompt_mask, const int* __restrict__ output_counts,
                            const float* temperature, const float* top_p, const float* min_p, const float* rho,
                            const float* freq, const float* pres, const int* top_k, int B, int K, int Vr,
                            int vocab_size, float* __restrict__ zscratch, float* __restrict__ pscratch,
                            int* __restrict__ accepted, int* __restrict__ tokens, int* __restrict__ num_out) {
    __shared__ int history[MAX_DRAFTS];
    __shared__ float q_val[MAX_QK];
    __shared__ int q_tok[MAX_QK];
    __shared__ int decision;
    const int b = blockIdx.x;
    if (b >= B) return;
    const int W = K + 1;
    const int P = live[b];
    const u64 F = (u64)frontier[b];
    const u64 s = seed[b];
    const size_t voff = (size_t)b * Vr;
    float* zs = zscratch + voff;
    float* p = pscratch + voff;
    const RowParams prm = row_params(b, temperature, top_p, min_p, rho, freq, pres, top_k);
    const bool greedy = prm.temperature <= 0.0f;
    for (int j = threadIdx.x; j < W; j += ROW_THREADS) tokens[(size_t)b * W + j] = -1;

    int i = 0;
    int out_token = -1;
    for (;; ++i) {
        const int top = row_distribution(logits + ((size_t)b * W + i) * Vr, prompt_mask + voff,
                                          output_counts + voff, history, i, Vr, vocab_size, prm, zs, p);
        if (i == P) {  // every live proposal accepted: the bonus from row P
            if (greedy) {
                out_token = top;
            } else {
                dflash::RaceEntry e = dflash::race_empty();
                for (int v = threadIdx.x; v < Vr; v += ROW_THREADS)
                    dflash::race_offer(e, dflash::f32_to_f64(p[v]), s, F + 1 + (u64)P, dflash::BONUS, v);
                out_token = block_race(e).index;
            }
            break;
        }
        const int d = proposals[(size_t)b * K + i];
        if (has_q) {
            for (int c = threadIdx.x; c < kq; c += ROW_THREADS) {
                q_val[c] = q[((size_t)b * K + i) * kq + c];
                q_tok[c] = q_ids[((size_t)b * K + i) * kq + c];
            }
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            int ok;
            if (greedy) {
                ok = d == top;
            } else {
                double qd = 0.0;
                if (has_q) {
                    for (int c = 0; c < kq; ++c) qd += q_tok[c] == d ? dflash::f32_to_f64(q_val[c]) : 0.0;
                } else {
                    qd = 1.0;
                }
                const double pd = (d >= 0 && d < Vr) ? dflash::f32_to_f64(p[d]) : 0.0;
                // U (24 bits) times an fp32 q is exact in double: the test is the
                // reference's comparison on these p and q values.
                const double u = dflash::f32_to_f64(dflash::keyed_uniform(s, F + 1 + (u64)i, dflash::ACCEPT, 0));
                ok = pd - u * qd > 0.0;
            }
            decision = ok;
            if (ok) history[i] = d;
        }
        __syncthreads();
        if (decision) continue;
        if (greedy) {
            out_token = top;
        } else {
            dflash::RaceEntry e = dflash::race_empty();
            for (int v = threadIdx.x; v < Vr; v += ROW_THREADS) {
                double qv = 0.0;
                if (has_q) {
                    for (int c = 0; c < kq; ++c) qv += q_tok[c] == v ? dflash::f32_to_f64(q_val[c]) : 0.0;
                } else {
                    qv = v == d ? 1.0 : 0.0;
                }
                // both operands are fp32 values: the double difference is their exact residual
                dflash::race_offer(e, fmax(dflash::f32_to_f64(p[v]) - qv, 0.0), s, F + 1 + (u64)i, dflash::CORRECTION, v);
            }
            e = block_race(e);
            if (e.index == DFLASH_RACE_NONE) {  // zero residual mass: draw from p_i itself (C6)
                e = dflash::race_empty();
                for (int v = threadIdx.x; v < Vr; v += ROW_THREADS)
                    dflash::race_offer(e, dflash::f32_to_f64(p[v]), s, F + 1 + (u64)i, dflash::CORRECTION, v);
                e = block_race(e);
            }
            out_token = e.index;
        }
        break;
    }
    if (threadIdx.x == 0) {
        for (int j = 0; j < i; ++j) tokens[(size_t)b * W + j] = history[j];
        tokens[(size_t)b * W + i] = out_token;
        accepted[b] = i;
        num_out[b] = i + 1;
    }
}

// Probes for the RNG tests: the raw Philox words and the keyed uniforms, element-wise.
extern "C" __global__ void philox_words(const u32* __restrict__ ctr, const u32* __restrict__ key, int n,
                                        u32* __restrict__ out) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n) return;
    dflash::Words c;
    c.x0 = ctr[4 * t];
    c.x1 = ctr[4 * t + 1];
    c.x2 = ctr[4 * t + 2];
    c.x3 = ctr[4 * t + 3];
    const dflash::Words w = dflash::philox4x32_10(c, key[2 * t], key[2 * t + 1]);
    out[4 * t] = w.x0;
    out[4 * t + 1] = w.x1;
    out[4 * t + 2] = w.x2;
    out[4 * t + 3] = w.x3;
}

extern "C" __global__ void philox_uniforms(const u64* __restrict__ seed, const u64* __restrict__ position,
                                           const u32* __restrict__ purpose, const u32* __restrict__ index, int n,
                                           float* __restrict__ out) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n) return;
    out[t] = dflash::keyed_uniform(seed[t], position[t], purpose[t], index[t]);
}

// The exponential race over one fp32 weight row per block, as the correction and bonus
// draws run it: winner index (-1 with no positive weight).
extern "C" __global__ void __launch_bounds__(ROW_THREADS)
    race_rows(const float* __restrict__ weights, int rows, int V, const u64* __restrict__ seed,
              const long long* __restrict__ position, const u32* __restrict__ purpose, int* __restrict__ winner) {
    const int r = blockIdx.x;
    if (r >= rows) return;
    dflash::RaceEntry e = dflash::race_empty();
    for (int v = threadIdx.x; v < V; v += ROW_THREADS)
        dflash::race_offer(e, dflash::f32_to_f64(weights[(size_t)r * V + v]), seed[r], (u64)position[r], purpose[r],
                           v);
    e = block_race(e);
    if (threadIdx.x == 0) winner[r] = e.index == DFLASH_RACE_NONE ? -1 : e.index;
}

// ---------------------------------------------------------------------------------------
// tree_verify (reference/tree_verify.py): build the DFlash2 tree from the selector lattice
// and verify it against a bigram target. One block per request. The tree is a short
// sequential computation (K <= 15 steps, at most 64 nodes of k <= 16 children each) that
// thread 0 runs in double from the fp32 energies; verification runs block-wide over the
// vocabulary, with p and the residual r kept in double as the reference keeps them in
// float64, so its accept tests and races see the same numbers up to the last bits of exp.

#define TREE_MAX_NODES 64
#define TREE_MAX_K 16
#define TREE_MAX_CAND ((TREE_MAX_NODES + 1) * TREE_MAX_K)

namespace {

// q = FP32(softmax(e / d)) over the k candidates of one predecessor row (the selector's q).
__host__ __device__ void tree_q_row(const float* e, int k, double d, float* q) {
    double x[TREE_MAX_K], mx = -1.0 / 0.0, s = 0.0;
    for (int c = 0; c < k; ++c) {
        x[c] = dflash::f32_to_f64(e[c]) / d;
        mx = fmax(mx, x[c]);
    }
    for (int c = 0; c < k; ++c) s += (x[c] = exp(x[c] - mx));
    for (int c = 0; c < k; ++c) q[c] = dflash::f64_to_f32_rn(x[c] / s);
}

// Best-first order: higher path score, then lower depth, then lower parent node (the root,
// -1, first), then lower rank. The last three are packed so that a smaller key is better.
DFLASH_HD int tree_cand_key(int depth, int parent, int rank) {
    return (depth << 16) | ((parent + 1) << 8) | rank;
}

DFLASH_HD bool tree_cand_better(double s, int key, double bs, int bkey) {
    if (bkey < 0) return true;
    if (s != bs) return s > bs;
    return key < bkey;
}

// The tree of one request (reference build_tree): nodes (depth, rank, parent, main chain)
// and their path scores; returns the node count (<= N). Sequential and small, so one
// thread runs it; __host__ too, so a host build can check it without a GPU. cand_* hold
// the best-first pool, (N + 1) * k entries at most.
__host__ __device__ int tree_build(const float* eb, int K, int k, int N, float T, u64 s, u64 F, int* nd_depth,
                                   int* nd_rank, int* nd_par, int* nd_main, double* nd_score, double* cand_score,
                                   int* cand_key) {
    const bool greedy = T <= 0.0f;
    const double t = dflash::f32_to_f64(T);
    const double rho = T > 0.0f ? t : 1.0;  // greedy trees rank by the E-softmax at 1
    float q[TREE_MAX_K];
    int chain[64];
    int prev = 0;
    for (int i = 0; i < K; ++i) {  // the selector's walk: row 0 (the anchor row) first
        const float* row = eb + ((size_t)i * k + prev) * k;
        int j = 0;
        if (greedy) {
            for (int c = 1; c < k; ++c)
                if (row[c] > row[j]) j = c;
        } else {
            tree_q_row(row, k, t, q);
            dflash::RaceEntry best = dflash::race_empty();
            for (int c = 0; c < k; ++c)
                dflash::race_offer(best, dflash::f32_to_f64(q[c]), s, F + (u64)i, dflash::DFLASH2_PROPOSAL, c);
            j = best.index == DFLASH_RACE_NONE ? 0 : best.index;
        }
        chain[i] = j;
        prev = j;
    }
    int n = 0;
    for (int i = 0; i < K && n < N; ++i, ++n) {  // the main chain comes first
        const int pr = i ? chain[i - 1] : 0;
        tree_q_row(eb + ((size_t)i * k + pr) * k, k, rho, q);
        nd_depth[n] = i;
        nd_rank[n] = chain[i];
        nd_par[n] = i - 1;
        nd_main[n] = 1;
        nd_score[n] = (i ? nd_score[i - 1] : 0.0) + log(dflash::f32_to_f64(q[chain[i]]));
    }
    int nc = 0;
    if (N > K) {
        // children of the root (-1) and of every node, each (parent, rank) once
        for (int p = -1; p < N; ++p) {
            if (p >= n) break;
            const int depth = p >= 0 ? nd_depth[p] + 1 : 0;
            if (depth >= K) continue;
            tree_q_row(eb + ((size_t)depth * k + (p >= 0 ? nd_rank[p] : 0)) * k, k, rho, q);
            const double base = p >= 0 ? nd_score[p] : 0.0;
            for (int c = 0; c < k; ++c) {
                bool taken = false;
                for (int m = 0; m < n; ++m) taken |= nd_par[m] == p && nd_rank[m] == c;
                if (taken) continue;
                cand_score[nc] = base + log(dflash::f32_to_f64(q[c]));
                cand_key[nc++] = tree_cand_key(depth, p, c);
            }
        }
        while (n < N) {
            int best = -1;
            for (int x = 0; x < nc; ++x)
                if (cand_key[x] >= 0 &&
                    (best < 0 || tree_cand_better(cand_score[x], cand_key[x], cand_score[best], cand_key[best])))
                    best = x;
            if (best < 0) break;  // no child left: the rest is padding
            const int key = cand_key[best];
            const int depth = key >> 16, p = ((key >> 8) & 0xff) - 1, c = key & 0xff;
            cand_key[best] = -1;
            nd_depth[n] = depth;
            nd_rank[n] = c;
            nd_par[n] = p;
            nd_main[n] = 0;
            nd_score[n] = cand_score[best];
            if (depth + 1 < K) {
                tree_q_row(eb + ((size_t)(depth + 1) * k + c) * k, k, rho, q);
                for (int cc = 0; cc < k; ++cc) {
                    cand_score[nc] = nd_score[n] + log(dflash::f32_to_f64(q[cc]));
                    cand_key[nc++] = tree_cand_key(depth + 1, n, cc);
                }
            }
            ++n;
        }
    }
    return n;
}

}  // namespace

extern "C" __global__ void __launch_bounds__(ROW_THREADS)
    tree_verify_rows(const int* __restrict__ anchor, const int* __restrict__ ids, const float* __restrict__ energies,
                     const float* __restrict__ temperature, const u64* __restrict__ seed,
                     const long long* __restrict__ frontier, const float* __restrict__ bigram, int B, int K, int k,
                     int V, int N, double* __restrict__ pscratch, double* __restrict__ rscratch,
                     int* __restrict__ parent_out, int* __restrict__ node_tokens, unsigned char* __restrict__ tree_mask,
                     int* __restrict__ tokens, int* __restrict__ accepted, int* __restrict__ num_out) {
    __shared__ int nd_depth[TREE_MAX_NODES], nd_rank[TREE_MAX_NODES], nd_par[TREE_MAX_NODES], nd_main[TREE_MAX_NODES];
    __shared__ double nd_score[TREE_MAX_NODES];
    __shared__ double cand_score[TREE_MAX_CAND];
    __shared__ int cand_key[TREE_MAX_CAND];
    __shared__ int n_nodes;
    __shared__ int kids[TREE_MAX_NODES];
    __shared__ int n_kids;
    __shared__ float g_val[TREE_MAX_K];
    __shared__ int g_tok[TREE_MAX_K];
    __shared__ int g_n, g_point, decision;

    const int b = blockIdx.x;
    if (b >= B) return;
    const float T = temperature[b];
    const bool greedy = T <= 0.0f;
    const u64 s = seed[b];
    const u64 F = (u64)frontier[b];
    const int* idb = ids + (size_t)b * K * k;
    const float* eb = energies + (size_t)b * K * k * k;
    const int W = K + 1;

    // --- the tree (thread 0) ---
    if (threadIdx.x == 0)
        n_nodes = tree_build(eb, K, k, N, T, s, F, nd_depth, nd_rank, nd_par, nd_main, nd_score, cand_score, cand_key);
    __syncthreads();
    const int nn = n_nodes;
    for (int x = threadIdx.x; x < N; x += ROW_THREADS) {
        const bool live = x < nn;
        parent_out[(size_t)b * N + x] = live ? nd_par[x] : -1;
        node_tokens[(size_t)b * N + x] = live ? idb[nd_depth[x] * k + nd_rank[x]] : -1;
        if (live) {  // itself and its ancestors; padding rows stay zero
            unsigned char* mrow = tree_mask + ((size_t)b * N + x) * N;
            for (int a = x; a >= 0; a = nd_par[a]) mrow[a] = 1;
        }
    }
    for (int j = threadIdx.x; j < W; j += ROW_THREADS) tokens[(size_t)b * W + j] = -1;

    // --- verification, from the root down ---
    double* p = pscratch + (size_t)b * V;
    double* r = rscratch + (size_t)b * V;
    int node = -1, prev_tok = anchor[b], depth = 0, out_token = -1;
    for (;;) {
        __syncthreads();
        if (threadIdx.x == 0) {
            int c = 0;
            for (int x = 0; x < nn; ++x)
                if (nd_par[x] == node) kids[c++] = x;
            n_kids = c;
        }
        __syncthreads();
        const float* z = bigram + (size_t)prev_tok * V;
        const u64 pos = F + 1 + (u64)depth;
        if (greedy) {
            u64 best = 0;
            for (int v = threadIdx.x; v < V; v += ROW_THREADS) {
                const u64 key = order_key(z[v], v);
                best = key > best ? key : best;
            }
            const int top = key_id(block_max_u64(best));
            int hit = -1;
            for (int j = 0; j < n_kids && hit < 0; ++j)
                if (idb[nd_depth[kids[j]] * k + nd_rank[kids[j]]] == top) hit = kids[j];
            if (hit < 0) {
                out_token = top;
                break;
            }
            if (threadIdx.x == 0) tokens[(size_t)b * W + depth] = top;
            node = hit;
            prev_tok = top;
            ++depth;
            continue;
        }
        // p = softmax(z / T) in double; r starts as p
        u64 best = 0;
        for (int v = threadIdx.x; v < V; v += ROW_THREADS) {
            const u64 key = order_key(z[v], v);
            best = key > best ? key : best;
        }
        const double t = dflash::f32_to_f64(T);
        const double zmax = dflash::f32_to_f64(z[key_id(block_max_u64(best))]) / t;
        double part = 0.0;
        for (int v = threadIdx.x; v < V; v += ROW_THREADS) {
            const double e = exp(dflash::f32_to_f64(z[v]) / t - zmax);
            p[v] = e;
            part = __dadd_rn(part, e);
        }
        const double total = block_sum_f64(part);
        for (int v = threadIdx.x; v < V; v += ROW_THREADS) r[v] = p[v] = p[v] / total;
        int chosen = -1, chosen_tok = -1;
        for (int j = 0; j < n_kids; ++j) {
            const int n = kids[j];
            const int d = nd_depth[n];
            const int c = idb[d * k + nd_rank[n]];
            __syncthreads();  // r, g_* and decision of the previous sibling are settled
            if (threadIdx.x == 0) {
                // the draft law of this child: the retained q for the main chain's own child
                // of a main-chain node (the walk drew it from q); a point mass otherwise
                if (nd_main[n]) {
                    const int pr = nd_par[n] >= 0 ? nd_rank[nd_par[n]] : 0;
                    tree_q_row(eb + ((size_t)d * k + pr) * k, k, t, g_val);
                    for (int x = 0; x < k; ++x) g_tok[x] = idb[d * k + x];
                    g_n = k;
                    g_point = -1;
                } else {
                    g_n = 0;
                    g_point = c;
                }
                double gc = g_point == c ? 1.0 : 0.0;
                for (int x = 0; x < g_n; ++x) gc += g_tok[x] == c ? dflash::f32_to_f64(g_val[x]) : 0.0;
                const double u = dflash::f32_to_f64(dflash::keyed_uniform(s, pos, dflash::ACCEPT, (u32)j));
                decision = r[c] - u * gc > 0.0;
            }
            __syncthreads();
            if (decision) {
                chosen = n;
                chosen_tok = c;
                break;
            }
            // r = max(r - g, 0) renormalised, unless that has no mass (then r stays)
            double rest = 0.0;
            for (int v = threadIdx.x; v < V; v += ROW_THREADS) {
                double gv = g_point == v ? 1.0 : 0.0;
                for (int x = 0; x < g_n; ++x) gv += g_tok[x] == v ? dflash::f32_to_f64(g_val[x]) : 0.0;
                rest = __dadd_rn(rest, fmax(r[v] - gv, 0.0));
            }
            const double mass = block_sum_f64(rest);
            if (mass > 0.0) {
                for (int v = threadIdx.x; v < V; v += ROW_THREADS) {
                    double gv = g_point == v ? 1.0 : 0.0;
                    for (int x = 0; x < g_n; ++x) gv += g_tok[x] == v ? dflash::f32_to_f64(g_val[x]) : 0.0;
                    r[v] = fmax(r[v] - gv, 0.0) / mass;
                }
            }
        }
        if (chosen >= 0) {
            if (threadIdx.x == 0) tokens[(size_t)b * W + depth] = chosen_tok;
            node = chosen;
            prev_tok = chosen_tok;
            ++depth;
            continue;
        }
        // every child rejected: the correction from r; a leaf: the bonus from p
        const double* w = n_kids ? r : p;
        const u32 purpose = n_kids ? dflash::CORRECTION : dflash::BONUS;
        __syncthreads();
        dflash::RaceEntry e = dflash::race_empty();
        for (int v = threadIdx.x; v < V; v += ROW_THREADS) dflash::race_offer(e, w[v], s, pos, purpose, v);
        out_token = block_race(e).index;
        break;
    }
    if (threadIdx.x == 0) {
        tokens[(size_t)b * W + depth] = out_token;
        accepted[b] = depth;
        num_out[b] = depth + 1;
    }
}
