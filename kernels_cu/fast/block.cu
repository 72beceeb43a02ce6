// Fast mode masked block / draft layer (reference/draft_layer.py, reference/masked_block.py,
// reference/grouped_conv.py). The GEMMs are cuBLAS BF16 (kernels_cu/fast/backend.py gemm_bf16, FP32
// accumulation) through resident weights, or at <= 16 rows kernels_cu/fast/gemv.cu; these kernels are
// the glue between them, each one pass over a few rows of activations (M = B * W <= 128 rows):
//
//   fb_resid_norm    the residual stream update x += branch (with the DFlash2 conv finish on the
//                    branch, rounded BF16 as the exact mode's conv_finish) fused with the next
//                    plain RMSNorm; the first layer reads its rows straight from the BF16 embedding
//                    table (anchor / MASK gather) or from the caller's BF16 x;
//   fb_qkv_post      head RMSNorm + RoPE of q and k (angles in double from the exact 64-bit
//                    position, common.cuh) and the split of the fused [q; k; v] GEMM output,
//                    q / k / v stored as BF16 values (named intermediates q, k, v_proj);
//   fb_conv_prepare  DFlash2 input side of the grouped conv on the FP32 normalized input, the
//                    delta from the hi + lo GEMM rows (see fast/block.py);
//   fb_silu_mul      act = BF16(SiLU(gate) * up) from the fused [gate; up] GEMM output (not launched
//                    where fast_gemv_act_* runs that GEMM with the same function in its epilogue:
//                    CudaEngine.mlp_act).
//
// Arithmetic is fp32 (FMA contraction on, the loader's NVRTC options); represented and named BF16
// points are rounded once with the cvt.rn conversions of common.cuh.
#include "common.cuh"

using dfl::u16;

// A branch given as `parts` (1 .. FB_MAX_PARTS) fp32 partial products [parts, M, H] (`stride`
// elements apart: the K slices of a split GEMM, kernels_cu/fast/block.py split_k), read as their sum
// in part order. Every part's load is issued before the first add (an unrolled, predicated loop: a
// runtime-count loop waited one memory latency per part).
#define FB_MAX_PARTS 4
struct FbBr {
    const float* __restrict__ p;
    int parts;
    long long stride;
    __device__ __forceinline__ float at(long long o) const {
        float t[FB_MAX_PARTS];
#pragma unroll
        for (int q = 0; q < FB_MAX_PARTS; ++q) t[q] = q < parts ? p[q * stride + o] : 0.f;
        float z = t[0];
#pragma unroll
        for (int q = 1; q < FB_MAX_PARTS; ++q)
            if (q < parts) z += t[q];
        return z;
    }
    __device__ __forceinline__ float4 at4(long long o) const {
        float4 t[FB_MAX_PARTS];
#pragma unroll
        for (int q = 0; q < FB_MAX_PARTS; ++q)
            t[q] = q < parts ? *reinterpret_cast<const float4*>(p + q * stride + o) : make_float4(0.f, 0.f, 0.f, 0.f);
        float4 z = t[0];
#pragma unroll
        for (int q = 1; q < FB_MAX_PARTS; ++q) {
            if (q < parts) {
                z.x += t[q].x;
                z.y += t[q].y;
                z.z += t[q].z;
                z.w += t[q].w;
            }
        }
        return z;
    }
};

// The residual stream value at (row r, column c) before the norm: the source row (fp32 stream,
// BF16 bits of the caller's x, or an embedding row chosen by token) plus the branch output. The
// DFlash2 finish on the branch z: BF16((base1[c] + fd[g]) z[r] + 1{i >= 1} (base1[H + c] +
// fd[G + g]) z[r - 1]) (grouped_conv.cu conv_finish, the same operation order). RES: the source
// is resid_in (else srow); BR: a branch is added; CONV: with the conv finish. Compile-time flags,
// so that an unrolled loop over a row holds no branches and its loads are all in flight at once.
template <bool RES, bool BR, bool CONV>
__device__ __forceinline__ float fb_value(int r, int c, int i, int H, const float* resid_in, const u16* srow,
                                          const FbBr& branch, const float* __restrict__ conv_base,
                                          const u16* __restrict__ fd) {
    const long long o = (long long)r * H + c;
    float x = RES ? resid_in[o] : dfl::bf16_to_f32(srow[c]);
    if (BR) {
        float z;
        if (CONV) {
            const int G = H >> 4, g = c >> 4;
            z = (conv_base[c] + dfl::bf16_to_f32(fd[g])) * branch.at(o);
            if (i >= 1) z = fmaf(conv_base[H + c] + dfl::bf16_to_f32(fd[G + g]), branch.at(o - H), z);
            z = dfl::round_bf16(z);
        } else {
            z = branch.at(o);
        }
        x += z;
    }
    return x;
}

#define FB_RN_MAX_THREADS 1024  // fb_resid_norm's block: T threads, a multiple of 32 (fast/block.py resid_norm_threads)
#define FB_RN_MAXV4 4  // float4 groups per thread held in registers: rows up to 16 T wide (more spill
                       // at the 64 registers a 1024-thread block allows)

// The norm's output of one element (shared by both row paths).
__device__ __forceinline__ void fb_norm_store(long long o, float y, float* __restrict__ norm_f32,
                                              u16* __restrict__ norm_hi, u16* __restrict__ norm_lo) {
    if (norm_f32) norm_f32[o] = y;
    const u16 hi = dfl::f32_to_bf16_rn(y);
    if (norm_hi) norm_hi[o] = hi;
    if (norm_lo) norm_lo[o] = dfl::f32_to_bf16_rn(y - dfl::bf16_to_f32(hi));
}

// The four columns c .. c + 3 of row `row` (H % 4 == 0, aligned): fb_value's arithmetic on 16-byte
// loads (8-byte for BF16 source rows); the four columns share the conv finish's group g.
template <bool RES, bool BR, bool CONV>
__device__ __forceinline__ float4 fb_group_value(long long row, int c, int i, int H, const float* resid_in,
                                                 const u16* srow, const FbBr& branch,
                                                 const float* __restrict__ conv_base, const u16* __restrict__ fdr) {
    float4 x;
    if (RES) {
        x = *reinterpret_cast<const float4*>(resid_in + row + c);
    } else {
        const ushort4 sb = *reinterpret_cast<const ushort4*>(srow + c);
        x = make_float4(dfl::bf16_to_f32(sb.x), dfl::bf16_to_f32(sb.y), dfl::bf16_to_f32(sb.z),
                        dfl::bf16_to_f32(sb.w));
    }
    if (BR) {
        float4 z = branch.at4(row + c);
        if (CONV) {
            const int G = H >> 4, g = c >> 4;
            const float4 b0 = *reinterpret_cast<const float4*>(conv_base + c);
            const float f0 = dfl::bf16_to_f32(fdr[g]);
            float4 o = make_float4((b0.x + f0) * z.x, (b0.y + f0) * z.y, (b0.z + f0) * z.z, (b0.w + f0) * z.w);
            if (i >= 1) {
                const float4 b1 = *reinterpret_cast<const float4*>(conv_base + H + c);
                const float4 zp = branch.at4(row - H + c);
                const float f1 = dfl::bf16_to_f32(fdr[G + g]);
                o.x = fmaf(b1.x + f1, zp.x, o.x);
                o.y = fmaf(b1.y + f1, zp.y, o.y);
                o.z = fmaf(b1.z + f1, zp.z, o.z);
                o.w = fmaf(b1.w + f1, zp.w, o.w);
            }
            z = make_float4(dfl::round_bf16(o.x), dfl::round_bf16(o.y), dfl::round_bf16(o.z), dfl::round_bf16(o.w));
        }
        x.x += z.x;
        x.y += z.y;
        x.z += z.z;
        x.w += z.w;
    }
    return x;
}

// Store the new stream's four columns (fp32 and / or BF16 bits) and add their squares to ss in
// column order.
__device__ __forceinline__ void fb_group_store(long long row, int c, float4 x, float* resid_out,
                                               u16* __restrict__ resid_bits, float& ss) {
    if (resid_out) *reinterpret_cast<float4*>(resid_out + row + c) = x;
    if (resid_bits) {
        ushort4 o;
        o.x = dfl::f32_to_bf16_rn(x.x);
        o.y = dfl::f32_to_bf16_rn(x.y);
        o.z = dfl::f32_to_bf16_rn(x.z);
        o.w = dfl::f32_to_bf16_rn(x.w);
        *reinterpret_cast<ushort4*>(resid_bits + row + c) = o;
    }
    ss += x.x * x.x;
    ss += x.y * x.y;
    ss += x.z * x.z;
    ss += x.w * x.w;
}

// The norm of four columns: y = w (x / denom) into norm_f32 / norm_hi / norm_lo (fb_norm_store's).
__device__ __forceinline__ void fb_group_norm(long long orow, int c, float4 x, float denom,
                                              const float* __restrict__ norm_w, float* __restrict__ norm_f32,
                                              u16* __restrict__ norm_hi, u16* __restrict__ norm_lo) {
    const float4 w = *reinterpret_cast<const float4*>(norm_w + c);
    const float y[4] = {w.x * (x.x / denom), w.y * (x.y / denom), w.z * (x.z / denom), w.w * (x.w / denom)};
    if (norm_f32) *reinterpret_cast<float4*>(norm_f32 + orow + c) = make_float4(y[0], y[1], y[2], y[3]);
    u16 hi[4], lo[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        hi[e] = dfl::f32_to_bf16_rn(y[e]);
        lo[e] = dfl::f32_to_bf16_rn(y[e] - dfl::bf16_to_f32(hi[e]));
    }
    if (norm_hi) *reinterpret_cast<ushort4*>(norm_hi + orow + c) = make_ushort4(hi[0], hi[1], hi[2], hi[3]);
    if (norm_lo) *reinterpret_cast<ushort4*>(norm_lo + orow + c) = make_ushort4(lo[0], lo[1], lo[2], lo[3]);
}

// Element ownership (both paths): of a block of T threads, thread t owns the groups of four
// columns q = t, t + T, ... (columns 4q .. 4q + 3) and sums its squares group by group, column by
// column, then the block sum; so the two paths give the same bits (for the same T).
//
// Registers path, H % 4 == 0 and 16-byte aligned rows, NV4 = ceil(H / 4T) groups per thread
// (a compile-time count, so the unrolled code holds only the groups a row has: the first
// version unrolled 32 scalar columns for every width and ran 14 us per row at both 2048 and
// 5120, H200): every load of the row is issued before the first use, 16-byte loads of the
// fp32 rows and 8-byte loads of BF16 rows, the norm's second pass reads the registers.
template <int NV4, bool RES, bool BR, bool CONV>
__device__ __forceinline__ void fb_resid_norm_vec(int r, int i, int b, int H, int W, const float* resid_in,
                                                  const u16* srow, const FbBr& branch,
                                                  const float* __restrict__ conv_base, const u16* __restrict__ fdr,
                                                  float* resid_out, u16* __restrict__ resid_bits,
                                                  const float* __restrict__ norm_w, float eps,
                                                  float* __restrict__ norm_f32, u16* __restrict__ norm_hi,
                                                  u16* __restrict__ norm_lo, int skip_first, float* scratch) {
    const int H4 = H >> 2;
    const long long row = (long long)r * H;
    float4 xv[NV4];
#pragma unroll
    for (int j = 0; j < NV4; ++j) {
        const int q = threadIdx.x + j * blockDim.x;
        xv[j] = q < H4 ? fb_group_value<RES, BR, CONV>(row, 4 * q, i, H, resid_in, srow, branch, conv_base, fdr)
                       : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < NV4; ++j) {
        const int q = threadIdx.x + j * blockDim.x;
        if (q < H4) fb_group_store(row, 4 * q, xv[j], resid_out, resid_bits, ss);
    }
    if (!norm_w) return;  // block-uniform
    const float denom = sqrtf(dfl::block_sum(ss, scratch) / (float)H + eps);
    if (skip_first && i == 0) return;  // block-uniform, after the block-wide sum
    const long long orow = (skip_first ? (long long)b * (W - 1) + (i - 1) : r) * H;
#pragma unroll
    for (int j = 0; j < NV4; ++j) {
        const int q = threadIdx.x + j * blockDim.x;
        if (q < H4) fb_group_norm(orow, 4 * q, xv[j], denom, norm_w, norm_f32, norm_hi, norm_lo);
    }
}

// Any width or alignment: the same ownership with scalar accesses, the norm's second pass
// re-reading (or recomputing) the row.
__device__ void fb_resid_norm_strided(int r, int i, int b, int H, int W, const float* resid_in, const u16* srow,
                                      const FbBr& branch, const float* __restrict__ conv_base,
                                      const u16* __restrict__ fdr, float* resid_out, u16* __restrict__ resid_bits,
                                      const float* __restrict__ norm_w, float eps, float* __restrict__ norm_f32,
                                      u16* __restrict__ norm_hi, u16* __restrict__ norm_lo, int skip_first,
                                      float* scratch) {
#define FB_VALUE(c)                                                                                             \
    (resid_in ? (branch.p ? (conv_base ? fb_value<true, true, true>(r, c, i, H, resid_in, srow, branch, conv_base, fdr)   \
                                     : fb_value<true, true, false>(r, c, i, H, resid_in, srow, branch, conv_base, fdr)) \
                        : fb_value<true, false, false>(r, c, i, H, resid_in, srow, branch, conv_base, fdr))            \
              : (branch.p ? (conv_base ? fb_value<false, true, true>(r, c, i, H, resid_in, srow, branch, conv_base, fdr) \
                                     : fb_value<false, true, false>(r, c, i, H, resid_in, srow, branch, conv_base, fdr)) \
                        : fb_value<false, false, false>(r, c, i, H, resid_in, srow, branch, conv_base, fdr)))
    const int H4 = (H + 3) >> 2;
    float ss = 0.f;
    for (int q = threadIdx.x; q < H4; q += blockDim.x) {
        for (int c = 4 * q; c < 4 * q + 4 && c < H; ++c) {
            const float x = FB_VALUE(c);
            const long long o = (long long)r * H + c;
            if (resid_out) resid_out[o] = x;
            if (resid_bits) resid_bits[o] = dfl::f32_to_bf16_rn(x);
            ss += x * x;
        }
    }
    if (!norm_w) return;  // block-uniform
    const float denom = sqrtf(dfl::block_sum(ss, scratch) / (float)H + eps);
    if (skip_first && i == 0) return;  // block-uniform, after the block-wide sum
    const long long orow = skip_first ? (long long)b * (W - 1) + (i - 1) : r;
    for (int c = threadIdx.x; c < H; c += blockDim.x) {
        const float x = resid_out ? resid_out[(long long)r * H + c] : FB_VALUE(c);
        fb_norm_store(orow * H + c, norm_w[c] * (x / denom), norm_f32, norm_hi, norm_lo);
    }
#undef FB_VALUE
}

__device__ __forceinline__ bool fb_aligned(const void* p, unsigned n) {
    return p == nullptr || ((unsigned long long)p & (n - 1)) == 0;
}

// The six (source, branch, conv) instantiations of a row body CALL(N, RES, BR, CONV), chosen by
// which of resid_in / branch / conv_base the launch passes (uniform over the grid).
#define FB_BY_MODE(CALL, N)                \
    if (resid_in) {                        \
        if (!branch)                       \
            CALL(N, true, false, false);   \
        else if (conv_base)                \
            CALL(N, true, true, true);     \
        else                               \
            CALL(N, true, true, false);    \
    } else {                               \
        if (!branch)                       \
            CALL(N, false, false, false);  \
        else if (conv_base)                \
            CALL(N, false, true, true);    \
        else                               \
            CALL(N, false, true, false);   \
    }

// The BF16 source row of row r when there is no fp32 stream: row r of src_bits (tok_mode 0), or
// the embedding row anchor[b] for column 0 and mask_id for the others (1: int32, 2: int64 anchor).
__device__ __forceinline__ const u16* fb_source_row(int r, int i, int b, int H, const u16* src_bits, const void* tok,
                                                    int tok_mode, long long mask_id) {
    long long t = r;
    if (tok_mode != 0) {
        const long long a = tok_mode == 1 ? (long long)((const int*)tok)[b] : ((const long long*)tok)[b];
        t = i == 0 ? a : mask_id;
    }
    return src_bits + t * H;
}

// One block (T threads, a multiple of 32 up to 1024) per row r < M of W-column blocks (column
// i = r % W, batch row b = r / W). T is the launcher's: H / 4 or about H / 8 column groups per row so
// that each thread holds one or two (H200, 128 rows of 5120 after a GEMM: 256 threads, 8 warps an
// SM, stalled on their loads ran ~10 us a call in the round).
//   source: resid_in (fp32 [M, H]) if not null, else BF16 rows of src_bits: row r itself
//           (tok_mode 0), or embed row anchor[b] for column 0 and mask_id for the others
//           (tok_mode 1: int32 anchor, 2: int64 anchor);
//   branch (optional, fp32 [bparts, M, H], parts bstride elements apart, summed in part order: a
//           split GEMM's K slices): added to the source; with conv_base (side 1 of the conv base,
//           fp32 [2 taps, H]) and fd (BF16 finish delta [M, 2, G]) the conv finish is applied first;
//   resid_out / resid_bits (optional): the new residual stream (fp32; BF16 bits). resid_out may
//           be resid_in (each thread reads its elements before writing them);
//   norm_w (optional): plain RMSNorm w * (x / sqrt(mean(x^2) + eps)) of the new row into norm_f32
//           (fp32), norm_hi (BF16 bits) and norm_lo (BF16 bits of the remainder y - hi), each
//           optional; skip_first: column 0 gets no norm output and row r writes to b * (W-1) + i-1
//           (the masked block's hidden, mask columns only).
// Rows up to 8192 wide (H % 4 == 0, aligned) run from registers (fb_resid_norm_vec), others
// strided; the two give the same bits. force_strided: tests compare the two.
extern "C" __global__ void __launch_bounds__(FB_RN_MAX_THREADS)
fb_resid_norm(int M, int H, int W, const float* resid_in, const u16* __restrict__ src_bits,
              const void* __restrict__ tok, int tok_mode, long long mask_id, const float* __restrict__ branch,
              const float* __restrict__ conv_base, const u16* __restrict__ fd, float* resid_out,
              u16* __restrict__ resid_bits, const float* __restrict__ norm_w, float eps, float* __restrict__ norm_f32,
              u16* __restrict__ norm_hi, u16* __restrict__ norm_lo, int skip_first, int bparts, long long bstride,
              int force_strided) {
    dfl::pdl_trigger();  // the kernel after this one may launch (it waits for this grid before reading)
    if (norm_w && blockIdx.x < M)  // a constant: its lines asked for in L2 while the kernel ahead runs
        for (int c = threadIdx.x * 32; c < H; c += blockDim.x * 32) dfl::prefetch_l2(norm_w + c);
    dfl::pdl_wait_for(resid_in, branch, fd);  // kernels_cu/pdl.py: the kernel ahead's outputs, read after it
    __shared__ float scratch[33];
    const FbBr br{branch, bparts, bstride};
    const int r = blockIdx.x;
    if (r >= M) return;
    const int i = r % W, b = r / W;
    const u16* srow = resid_in ? nullptr : fb_source_row(r, i, b, H, src_bits, tok, tok_mode, mask_id);
    const u16* fdr = fd ? fd + (long long)r * 2 * (H >> 4) : nullptr;
    const int nv4 = (H + 4 * (int)blockDim.x - 1) / (4 * (int)blockDim.x);
    const bool vec = !force_strided && (H & 3) == 0 && nv4 <= FB_RN_MAXV4 && fb_aligned(resid_in, 16) &&
                     fb_aligned(srow, 8) && fb_aligned(branch, 16) && (bstride & 3) == 0 &&
                     fb_aligned(conv_base, 16) && fb_aligned(resid_out, 16) && fb_aligned(resid_bits, 8) &&
                     fb_aligned(norm_w, 16) && fb_aligned(norm_f32, 16) && fb_aligned(norm_hi, 8) &&
                     fb_aligned(norm_lo, 8);  // block-uniform
    if (!vec) {
        fb_resid_norm_strided(r, i, b, H, W, resid_in, srow, br, conv_base, fdr, resid_out, resid_bits, norm_w,
                              eps, norm_f32, norm_hi, norm_lo, skip_first, scratch);
        return;
    }
#define FB_VEC(N, RES, BR, CONV)                                                                                \
    fb_resid_norm_vec<N, RES, BR, CONV>(r, i, b, H, W, resid_in, srow, br, conv_base, fdr, resid_out, resid_bits, \
                                        norm_w, eps, norm_f32, norm_hi, norm_lo, skip_first, scratch)
    switch (nv4) {
        case 1: FB_BY_MODE(FB_VEC, 1) break;
        case 2: FB_BY_MODE(FB_VEC, 2) break;
        case 3: FB_BY_MODE(FB_VEC, 3) break;
        default: FB_BY_MODE(FB_VEC, 4) break;
    }
#undef FB_VEC
}

// Thread-block clusters need sm_90: below it (NVRTC builds for the device at hand) the module has
// no fb_resid_norm_cluster and kernels_cu/fast/block.py never asks for it (cluster_capable()).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
// --- the same Op over a thread-block cluster per row (sm_90) ---------------------------------------
// One CTA streams at most about 1/132 of the H200's bandwidth, so a row per CTA (fb_resid_norm)
// takes ~10 us at H 5120 whatever M is (8 rows at B1 use 8 SMs; H200 trace).
// fb_resid_norm_cluster cuts each row over a cluster of FB_CL CTAs (column slices of H / FB_CL):
// each sums the squares of its slice (the block sum), publishes it in its shared memory, and after
// a cluster barrier every CTA adds the FB_CL partials read through distributed shared memory in
// rank order (the same sum, hence the same norm, in every CTA of the row); a second cluster barrier
// keeps each CTA's shared memory alive until its peers have read it. Per element the arithmetic
// is fb_value's and the norm's; only the sum of squares is grouped differently from
// fb_resid_norm (so resid_out / resid_bits are bitwise the single-CTA kernel's, the norm outputs
// within the fp32 sum's reordering). Needs H % (4 FB_CL) == 0, H <= 8192 and 16-byte aligned fp32
// rows / 8-byte aligned BF16 rows (fast/block.py checks before launching). Grid FB_CL * M.
#define FB_CL 8
#define FB_CL_THREADS 128

__device__ __forceinline__ unsigned fb_smem_u32(const void* p) {
    unsigned r;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
    return r;
}
__device__ __forceinline__ void fb_cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ float fb_dsmem_load(const float* p, unsigned rank) {
    unsigned a;
    float v;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(a) : "r"(fb_smem_u32(p)), "r"(rank));
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(a) : "memory");
    return v;
}

template <int NV4, bool RES, bool BR, bool CONV>
__device__ __forceinline__ void fb_resid_norm_cl(int r, int i, int b, int H, int W, int c0, int c1,
                                                 const float* resid_in, const u16* srow,
                                                 const FbBr& branch, const float* __restrict__ conv_base,
                                                 const u16* __restrict__ fdr, float* resid_out,
                                                 u16* __restrict__ resid_bits, const float* __restrict__ norm_w,
                                                 float eps, float* __restrict__ norm_f32, u16* __restrict__ norm_hi,
                                                 u16* __restrict__ norm_lo, int skip_first, float* scratch,
                                                 float* part) {
    const long long row = (long long)r * H;
    float4 xv[NV4];
#pragma unroll
    for (int j = 0; j < NV4; ++j) {
        const int c = c0 + 4 * (threadIdx.x + j * FB_CL_THREADS);
        xv[j] = c < c1 ? fb_group_value<RES, BR, CONV>(row, c, i, H, resid_in, srow, branch, conv_base, fdr)
                       : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < NV4; ++j) {
        const int c = c0 + 4 * (threadIdx.x + j * FB_CL_THREADS);
        if (c < c1) fb_group_store(row, c, xv[j], resid_out, resid_bits, ss);
    }
    if (!norm_w) return;  // uniform over the cluster (no barrier is skipped by some CTAs only)
    const float mine = dfl::block_sum(ss, scratch);
    if (threadIdx.x == 0) *part = mine;
    fb_cluster_sync();  // every partial published
    float pv[FB_CL];  // every peer's load issued before the first add (one remote latency, not FB_CL)
#pragma unroll
    for (int q = 0; q < FB_CL; ++q) pv[q] = fb_dsmem_load(part, (unsigned)q);
    float tot = 0.f;
#pragma unroll
    for (int q = 0; q < FB_CL; ++q) tot += pv[q];  // rank order in every CTA
    fb_cluster_sync();  // peers done reading this CTA's partial
    const float denom = sqrtf(tot / (float)H + eps);
    if (skip_first && i == 0) return;
    const long long orow = (skip_first ? (long long)b * (W - 1) + (i - 1) : r) * H;
#pragma unroll
    for (int j = 0; j < NV4; ++j) {
        const int c = c0 + 4 * (threadIdx.x + j * FB_CL_THREADS);
        if (c < c1) fb_group_norm(orow, c, xv[j], denom, norm_w, norm_f32, norm_hi, norm_lo);
    }
}

extern "C" __global__ void __cluster_dims__(FB_CL, 1, 1) __launch_bounds__(FB_CL_THREADS)
fb_resid_norm_cluster(int M, int H, int W, const float* resid_in, const u16* __restrict__ src_bits,
                      const void* __restrict__ tok, int tok_mode, long long mask_id, const float* __restrict__ branch,
                      const float* __restrict__ conv_base, const u16* __restrict__ fd, float* resid_out,
                      u16* __restrict__ resid_bits, const float* __restrict__ norm_w, float eps,
                      float* __restrict__ norm_f32, u16* __restrict__ norm_hi, u16* __restrict__ norm_lo,
                      int skip_first, int bparts, long long bstride) {
    dfl::pdl_trigger();  // the kernel after this one may launch (it waits for this grid before reading)
    __shared__ float scratch[33];
    __shared__ float part;
    const int r = blockIdx.x / FB_CL, q = blockIdx.x % FB_CL;  // 1-D clusters: rank = blockIdx.x % FB_CL
    if (norm_w && r < M)  // this CTA's slice of a constant, asked for in L2 while the kernel ahead runs
        for (int c = (H / FB_CL) * q + threadIdx.x * 32; c < (H / FB_CL) * (q + 1); c += FB_CL_THREADS * 32)
            dfl::prefetch_l2(norm_w + c);
    dfl::pdl_wait_for(resid_in, branch, fd);  // kernels_cu/pdl.py: the kernel ahead's outputs, read after it
    const FbBr br{branch, bparts, bstride};
    if (r >= M) return;  // whole clusters (the grid is FB_CL * M)
    const int i = r % W, b = r / W;
    const u16* srow = resid_in ? nullptr : fb_source_row(r, i, b, H, src_bits, tok, tok_mode, mask_id);
    const u16* fdr = fd ? fd + (long long)r * 2 * (H >> 4) : nullptr;
    const int slice = H / FB_CL, c0 = q * slice, c1 = c0 + slice;
#define FB_CLV(N, RES, BR, CONV)                                                                                 \
    fb_resid_norm_cl<N, RES, BR, CONV>(r, i, b, H, W, c0, c1, resid_in, srow, br, conv_base, fdr, resid_out,      \
                                       resid_bits, norm_w, eps, norm_f32, norm_hi, norm_lo, skip_first, scratch, &part)
    if (slice <= 4 * FB_CL_THREADS) {
        FB_BY_MODE(FB_CLV, 1)
    } else {
        FB_BY_MODE(FB_CLV, 2)
    }
#undef FB_CLV
}

#endif  // sm_90: fb_resid_norm_cluster

// Grid (M, ceil((Hq + 2 Hk) / 8)), 256 threads: one warp per head of one row, heads in the order
// q, k, v of the fused GEMM output qkv [M, (Hq + 2 Hk) D] fp32; positions frontier[r / W] + r % W.
// The row's RoPE table (cos, sin of pos * inv_freq[i], formed and reduced in double as
// common.cuh head_norm_rope, then rounded to fp32) is built once per block in shared memory, not
// once per element of every head; the head RMSNorm sums squares per lane then by the warp's
// butterfly (no block barriers). The arithmetic per element is head_norm_rope's. q [M, Hq, D],
// k / v [M, Hk, D] out, each rounded once to BF16: as BF16 bits (bits_out, what the fast attention
// reads directly: the same bits as the fp32 path, 4-5 us less per layer) or
// as fp32 values. Dynamic shared memory:
// (D + 8 D) floats (the table, one head per warp).
#define FB_QKV_WARPS 8

// One BF16 rounding of y stored as BF16 bits (bits_out) or as its fp32 value.
__device__ __forceinline__ void fb_store_bf16(void* out, long long o, float y, int bits_out) {
    const u16 b = dfl::f32_to_bf16_rn(y);
    if (bits_out)
        static_cast<u16*>(out)[o] = b;
    else
        static_cast<float*>(out)[o] = dfl::bf16_to_f32(b);
}
extern "C" __global__ void __launch_bounds__(FB_QKV_WARPS * 32)
fb_qkv_post(const float* __restrict__ qkv, int M, int W, int Hq, int Hk, int D, const float* __restrict__ q_norm,
            const float* __restrict__ k_norm, const double* __restrict__ inv_freq,
            const long long* __restrict__ frontier, float eps, void* __restrict__ q, void* __restrict__ k,
            void* __restrict__ v, int bits_out, int early_table) {
    extern __shared__ float sh[];
    const int half = D >> 1;
    float* cs = sh;               // [half] cos, then [half] sin
    float* hv = sh + D + (threadIdx.x >> 5) * D;  // this warp's normalized head
    const int heads = Hq + 2 * Hk;
    const int r = blockIdx.x;
    const int lane = threadIdx.x & 31;
    const int h = blockIdx.y * FB_QKV_WARPS + (threadIdx.x >> 5);
    dfl::pdl_trigger();  // the attention may launch: it prefetches ring tiles, then waits for this grid
    if (r >= M) return;  // block-uniform
    const long long pos = frontier[r / W] + (long long)(r % W);  // an input of the Op, no kernel's output
    // The row's RoPE table depends on pos and inv_freq only (no kernel's output). early_table: built before
    // the wait, while the kernel ahead still runs (few rows: FastOptions.early_table_max_rows), and the
    // head's norm weight asked for in L2; else after it, beside the loads of the head.
    auto table = [&]() {
        for (int i = threadIdx.x; i < half; i += blockDim.x) {
            double s_, c_;
            sincos((double)pos * inv_freq[i], &s_, &c_);
            cs[i] = (float)c_;
            cs[half + i] = (float)s_;
        }
    };
    if (early_table) {
        table();
        if (h < Hq + Hk && lane * 32 < D) dfl::prefetch_l2((h < Hq ? q_norm : k_norm) + lane * 32);
    }
    dfl::pdl_wait_for(qkv);  // kernels_cu/pdl.py: qkv (the GEMM's output) is read after this
    const float* x = qkv + ((long long)r * heads + h) * D;
    const bool live_head = h < heads;  // warp-uniform
    float xr[4];  // the head's first 128 elements
#pragma unroll
    for (int e = 0; e < 4; ++e) xr[e] = live_head && lane + 32 * e < D ? x[lane + 32 * e] : 0.f;
    if (!early_table) table();
    __syncthreads();
    if (!live_head) return;  // warp-uniform, after the block's only barrier
#pragma unroll
    for (int e = 0; e < 4; ++e)
        if (lane + 32 * e < D) hv[lane + 32 * e] = xr[e];
    for (int d = lane + 128; d < D; d += 32) hv[d] = x[d];  // heads wider than 128
    if (h >= Hq + Hk) {  // v
        const long long o = ((long long)r * Hk + (h - Hq - Hk)) * D;
        for (int d = lane; d < D; d += 32) fb_store_bf16(v, o + d, hv[d], bits_out);
        return;
    }
    const bool isq = h < Hq;
    const float* w = isq ? q_norm : k_norm;
    float ss = 0.f;
    for (int d = lane; d < D; d += 32) {
        const float xv = hv[d];
        ss += xv * xv;
    }
    const float ms = dfl::warp_sum(ss) / (float)D;
    const float den = sqrtf(ms + eps);
    for (int d = lane; d < D; d += 32) hv[d] = w[d] * (hv[d] / den);  // each lane its own elements
    __syncwarp();
    void* out = isq ? q : k;
    const long long o = isq ? ((long long)r * Hq + h) * D : ((long long)r * Hk + (h - Hq)) * D;
    for (int d = lane; d < D; d += 32) {
        const int i = d < half ? d : d - half;
        const float nx = hv[d], cf = cs[i], sf = cs[half + i];
        fb_store_bf16(out, o + d, d < half ? nx * cf - hv[d + half] * sf : nx * cf + hv[d - half] * sf, bits_out);
    }
}

// DFlash2 input side on the fp32 normalized input x [M, H]. dl [2M, 4G] holds the delta GEMM of
// the BF16 hi parts (rows < M) and of the BF16 remainders (rows >= M): delta = hi row + lo row,
// the projection of x to about 2^-17 relative (the exact mode projects the fp32 x). base0 is side
// 0 of the conv base [2 taps, H]. prepared = BF16(Conv_0(x)); fd = BF16(delta side 1) [M, 2, G].
// Grid (column blocks, M): row r = blockIdx.y; columns c = blockIdx.x * blockDim.x + threadIdx.x
// (and the row's 2G finish deltas on the same threads), no per-element index division (one
// 32-bit r % W per thread).
// dl may come as dparts K-slice partials [dparts, 2M, 4G] (dstride elements apart; a split GEMM):
// the hi rows' parts are summed in part order, the lo rows' likewise, then hi + lo.
__device__ __forceinline__ float fb_delta(const float* __restrict__ dh, const float* __restrict__ dlo, int j,
                                          int dparts, long long dstride) {
    return FbBr{dh, dparts, dstride}.at(j) + FbBr{dlo, dparts, dstride}.at(j);
}

// Per slice of T * CPT columns (T threads, CPT columns each: 4 with 16-byte loads when the launcher
// has checked alignment, else 1; T * CPT <= 1024) the slice's deltas for both taps are summed once
// into shared memory (a K-split delta has 2 dparts terms each; the first version summed them per
// column, 16 times over: 4.8 -> 10.9 us a call at 128 rows, H200), while each thread's x, previous
// row and base loads are already in flight. The arithmetic per element is unchanged.
template <int CPT>
__device__ __forceinline__ void fb_conv_prepare_body(const float* __restrict__ x, const float* __restrict__ dl,
                                                     const float* __restrict__ base0, int W, int M, int H,
                                                     u16* __restrict__ prepared, u16* __restrict__ fd, int dparts,
                                                     long long dstride, float (*dsm)[64]) {
    const int G = H >> 4;
    const long long G4 = 4LL * G;
    const int r = blockIdx.y;
    const int i = r % W, span = blockDim.x * CPT, ng = span >> 4;
    const float* dh = dl + r * G4;
    const float* dlo = dl + (M + (long long)r) * G4;
    for (int c0 = blockIdx.x * span; c0 < H; c0 += gridDim.x * span) {  // block-uniform
        const int c = c0 + threadIdx.x * CPT;
        const long long t = (long long)r * H + c;
        float xv[CPT], xp[CPT], b0[CPT], b1[CPT];
        if (c < H) {  // H % CPT == 0
            if (CPT == 4) {
                *reinterpret_cast<float4*>(xv) = *reinterpret_cast<const float4*>(x + t);
                *reinterpret_cast<float4*>(b0) = *reinterpret_cast<const float4*>(base0 + c);
                if (i >= 1) {
                    *reinterpret_cast<float4*>(xp) = *reinterpret_cast<const float4*>(x + t - H);
                    *reinterpret_cast<float4*>(b1) = *reinterpret_cast<const float4*>(base0 + H + c);
                }
            } else {
                xv[0] = x[t];
                b0[0] = base0[c];
                if (i >= 1) {
                    xp[0] = x[t - H];
                    b1[0] = base0[H + c];
                }
            }
        }
        if (threadIdx.x < 2 * ng) {
            const int tap = threadIdx.x / ng, gl = threadIdx.x % ng, g = (c0 >> 4) + gl;
            if (g < G && (tap == 0 || i >= 1)) dsm[tap][gl] = fb_delta(dh, dlo, tap * G + g, dparts, dstride);
        }
        __syncthreads();
        if (c < H) {
            const int gl = (c - c0) >> 4;  // the CPT columns share their group
            const float d0 = dsm[0][gl], d1 = i >= 1 ? dsm[1][gl] : 0.f;
            u16 o[CPT];
#pragma unroll
            for (int e = 0; e < CPT; ++e) {
                float out = (b0[e] + d0) * xv[e];
                if (i >= 1) out = fmaf(b1[e] + d1, xp[e], out);
                o[e] = dfl::f32_to_bf16_rn(out);
            }
            if (CPT == 4)
                *reinterpret_cast<ushort4*>(prepared + t) = make_ushort4(o[0], o[1], o[2], o[3]);
            else
                prepared[t] = o[0];
        }
        __syncthreads();  // dsm is rewritten by the next slice
    }
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < 2 * G; j += gridDim.x * blockDim.x)
        fd[(long long)r * 2 * G + j] = dfl::f32_to_bf16_rn(fb_delta(dh, dlo, 2 * G + j, dparts, dstride));
}

// vec: 4 columns per thread (H % 4 == 0; x, base0 16-byte and prepared 8-byte aligned; the launcher
// checks), grid (ceil(H / 4T), M); else one column per thread, grid (ceil(H / T), M). T <= 256.
extern "C" __global__ void fb_conv_prepare(const float* __restrict__ x, const float* __restrict__ dl,
                                           const float* __restrict__ base0, int W, int M, int H,
                                           u16* __restrict__ prepared, u16* __restrict__ fd, int dparts,
                                           long long dstride, int vec) {
    dfl::pdl_trigger();  // the kernel after this one may launch (it waits for this grid before reading)
    dfl::pdl_wait_for(x, dl);  // kernels_cu/pdl.py: launched under PDL, nothing is read before this
    __shared__ float dsm[2][64];
    if ((int)blockIdx.y >= M) return;  // block-uniform
    if (vec)
        fb_conv_prepare_body<4>(x, dl, base0, W, M, H, prepared, fd, dparts, dstride, dsm);
    else
        fb_conv_prepare_body<1>(x, dl, base0, W, M, H, prepared, fd, dparts, dstride, dsm);
}

// act [M, I] = BF16(SiLU(gate) * up), SiLU(g) = g / (1 + exp(-g)) (reference/norms.py), from the
// fused GEMM output gu [M, 2I] (gate columns first). Grid (column blocks, M): row r = blockIdx.y;
// four columns per thread with 16-byte loads when I % 4 == 0 (the same per-element arithmetic).
extern "C" __global__ void fb_silu_mul(const float* __restrict__ gu, int M, int I, u16* __restrict__ act) {
    dfl::pdl_trigger();  // the kernel after this one may launch (it waits for this grid before reading)
    dfl::pdl_wait_for(gu);  // kernels_cu/pdl.py: launched under PDL, nothing is read before this
    const int r = blockIdx.y;
    if (r >= M) return;
    const float* gr = gu + (long long)r * 2 * I;
    u16* ar = act + (long long)r * I;
    const int step = gridDim.x * blockDim.x;
    if ((I & 3) == 0) {
        for (int j = 4 * (blockIdx.x * blockDim.x + threadIdx.x); j < I; j += 4 * step) {
            const float4 g = *reinterpret_cast<const float4*>(gr + j);
            const float4 u = *reinterpret_cast<const float4*>(gr + I + j);
            ushort4 o;
            o.x = dfl::silu_mul_bf16(g.x, u.x);
            o.y = dfl::silu_mul_bf16(g.y, u.y);
            o.z = dfl::silu_mul_bf16(g.z, u.z);
            o.w = dfl::silu_mul_bf16(g.w, u.w);
            *reinterpret_cast<ushort4*>(ar + j) = o;
        }
        return;
    }
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < I; j += step) {
        ar[j] = dfl::silu_mul_bf16(gr[j], gr[I + j]);
    }
}
