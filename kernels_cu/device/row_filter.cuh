// One row of the target distribution (C5) as a block of threads reads it: the block reductions over the
// row, the filters' parameters and the keep test. The exact kernel (exact/accept.cu row_distribution) and
// the fast one (fast/target_distribution.cu) both use these, so their thresholds, normalisers and kept
// sets come from the same code: the sums run in one fixed tree (lanes by xor-shuffle, then the warps in
// order), so the normaliser is the same double in both.
#pragma once
#include "order_key.cuh"

namespace rowf {

using dflash::u64;

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

// Block reductions for WARPS * 32 threads, the result returned to every thread. Max and min are
// order-free (a total order has one extreme); the sums use one fixed tree.
template <int WARPS>
__device__ u64 block_max_u64(u64 v) {
    __shared__ u64 sh[WARPS];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const u64 t = __shfl_xor_sync(0xffffffffu, v, o);
        v = t > v ? t : v;
    }
    __syncthreads();
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    u64 r = sh[0];
    for (int w = 1; w < WARPS; ++w) r = sh[w] > r ? sh[w] : r;
    return r;
}

template <int WARPS>
__device__ u64 block_min_u64(u64 v) {
    __shared__ u64 sh[WARPS];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const u64 t = __shfl_xor_sync(0xffffffffu, v, o);
        v = t < v ? t : v;
    }
    __syncthreads();
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    u64 r = sh[0];
    for (int w = 1; w < WARPS; ++w) r = sh[w] < r ? sh[w] : r;
    return r;
}

template <int WARPS>
__device__ int block_sum_int(int v) {
    __shared__ int sh[WARPS];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    int r = 0;
    for (int w = 0; w < WARPS; ++w) r += sh[w];
    return r;
}

template <int WARPS>
__device__ double block_sum_f64(double v) {
    __shared__ double sh[WARPS];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = __dadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    double r = 0.0;
    for (int w = 0; w < WARPS; ++w) r = __dadd_rn(r, sh[w]);
    return r;
}

struct RowParams {
    float temperature, top_p, min_p, rho, freq, pres;
    int top_k;
};

struct Keep {
    u64 threshold;  // keep keys >= threshold (top-k and top-p)
    double min_e;   // and exp(z - zmax) >= min_e (min-p; 0 when off)
    double zmax;
};

__device__ __forceinline__ double weight_of(float z, double zmax) { return exp(dflash::f32_to_f64(z) - zmax); }

__device__ __forceinline__ bool kept(float z, int v, const Keep& k, double* e) {
    if (!isfinite(z)) return false;  // as the reference's keep = isfinite(z)
    if (okey::order_key(z, v) < k.threshold) return false;
    *e = weight_of(z, k.zmax);
    return !(*e < k.min_e);
}

__device__ __forceinline__ RowParams row_params(int r, const float* temperature, const float* top_p,
                                                const float* min_p, const float* rho, const float* freq,
                                                const float* pres, const int* top_k) {
    RowParams prm;
    prm.temperature = temperature[r];
    prm.top_p = top_p[r];
    prm.min_p = min_p[r];
    prm.rho = rho[r];
    prm.freq = freq[r];
    prm.pres = pres[r];
    prm.top_k = top_k[r];
    return prm;
}

}  // namespace rowf
