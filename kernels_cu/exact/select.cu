// Candidate selection: DFlash2 unary top-k (candidate_topk) and the conditional
// selector walk (candidate_selector). CONTRACTS C1 (represented points), C3 (the
// proposal draw), C4 (top-k order, greedy ties). Semantics follow
// reference/candidate_topk.py and reference/candidate_selector.py.
//
// BF16 tensors arrive as 16-bit patterns. A BF16 x BF16 product has at most 16 significant
// bits and BF16 x BF16 x BF16 at most 24, so every product is exact in fp32 and only the
// accumulation rounds: in double for the head logits and g (see bf16_rowdot), in fp32 for
// the selector energies, as the native selector does.
#include "order_key.cuh"
#include "philox.cuh"
#include "select_common.cuh"

using dflash::u32;
using dflash::u64;
typedef unsigned short u16;

#define DFLASH_TOPK_MAX 64

namespace {

using selc::bf16_round_bits_f64;
using selc::bf16_value;
using selc::warp_sum;

using okey::key_id;
using okey::order_key;  // C4's total order (order_key.cuh)

}  // namespace

// out[m, n] = sum_h x[m, h] * w[n, h], one warp per (m, n), accumulated in double (every
// BF16 x BF16 product is exact in it) and rounded once: to fp32 for the head logits
// (out), or straight from double to BF16 for the represented g_i (out_bits).
// Why not an fp32 sum: its bound is 2x the fp32 baseline's worst error in the same case,
// and the baseline sums in another order. On small or cancelling dot products a
// different fp32 order can land 5 ulp off where the baseline happened to land 1 (seen on
// the H200 for H = 16: 5 ulp against a bound of 3), and for g a one-ulp BF16 flip moves
// E_i by ~2^-9 of a term, which T = 0.05 turns into percent-level changes of q_i. Rounded
// once from a near-exact sum, neither can exceed the bound's one-ulp floor.
// Grid: (ceil(N / warps_per_block), M); block: whole warps.
extern "C" __global__ void bf16_rowdot(const u16* __restrict__ x, const u16* __restrict__ w, int M, int N, int H,
                                       float* __restrict__ out, u16* __restrict__ out_bits) {
    const int lane = threadIdx.x & 31;
    const int n = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int m = blockIdx.y;
    if (n >= N || m >= M) return;  // whole warps leave together: n is uniform per warp
    const u16* xr = x + (size_t)m * H;
    const u16* wr = w + (size_t)n * H;
    double acc = 0.0;
    for (int h = lane; h < H; h += 32)
        acc = __fma_rn(dflash::f32_to_f64(bf16_value(xr[h])), dflash::f32_to_f64(bf16_value(wr[h])), acc);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc = __dadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, o));
    if (lane == 0) {
        if (out_bits)
            out_bits[(size_t)m * N + n] = bf16_round_bits_f64(acc);
        else
            out[(size_t)m * N + n] = dflash::f64_to_f32_rn(acc);
    }
}

// Stable top-k of one logit row per block (C4), on the raw logits; rows whose global id
// (the row, or shortlist[row]) is >= vocab_size never compete. Then
// u = c * tanh(m * z / c) (m = 1 when multiplier <= 0; no tanh when softcap <= 0).
// Each thread keeps its own sorted best-k; k rounds of a block max then merge them.
// Rows with fewer than k eligible entries pad with score -inf and id -1.
#define TOPK_THREADS 256
extern "C" __global__ void topk_select(const float* __restrict__ logits, const int* __restrict__ shortlist,
                                       int has_shortlist, int M, int Vr, int vocab_size, int k, float multiplier,
                                       float softcap, float* __restrict__ scores, int* __restrict__ ids) {
    __shared__ u64 warp_best[TOPK_THREADS / 32];
    __shared__ u64 chosen[DFLASH_TOPK_MAX];
    const int m = blockIdx.x;
    if (m >= M) return;
    const float* z = logits + (size_t)m * Vr;
    const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;

    u64 list[DFLASH_TOPK_MAX];
    int cnt = 0;
    for (int v = tid; v < Vr; v += TOPK_THREADS) {
        const int gid = has_shortlist ? shortlist[v] : v;
        if (gid < 0 || gid >= vocab_size) continue;
        const u64 key = order_key(z[v], v);
        if (cnt == k && key <= list[k - 1]) continue;
        int pos = cnt < k ? cnt++ : k - 1;  // the slot freed at the tail, then shift down
        while (pos > 0 && list[pos - 1] < key) {
            list[pos] = list[pos - 1];
            --pos;
        }
        list[pos] = key;
    }

    // Key 0 is no candidate: a real key's low word is ~row with row < 2^31.
    int head = 0;
    for (int r = 0; r < k; ++r) {
        u64 mine = head < cnt ? list[head] : 0ull;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const u64 other = __shfl_xor_sync(0xffffffffu, mine, o);
            mine = other > mine ? other : mine;
        }
        if (lane == 0) warp_best[wid] = mine;
        __syncthreads();
        u64 best = 0ull;
        for (int w = 0; w < TOPK_THREADS / 32; ++w) best = warp_best[w] > best ? warp_best[w] : best;
        if (head < cnt && list[head] == best) ++head;  // keys are distinct: one owner
        if (tid == 0) chosen[r] = best;
        __syncthreads();
    }

    if (tid < k) {
        const u64 key = chosen[tid];
        float u = __int_as_float(0xff800000);
        int id = -1;
        if (key) {
            const int row = key_id(key);
            id = has_shortlist ? shortlist[row] : row;
            // In double: one rounding to fp32 at the end instead of four fp32 roundings and
            // tanhf's own error, which alone could use up the 2x-baseline bound (C2).
            double x = dflash::f32_to_f64(z[row]);
            if (multiplier > 0.0f) x *= (double)multiplier;
            if (softcap > 0.0f) x = (double)softcap * tanh(x / (double)softcap);
            u = dflash::f64_to_f32_rn(x);
        }
        scores[(size_t)m * k + tid] = u;
        ids[(size_t)m * k + tid] = id;
    }
}

// The conditional walk of one request per block (spec: candidate selector):
//   E_i[c] = u_i[c] + sum_r W_pred[pred, r] g_i[r] W_succ[C_i[c], r]   (fp32 accumulation)
//   pred = anchor (i = 0) or the token chosen at i - 1
//   T <= 0: j_i = lowest rank among the maxima, q_i one-hot
//   T > 0:  q_i = softmax(E_i / T) (fp32 out), j_i by the exponential race at
//           (seed, frontier + i, DFLASH2_PROPOSAL, index = rank) over q_i > 0
// One warp per candidate energy; thread 0 makes the k-wide decision. The batch row only
// picks the tensors, never the random key (C3).
#define SEL_THREADS 256
extern "C" __global__ void selector_walk(const u16* __restrict__ g, const float* __restrict__ scores,
                                         const int* __restrict__ ids, const int* __restrict__ anchor,
                                         const u16* __restrict__ w_pred, const u16* __restrict__ w_succ,
                                         const float* __restrict__ temperature, const u64* __restrict__ seed,
                                         const long long* __restrict__ frontier, int B, int K, int k, int R,
                                         int* __restrict__ path, int* __restrict__ tokens, float* __restrict__ q) {
    __shared__ float energy[DFLASH_TOPK_MAX];
    __shared__ int pred_token;
    const int b = blockIdx.x;
    if (b >= B) return;
    const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5, nw = SEL_THREADS / 32;
    const float T = temperature[b];
    const u64 s = seed[b];
    const u64 F = (u64)frontier[b];
    if (tid == 0) pred_token = anchor[b];
    __syncthreads();

    for (int i = 0; i < K; ++i) {
        const size_t row = (size_t)b * K + i;
        const u16* gi = g + row * R;
        const u16* wp = w_pred + (size_t)pred_token * R;
        for (int c = wid; c < k; c += nw) {
            const u16* ws = w_succ + (size_t)ids[row * k + c] * R;
            float acc = 0.0f;
            for (int r = lane; r < R; r += 32)
                acc = __fmaf_rn(__fmul_rn(bf16_value(wp[r]), bf16_value(gi[r])), bf16_value(ws[r]), acc);
            acc = warp_sum(acc);
            if (lane == 0) energy[c] = __fadd_rn(scores[row * k + c], acc);
        }
        __syncthreads();
        if (tid == 0) {
            float* qi = q + row * k;
            int j = 0;
            if (T <= 0.0f) {
                for (int c = 1; c < k; ++c)
                    if (energy[c] > energy[j]) j = c;  // strict: the lowest rank keeps a tie
                for (int c = 0; c < k; ++c) qi[c] = c == j ? 1.0f : 0.0f;
            } else {
                // softmax in double from the fp32 energies, rounded once to the fp32 q (C1)
                double mx = -1.0 / 0.0;
                for (int c = 0; c < k; ++c) mx = fmax(mx, dflash::f32_to_f64(energy[c]) / (double)T);
                double e[DFLASH_TOPK_MAX], sum = 0.0;
                for (int c = 0; c < k; ++c) sum += (e[c] = exp(dflash::f32_to_f64(energy[c]) / (double)T - mx));
                dflash::RaceEntry best = dflash::race_empty();
                for (int c = 0; c < k; ++c) {
                    const float qc = dflash::f64_to_f32_rn(e[c] / sum);
                    qi[c] = qc;
                    dflash::race_offer(best, dflash::f32_to_f64(qc), s, F + (u64)i, dflash::DFLASH2_PROPOSAL, c);
                }
                j = best.index == DFLASH_RACE_NONE ? 0 : best.index;
            }
            path[row] = j;
            tokens[row] = ids[row * k + j];
            pred_token = ids[row * k + j];
        }
        __syncthreads();
    }
}
