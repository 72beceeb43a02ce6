// Fast mode masked block / draft layer (issue 12; reference/draft_layer.py, reference/masked_block.py,
// reference/grouped_conv.py). The GEMMs are cuBLAS BF16 (kernels_cu/fast.py gemm_bf16, FP32
// accumulation) through resident weights; these kernels are the glue between them, each one pass
// over a few rows of activations (M = B * W <= 128 rows):
//
//   fb_resid_norm    the residual stream update x += branch (with the DFlash2 conv finish on the
//                    branch, rounded BF16 as the exact mode's conv_finish) fused with the next
//                    plain RMSNorm; the first layer reads its rows straight from the BF16 embedding
//                    table (anchor / MASK gather) or from the caller's BF16 x;
//   fb_qkv_post      head RMSNorm + RoPE of q and k (angles in double from the exact 64-bit
//                    position, common.cuh) and the split of the fused [q; k; v] GEMM output,
//                    q / k / v stored as BF16 values (named intermediates q, k, v_proj);
//   fb_conv_prepare  DFlash2 input side of the grouped conv on the FP32 normalized input, the
//                    delta from the hi + lo GEMM rows (see fast_block.py);
//   fb_silu_mul      act = BF16(SiLU(gate) * up) from the fused [gate; up] GEMM output.
//
// Arithmetic is fp32 (FMA contraction on, the loader's NVRTC options); represented and named BF16
// points are rounded once with the cvt.rn conversions of common.cuh.
#include "common.cuh"

using dfl::u16;

// The residual stream value at (row r, column c) before the norm: the source row (fp32 stream,
// BF16 bits of the caller's x, or an embedding row chosen by token) plus the branch output. The
// DFlash2 finish on the branch z: BF16((base1[c] + fd[g]) z[r] + 1{i >= 1} (base1[H + c] +
// fd[G + g]) z[r - 1]) (grouped_conv.cu conv_finish, the same operation order).
__device__ __forceinline__ float fb_value(int r, int c, int i, int H, const float* resid_in, const u16* srow,
                                          const float* __restrict__ branch, const float* __restrict__ conv_base,
                                          const u16* __restrict__ fd) {
    const long long o = (long long)r * H + c;
    float x = resid_in ? resid_in[o] : dfl::bf16_to_f32(srow[c]);
    if (branch) {
        float z;
        if (conv_base) {
            const int G = H >> 4, g = c >> 4;
            z = (conv_base[c] + dfl::bf16_to_f32(fd[g])) * branch[o];
            if (i >= 1) z = fmaf(conv_base[H + c] + dfl::bf16_to_f32(fd[G + g]), branch[o - H], z);
            z = dfl::round_bf16(z);
        } else {
            z = branch[o];
        }
        x += z;
    }
    return x;
}

// One block (256 threads) per row r < M of W-column blocks (column i = r % W, batch row b = r / W).
//   source: resid_in (fp32 [M, H]) if not null, else BF16 rows of src_bits: row r itself
//           (tok_mode 0), or embed row anchor[b] for column 0 and mask_id for the others
//           (tok_mode 1: int32 anchor, 2: int64 anchor);
//   branch (optional, fp32 [M, H]): added to the source; with conv_base (side 1 of the conv base,
//           fp32 [2 taps, H]) and fd (BF16 finish delta [M, 2, G]) the conv finish is applied first;
//   resid_out / resid_bits (optional): the new residual stream (fp32; BF16 bits). resid_out may
//           be resid_in (each thread reads its element before writing it);
//   norm_w (optional): plain RMSNorm w * (x / sqrt(mean(x^2) + eps)) of the new row into norm_f32
//           (fp32), norm_hi (BF16 bits) and norm_lo (BF16 bits of the remainder y - hi), each
//           optional; skip_first: column 0 gets no norm output and row r writes to b * (W-1) + i-1
//           (the masked block's hidden, mask columns only).
extern "C" __global__ void __launch_bounds__(256)
fb_resid_norm(int M, int H, int W, const float* resid_in, const u16* __restrict__ src_bits,
              const void* __restrict__ tok, int tok_mode, long long mask_id, const float* __restrict__ branch,
              const float* __restrict__ conv_base, const u16* __restrict__ fd, float* resid_out,
              u16* __restrict__ resid_bits, const float* __restrict__ norm_w, float eps, float* __restrict__ norm_f32,
              u16* __restrict__ norm_hi, u16* __restrict__ norm_lo, int skip_first) {
    __shared__ float scratch[33];
    const int r = blockIdx.x;
    if (r >= M) return;
    const int i = r % W, b = r / W;
    const u16* srow = nullptr;
    if (!resid_in) {
        long long t = r;
        if (tok_mode != 0) {
            const long long a = tok_mode == 1 ? (long long)((const int*)tok)[b] : ((const long long*)tok)[b];
            t = i == 0 ? a : mask_id;
        }
        srow = src_bits + t * H;
    }
    const u16* fdr = fd ? fd + (long long)r * 2 * (H >> 4) : nullptr;
    float ss = 0.f;
    for (int c = threadIdx.x; c < H; c += blockDim.x) {
        const float x = fb_value(r, c, i, H, resid_in, srow, branch, conv_base, fdr);
        const long long o = (long long)r * H + c;
        if (resid_out) resid_out[o] = x;
        if (resid_bits) resid_bits[o] = dfl::f32_to_bf16_rn(x);
        ss += x * x;
    }
    if (!norm_w) return;  // block-uniform
    const float denom = sqrtf(dfl::block_sum(ss, scratch) / (float)H + eps);
    if (skip_first && i == 0) return;  // block-uniform, after the block-wide sum
    const long long orow = skip_first ? (long long)b * (W - 1) + (i - 1) : r;
    for (int c = threadIdx.x; c < H; c += blockDim.x) {
        const float x = resid_out ? resid_out[(long long)r * H + c]
                                  : fb_value(r, c, i, H, resid_in, srow, branch, conv_base, fdr);
        const float y = norm_w[c] * (x / denom);
        const long long o = orow * H + c;
        if (norm_f32) norm_f32[o] = y;
        const u16 hi = dfl::f32_to_bf16_rn(y);
        if (norm_hi) norm_hi[o] = hi;
        if (norm_lo) norm_lo[o] = dfl::f32_to_bf16_rn(y - dfl::bf16_to_f32(hi));
    }
}

// Grid M * (Hq + 2 Hk) blocks, one head of one row each; block = D rounded up to full warps,
// dynamic shared memory D floats. qkv [M, (Hq + 2 Hk) D] fp32 (the fused GEMM output, heads in
// the order q, k, v); positions frontier[r / W] + r % W. q [M, Hq, D], k / v [M, Hk, D] fp32 out,
// each rounded to its BF16 value.
extern "C" __global__ void __launch_bounds__(1024)
fb_qkv_post(const float* __restrict__ qkv, int M, int W, int Hq, int Hk, int D, const float* __restrict__ q_norm,
            const float* __restrict__ k_norm, const double* __restrict__ inv_freq,
            const long long* __restrict__ frontier, float eps, float* __restrict__ q, float* __restrict__ k,
            float* __restrict__ v) {
    extern __shared__ float sh[];
    __shared__ float scratch[33];
    const int heads = Hq + 2 * Hk;
    const int r = blockIdx.x / heads, h = blockIdx.x % heads;
    if (r >= M) return;
    const int d = threadIdx.x;
    const float x = d < D ? qkv[((long long)r * heads + h) * D + d] : 0.f;
    if (h >= Hq + Hk) {  // v: block-uniform branch
        if (d < D) v[((long long)r * Hk + (h - Hq - Hk)) * D + d] = dfl::round_bf16(x);
        return;
    }
    const bool isq = h < Hq;
    const long long pos = frontier[r / W] + (long long)(r % W);
    const float y = dfl::head_norm_rope(x, d, D, isq ? q_norm : k_norm, eps, inv_freq, pos, true, sh, scratch);
    if (d < D) {
        if (isq)
            q[((long long)r * Hq + h) * D + d] = dfl::round_bf16(y);
        else
            k[((long long)r * Hk + (h - Hq)) * D + d] = dfl::round_bf16(y);
    }
}

// DFlash2 input side on the fp32 normalized input x [M, H]. dl [2M, 4G] holds the delta GEMM of
// the BF16 hi parts (rows < M) and of the BF16 remainders (rows >= M): delta = hi row + lo row,
// the projection of x to about 2^-17 relative (the exact mode projects the fp32 x). base0 is side
// 0 of the conv base [2 taps, H]. prepared = BF16(Conv_0(x)); fd = BF16(delta side 1) [M, 2, G].
extern "C" __global__ void fb_conv_prepare(const float* __restrict__ x, const float* __restrict__ dl,
                                           const float* __restrict__ base0, int W, int M, int H,
                                           u16* __restrict__ prepared, u16* __restrict__ fd) {
    const int G = H >> 4;
    const long long G4 = 4LL * G;
    const long long n = (long long)M * H;
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < n; t += step) {
        const long long r = t / H;
        const int c = (int)(t - r * H), g = c >> 4, i = (int)(r % W);
        const float* dh = dl + r * G4;
        const float* dlo = dl + (M + r) * G4;
        float out = (base0[c] + (dh[g] + dlo[g])) * x[t];
        if (i >= 1) out = fmaf(base0[H + c] + (dh[G + g] + dlo[G + g]), x[t - H], out);
        prepared[t] = dfl::f32_to_bf16_rn(out);
    }
    const long long nd = (long long)M * 2 * G;
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < nd; t += step) {
        const long long r = t / (2 * G);
        const long long j = 2LL * G + (t - r * 2 * G);
        fd[t] = dfl::f32_to_bf16_rn(dl[r * G4 + j] + dl[(M + r) * G4 + j]);
    }
}

// act [M, I] = BF16(SiLU(gate) * up), SiLU(g) = g / (1 + exp(-g)) (reference/norms.py), from the
// fused GEMM output gu [M, 2I] (gate columns first).
extern "C" __global__ void fb_silu_mul(const float* __restrict__ gu, int M, int I, u16* __restrict__ act) {
    const long long n = (long long)M * I;
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < n; t += (long long)gridDim.x * blockDim.x) {
        const long long r = t / I;
        const long long j = t - r * I;
        const float g = gu[r * 2 * I + j];
        const float u = gu[r * 2 * I + I + j];
        act[t] = dfl::f32_to_bf16_rn(g / (1.f + expf(-g)) * u);
    }
}
