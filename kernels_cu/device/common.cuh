// Shared device helpers: represented-format rounding (CONTRACTS C1) and reductions.
//
// BF16 and FP16 values cross the host boundary as 16-bit patterns (CuPy has no
// bfloat16 dtype), so every kernel reads and writes `unsigned short` and converts here.
// Rounding is RNE from an fp32 value, done once, through the CUDA intrinsics
// (__float2bfloat16_rn, __float2half_rn). Where NVRTC cannot find cuda_bf16.h /
// cuda_fp16.h (CuPy wheels without a toolkit), the same PTX conversions are issued
// directly: on sm_80+ the intrinsics compile to exactly these cvt.rn instructions,
// and explicit cvt carries no .ftz, so -ftz=true cannot flush FP16 subnormal results.
#pragma once

#if !defined(DFLASH_NO_CUDA_FP_HEADERS) && defined(__has_include)
#if __has_include(<cuda_bf16.h>) && __has_include(<cuda_fp16.h>)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#define DFLASH_FP_HEADERS 1
#endif
#endif

namespace dfl {

typedef unsigned short u16;

// Spelled out rather than INFINITY / max / min: NVRTC without the toolkit headers has no
// <math.h> macros, and the 64-bit overloads of max/min are not guaranteed there.
__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }
__device__ __forceinline__ long long max64(long long a, long long b) { return a > b ? a : b; }
__device__ __forceinline__ long long min64(long long a, long long b) { return a < b ? a : b; }

// Exact: a BF16 value is an fp32 value with the low 16 bits zero.
__device__ __forceinline__ float bf16_to_f32(u16 b) { return __uint_as_float(((unsigned)b) << 16); }

__device__ __forceinline__ u16 f32_to_bf16_rn(float x) {
#ifdef DFLASH_FP_HEADERS
    return __bfloat16_as_ushort(__float2bfloat16_rn(x));
#else
    u16 r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(x));
    return r;
#endif
}

__device__ __forceinline__ u16 f32_to_f16_rn(float x) {
#ifdef DFLASH_FP_HEADERS
    return __half_as_ushort(__float2half_rn(x));
#else
    u16 r;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(x));
    return r;
#endif
}

__device__ __forceinline__ float f16_to_f32(u16 h) {
#ifdef DFLASH_FP_HEADERS
    return __half2float(__ushort_as_half(h));
#else
    float r;
    asm("cvt.f32.f16 %0, %1;" : "=f"(r) : "h"(h));
    return r;
#endif
}

// Stored context V = FP16_RNE(BF16(v_raw)) (C1): two roundings by contract, the
// second exact in FP16's normal range, to a subnormal below it, to inf above 65504.
__device__ __forceinline__ u16 context_v_bits(float v) {
#ifdef DFLASH_FP_HEADERS
    return __half_as_ushort(__float2half_rn(__bfloat162float(__float2bfloat16_rn(v))));
#else
    return f32_to_f16_rn(bf16_to_f32(f32_to_bf16_rn(v)));
#endif
}

// The MLP's activation, BF16(SiLU(g) * u) with SiLU(g) = g / (1 + exp(-g)) (reference/norms.py), as one
// function for fb_silu_mul and fast_gemv's SiLU-mul epilogue, so that both give the same bits.
__device__ __forceinline__ u16 silu_mul_bf16(float g, float u) { return f32_to_bf16_rn(g / (1.f + expf(-g)) * u); }

// Round to BF16 and back: the value a represented point holds, kept in fp32.
__device__ __forceinline__ float round_bf16(float x) { return bf16_to_f32(f32_to_bf16_rn(x)); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Block-wide sum, returned to every thread. blockDim.x must be a multiple of 32 (full
// warps for the shuffles); `scratch` holds 33 floats. The fixed tree order keeps the
// result deterministic run to run.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();  // scratch may still be read by a previous call
    if (lane == 0) scratch[wid] = v;
    __syncthreads();
    if (wid == 0) {
        float t = lane < nw ? scratch[lane] : 0.f;
        t = warp_sum(t);
        if (lane == 0) scratch[32] = t;
    }
    __syncthreads();
    return scratch[32];
}

// Plain head RMSNorm then split-half RoPE of one head (spec: plain_head_rmsnorm, rope_1d),
// computed by one block whose thread d owns element d (threads d >= D pass through).
// Mirrors reference/norms.py: w * (x / sqrt(mean(x^2) + eps)); then for i < D/2,
// out[i] = x[i] cos a - x[i+D/2] sin a, out[i+D/2] = x[i+D/2] cos a + x[i] sin a.
// The angle a = pos * inv_freq[i] is formed in double from the exact integer position
// (fp32 cannot hold positions past 2^24) and reduced by the double sincos, whose
// argument reduction is exact for any double, so positions near 2^31 and 2^32 keep
// their phase. `sh` holds D floats, `scratch` 33.
__device__ __forceinline__ float head_norm_rope(float x, int d, int D, const float* w, float eps,
                                                const double* inv_freq, long long pos, bool rope,
                                                float* sh, float* scratch) {
    const float xv = d < D ? x : 0.f;
    const float ms = block_sum(xv * xv, scratch) / (float)D;
    const float nx = d < D ? w[d] * (xv / sqrtf(ms + eps)) : 0.f;
    if (!rope) return nx;
    if (d < D) sh[d] = nx;
    __syncthreads();
    float out = 0.f;
    if (d < D) {
        const int half = D >> 1;
        const int i = d < half ? d : d - half;
        double s, c;
        sincos((double)pos * inv_freq[i], &s, &c);
        const float cf = (float)c, sf = (float)s;
        out = d < half ? nx * cf - sh[d + half] * sf : nx * cf + sh[d - half] * sf;
    }
    __syncthreads();  // sh is reused by the caller's next head
    return out;
}

// Programmatic dependent launch (kernels_cu/pdl.py). A kernel
// launched with the programmatic-stream-serialization attribute may start before the kernel ahead
// of it in the stream has finished, once every block of that kernel has called pdl_trigger (or
// exited). pdl_wait blocks until that kernel has completed and its writes are visible; nothing a
// preceding kernel may write is read before it. Launched the ordinary way, both are no-ops
// (the stream already ordered the kernels). sm_90+ only; nothing below that.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
// A pointer to data the kernel ahead writes, for use after pdl_wait: the empty asm makes the pointer an
// output of a volatile statement ordered after the wait, so no load through it can be scheduled before the
// wait. Loads through a const __restrict__ kernel parameter may be treated as invariant and hoisted above
// the wait's asm whatever its memory clobber (fb_qkv_post's loads of qkv moved above the wait once the RoPE table
// was built before it; tests/gpu/test_pdl.py catches that).
template <class T>
__device__ __forceinline__ T* after_wait(T* p) {
    asm volatile("" : "+l"(p)::"memory");
    return p;
}
// pdl_wait, then each pointer given (to data the kernels ahead write) replaced by after_wait's: one call at
// each kernel's wait, so that no input of the kernel ahead is read through a pointer left unlaundered.
template <class... P>  // P: pointer types, __restrict__-qualified or not
__device__ __forceinline__ void pdl_wait_for(P&... p) {
    pdl_wait();
    ((p = after_wait(p)), ...);
}
// Ask for the 128-byte line at p in L2 (no register, no wait): for a kernel's constants (weights) before its
// pdl_wait, so that the loads after it hit L2 instead of going to memory.
__device__ __forceinline__ void prefetch_l2(const void* p) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

}  // namespace dfl
