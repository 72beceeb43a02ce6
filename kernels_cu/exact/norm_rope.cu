// Row RMSNorm, head RMSNorm + RoPE, SiLU gate, feature gather and format conversions
// (reference/norms.py, reference/feature_capture.py). Arithmetic is fp32; BF16 is
// produced only where the caller asks for a represented point (CONTRACTS C1, C2).
#include "common.cuh"

using dfl::u16;

// plain_rmsnorm over the last axis: w * (x / sqrt(mean(x^2) + eps)), the reference's
// operation order. One block of 256 threads per row; either output may be null.
extern "C" __global__ void __launch_bounds__(256)
rmsnorm_rows(const float* __restrict__ x, const float* __restrict__ w, int rows, int H, float eps,
             float* __restrict__ out_f32, u16* __restrict__ out_bf16) {
    __shared__ float scratch[33];
    const int row = blockIdx.x;
    if (row >= rows) return;
    const float* xr = x + (long long)row * H;
    float ss = 0.f;
    for (int c = threadIdx.x; c < H; c += blockDim.x) ss += xr[c] * xr[c];
    const float denom = sqrtf(dfl::block_sum(ss, scratch) / (float)H + eps);
    for (int c = threadIdx.x; c < H; c += blockDim.x) {
        const float y = w[c] * (xr[c] / denom);
        const long long o = (long long)row * H + c;
        if (out_f32) out_f32[o] = y;
        if (out_bf16) out_bf16[o] = dfl::f32_to_bf16_rn(y);
    }
}

// Head RMSNorm (+ RoPE when rope != 0) of x [rows, heads, D] at pos[row].
// Grid rows*heads, block = D rounded up to full warps, dynamic smem D floats.
extern "C" __global__ void __launch_bounds__(1024)
head_norm_rope_rows(const float* __restrict__ x, const float* __restrict__ w, const double* __restrict__ inv_freq,
                    const long long* __restrict__ pos, int rows, int heads, int D, float eps, int rope,
                    float* __restrict__ out_f32, u16* __restrict__ out_bf16) {
    extern __shared__ float sh[];
    __shared__ float scratch[33];
    const int row = blockIdx.x / heads;
    if (row >= rows) return;
    const int d = threadIdx.x;
    const long long o = (long long)blockIdx.x * D + d;
    const float xv = d < D ? x[o] : 0.f;
    const float y = dfl::head_norm_rope(xv, d, D, w, eps, inv_freq, pos[row], rope != 0, sh, scratch);
    if (d < D) {
        if (out_f32) out_f32[o] = y;
        if (out_bf16) out_bf16[o] = dfl::f32_to_bf16_rn(y);
    }
}

// act = SiLU(gate) * up with SiLU(g) = g / (1 + exp(-g)) (reference/norms.py silu).
extern "C" __global__ void silu_mul(const float* __restrict__ gate, const float* __restrict__ up,
                                    float* __restrict__ out, long long n) {
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < n; t += (long long)gridDim.x * blockDim.x) {
        const float g = gate[t];
        out[t] = g / (1.f + expf(-g)) * up[t];
    }
}

// s_t = concat(block_outputs[ids[j]][t] for j) as fp32 [T, n*Ht]; ids are block ids.
extern "C" __global__ void gather_concat_bf16(const u16* __restrict__ blocks, const int* __restrict__ ids, int n,
                                              long long T, int Ht, float* __restrict__ out) {
    const long long total = T * n * (long long)Ht;
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < total;
         t += (long long)gridDim.x * blockDim.x) {
        const long long row = t / ((long long)n * Ht);
        const int rem = (int)(t - row * n * (long long)Ht);
        const int j = rem / Ht, c = rem - j * Ht;
        out[t] = dfl::bf16_to_f32(blocks[((long long)ids[j] * T + row) * Ht + c]);
    }
}

extern "C" __global__ void bf16_to_f32_kernel(const u16* __restrict__ in, float* __restrict__ out, long long n) {
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < n; t += (long long)gridDim.x * blockDim.x)
        out[t] = dfl::bf16_to_f32(in[t]);
}

extern "C" __global__ void f16_to_f32_kernel(const u16* __restrict__ in, float* __restrict__ out, long long n) {
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < n; t += (long long)gridDim.x * blockDim.x)
        out[t] = dfl::f16_to_f32(in[t]);
}

// The represented BF16 point of an fp32 value (RNE, once).
extern "C" __global__ void f32_to_bf16_kernel(const float* __restrict__ in, u16* __restrict__ out, long long n) {
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < n; t += (long long)gridDim.x * blockDim.x)
        out[t] = dfl::f32_to_bf16_rn(in[t]);
}

extern "C" __global__ void f32_to_f16_kernel(const float* __restrict__ in, u16* __restrict__ out, long long n) {
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < n; t += (long long)gridDim.x * blockDim.x)
        out[t] = dfl::f32_to_f16_rn(in[t]);
}

extern "C" __global__ void context_v_kernel(const float* __restrict__ in, u16* __restrict__ out, long long n) {
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < n; t += (long long)gridDim.x * blockDim.x)
        out[t] = dfl::context_v_bits(in[t]);
}

// Which conversion path this build took (1: cuda_bf16.h / cuda_fp16.h intrinsics, 0: the
// inline-PTX fallback of common.cuh): recorded by CudaBackend.environment().
extern "C" __global__ void fp_conversion_path(int* out) {
#ifdef DFLASH_FP_HEADERS
    out[0] = 1;
#else
    out[0] = 0;
#endif
}
