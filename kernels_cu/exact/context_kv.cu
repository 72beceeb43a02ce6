// Context K/V materialization (spec: "Each draft layer independently projects this common
// c_t into its context K/V"; CONTRACTS C1 representation, C7 storage).
//
// After the fp32 projections (cuBLAS), one block per (chunk row, KV head) does, fused:
// head RMSNorm of the unrounded raw K (no BF16 cast before the norm, C1), RoPE at the
// row's absolute position, K -> BF16, V -> FP16_RNE(BF16(v)), and the write into the
// ring (slot p mod C) or the paged pool (page_table[p / page], offset p % page).
#include "common.cuh"

using dfl::u16;

extern "C" __global__ void __launch_bounds__(1024)
context_kv_write(const float* __restrict__ k_raw, const float* __restrict__ v_raw, const float* __restrict__ k_norm,
                 const double* __restrict__ inv_freq, float eps, long long start, int first_row, int Hk, int D,
                 int paged, long long capacity, int page_size, const int* __restrict__ page_table,
                 u16* __restrict__ k_cache, u16* __restrict__ v_cache) {
    extern __shared__ float sh[];
    __shared__ float scratch[33];
    const int t = first_row + blockIdx.x / Hk;
    const int h = blockIdx.x % Hk;
    const int d = threadIdx.x;
    const long long p = start + t;  // exact 64-bit position
    const long long src = ((long long)t * Hk + h) * D + d;
    const float kv = d < D ? k_raw[src] : 0.f;
    const float k = dfl::head_norm_rope(kv, d, D, k_norm, eps, inv_freq, p, true, sh, scratch);
    if (d >= D) return;
    long long dst;
    if (paged) {
        const long long page = (long long)page_table[p / page_size];
        dst = ((page * page_size + p % page_size) * Hk + h) * D + d;
    } else {
        dst = ((p % capacity) * Hk + h) * D + d;
    }
    k_cache[dst] = dfl::f32_to_bf16_rn(k);
    v_cache[dst] = dfl::context_v_bits(v_raw[src]);
}
