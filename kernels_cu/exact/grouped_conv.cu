// DFlash2 dynamic grouped convolution (reference/grouped_conv.py; spec "DFlash2 adds a
// dynamic grouped convolution"). delta [rows, 4G] is the fp32 GEMM W_delta X laid out as
// [2 sides, 2 taps, G]; base [2 sides, 2 taps, H]; groups of 16 channels share a delta.
//
//   Conv_s(X)[i, c] = (base[s,0,c] + delta[i,s,0,c/16]) X[i, c]
//                   + 1{i >= 1} (base[s,1,c] + delta[i,s,1,c/16]) X[i-1, c]
//
// The coefficient is formed first and multiplied once: base*x + delta*x rounded
// separately is a known bug (PITFALLS). Column 0 has no preceding tap, and nothing
// crosses a batch row or a call.
#include "common.cuh"

using dfl::u16;

// Input side: prepared = BF16(Conv_0(x)); finish_delta = BF16(delta side 1) [rows, 2, G].
// prepared_f32 (optional) receives the represented prepared value for the next GEMM.
extern "C" __global__ void conv_prepare(const float* __restrict__ x, const float* __restrict__ delta,
                                        const float* __restrict__ base, int W, long long rows, int H,
                                        u16* __restrict__ prepared_bf16, float* __restrict__ prepared_f32,
                                        u16* __restrict__ finish_delta) {
    const int G = H / 16;
    const long long n = rows * H;
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < n; t += (long long)gridDim.x * blockDim.x) {
        const long long r = t / H;
        const int c = (int)(t - r * H), g = c >> 4, i = (int)(r % W);
        const float* dr = delta + r * 4 * G;
        float out = (base[c] + dr[g]) * x[t];
        if (i >= 1) out = fmaf(base[H + c] + dr[G + g], x[t - H], out);
        const u16 bits = dfl::f32_to_bf16_rn(out);
        prepared_bf16[t] = bits;
        if (prepared_f32) prepared_f32[t] = dfl::bf16_to_f32(bits);
    }
    const long long nd = rows * 2 * G;
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < nd; t += (long long)gridDim.x * blockDim.x) {
        const long long r = t / (2 * G);
        finish_delta[t] = dfl::f32_to_bf16_rn(delta[r * 4 * G + 2 * G + (t - r * 2 * G)]);
    }
}

// Output side on the branch output z with the represented delta from prepare:
// f = BF16(Conv_1(z)) (the reference's represented finish), then out = residual + f when
// a residual is given (the layer's y = x + finish(...)). out_f32 holds the unrounded sum;
// out_bf16 its BF16 rounding (equal to f when there is no residual).
extern "C" __global__ void conv_finish(const float* __restrict__ z, const u16* __restrict__ finish_delta,
                                       const float* __restrict__ base, int W, long long rows, int H,
                                       const float* __restrict__ residual, float* __restrict__ out_f32,
                                       u16* __restrict__ out_bf16) {
    const int G = H / 16;
    const long long n = rows * H;
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < n; t += (long long)gridDim.x * blockDim.x) {
        const long long r = t / H;
        const int c = (int)(t - r * H), g = c >> 4, i = (int)(r % W);
        const u16* fd = finish_delta + r * 2 * G;
        float out = (base[2 * H + c] + dfl::bf16_to_f32(fd[g])) * z[t];
        if (i >= 1) out = fmaf(base[3 * H + c] + dfl::bf16_to_f32(fd[G + g]), z[t - H], out);
        float y = dfl::round_bf16(out);
        if (residual) y += residual[t];
        if (out_f32) out_f32[t] = y;
        if (out_bf16) out_bf16[t] = dfl::f32_to_bf16_rn(y);
    }
}
