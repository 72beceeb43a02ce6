// Fast mode context K/V materialization (spec: context K/V; CONTRACTS C1, C7). One BF16 GEMM
// (cuBLAS, FP32 accumulation) projects the chunk through [W_k; W_v] at once into kv [rows,
// 2 * Hk * D] fp32; this kernel then does, fused, per (row, KV head): head RMSNorm of the
// unrounded raw K, RoPE at the row's exact 64-bit position (angle in double, as the exact
// mode, so positions past 2^24 keep their phase), K -> BF16, V -> FP16_RNE(BF16(v)), and the
// write into the caller's ring (slot p mod C) or paged pool, in place.
#include "common.cuh"

using dfl::u16;

extern "C" __global__ void __launch_bounds__(1024)
fast_context_kv_write(const float* __restrict__ kv, int ld, const float* __restrict__ k_norm,
                      const double* __restrict__ inv_freq, float eps, long long start, int Hk, int D, int paged,
                      long long capacity, int page_size, const int* __restrict__ page_table,
                      u16* __restrict__ k_cache, u16* __restrict__ v_cache) {
    extern __shared__ float sh[];
    __shared__ float scratch[33];
    const int t = blockIdx.x / Hk;
    const int h = blockIdx.x % Hk;
    const int d = threadIdx.x;
    const long long p = start + t;
    const float* row = kv + (long long)t * ld;
    const float kraw = d < D ? row[h * D + d] : 0.f;
    const float vraw = d < D ? row[(Hk + h) * D + d] : 0.f;
    const float k = dfl::head_norm_rope(kraw, d, D, k_norm, eps, inv_freq, p, true, sh, scratch);
    if (d >= D) return;
    long long dst;
    if (paged) {
        const long long page = (long long)page_table[p / page_size];
        dst = ((page * page_size + p % page_size) * Hk + h) * D + d;
    } else {
        dst = ((p % capacity) * Hk + h) * D + d;
    }
    k_cache[dst] = dfl::f32_to_bf16_rn(k);
    v_cache[dst] = dfl::context_v_bits(vraw);
}
