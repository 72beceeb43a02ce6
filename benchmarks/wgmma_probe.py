"""Can this toolchain drive Hopper's wgmma, and how much faster than mma.sync is it on the H200? (probe,
issue 12, session v12: the 35B B8 attention and layer GEMMs, and candidate_topk's fused head, would all
need it; their mma.sync kernels are bound inside the multiprocessor, docs/PERFORMANCE.md "Session v12").

The source below is compiled by NVRTC for sm_90a (wgmma exists only there, not in plain sm_90, so it
cannot live in kernels_cu/, whose every .cu CI builds for sm_90; tests/test_nvcc_compile.py builds this
one with nvcc for sm_90a).

- ``wg_tile``: one warpgroup, D [64, 64] fp32 = A [64, 16] @ B [64, 16]^T (BF16, both K-major, read from
  shared memory through matrix descriptors, no swizzle: 8 x 8 core matrices of 128 contiguous bytes, the
  two K halves of an 8-row group 128 bytes apart, 8-row groups 256 bytes apart). The descriptor's two
  byte offsets are given both ways (``lbo``/``sbo`` = 128/256 and 256/128); which one reproduces the
  float64 product says how the leading / stride offsets are read for this layout.
- ``wg_rate`` / ``mma_rate``: every warp repeats an m64n64k16 wgmma (a warpgroup) or m16n8k16 mma.sync
  on operands already on chip, ``iters`` times, in a grid of ``blocks`` x 2 warpgroups; TFLOP/s from
  CUDA events (no memory traffic in the loop: the tensor pipes' rate as each instruction form feeds it).

    python -m benchmarks.wgmma_probe [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

SRC = r"""
typedef unsigned short u16;
typedef unsigned long long u64;

__device__ __forceinline__ unsigned smem_u32(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
// wgmma matrix descriptor: start address, leading and stride byte offsets (each >> 4), no swizzle
__device__ __forceinline__ u64 desc(const void* p, unsigned lbo, unsigned sbo) {
    return (u64)((smem_u32(p) & 0x3FFFF) >> 4) | ((u64)(lbo >> 4) << 16) | ((u64)(sbo >> 4) << 32);
}
// element (r, k) of a [rows, 16] K-major tile in the no-swizzle core-matrix layout
__device__ __forceinline__ int core_idx(int r, int k) { return ((r >> 3) * 2 + (k >> 3)) * 64 + (r & 7) * 8 + (k & 7); }

#define WG_D32(d) "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
    "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),           \
    "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),         \
    "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])

// D (64 x 64 fp32, the warpgroup's 32 registers a thread) (+)= A (64 x 16) . B (64 x 16)^T; accumulate 0: D = A B^T
__device__ __forceinline__ void wgmma_64x64x16(float (&d)[32], u64 da, u64 db, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "%32, %33, p, 1, 1, 0, 0;\n}\n"
        : WG_D32(d)
        : "l"(da), "l"(db), "r"(accumulate));
}

extern "C" __global__ void wg_tile(const u16* A, const u16* B, float* D, unsigned lbo, unsigned sbo) {
    __shared__ __align__(128) u16 sA[64 * 16];
    __shared__ __align__(128) u16 sB[64 * 16];
    for (int i = threadIdx.x; i < 64 * 16; i += blockDim.x) {
        sA[core_idx(i >> 4, i & 15)] = A[i];
        sB[core_idx(i >> 4, i & 15)] = B[i];
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // generic-proxy stores, seen by wgmma
    __syncthreads();
    float d[32];
    for (int i = 0; i < 32; ++i) d[i] = 0.f;
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
    wgmma_64x64x16(d, desc(sA, lbo, sbo), desc(sB, lbo, sbo), 0);
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    // accumulator layout: warp w holds rows 16w .. 16w + 15; d[4i + e]: row g (+ 8 for e >= 2), column 8i + 2t + e % 2
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    for (int i = 0; i < 8; ++i)
        for (int e = 0; e < 4; ++e) D[(16 * w + g + 8 * (e >> 1)) * 64 + 8 * i + 2 * t + (e & 1)] = d[4 * i + e];
}

// iters (a multiple of 8) wgmma per warpgroup on the same shared operands, accumulating; out keeps the work
extern "C" __global__ void wg_rate(int iters, float* out) {
    __shared__ __align__(128) u16 sA[2][64 * 16];
    __shared__ __align__(128) u16 sB[64 * 16];
    for (int i = threadIdx.x; i < 64 * 16; i += blockDim.x) sA[0][i] = sA[1][i] = sB[i] = (u16)0x3c00u;  // 1/128
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    const int wg = threadIdx.x >> 7;
    float d[32];
    for (int i = 0; i < 32; ++i) d[i] = 0.f;
    const u64 da = desc(sA[wg], 128, 256), db = desc(sB, 128, 256);
    // the accumulators' last ordinary writes pinned before the fence, and 8 wgmma a loop step: without both,
    // ptxas serializes the chain (C7515, a DEPBAR after every wgmma) and the rate would be the latency
    for (int i = 0; i < 32; ++i) asm volatile("" : "+f"(d[i])::"memory");
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll 1
    for (int it = 0; it < iters; it += 8) {
#pragma unroll
        for (int u = 0; u < 8; ++u) wgmma_64x64x16(d, da, db, 1);
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    float s = 0.f;
    for (int i = 0; i < 32; ++i) s += d[i];
    if (s == 12345.f) out[threadIdx.x] = s;
}

// the same work as m16n8k16 mma.sync (4 warps of a warpgroup: 64 x 64 x 16 = 32 mma a warp), fragments in registers
extern "C" __global__ void mma_rate(int iters, float* out) {
    float c[8][4];  // per warp: its 16 rows x 64 columns
    for (int b = 0; b < 8; ++b) c[b][0] = c[b][1] = c[b][2] = c[b][3] = 0.f;
    const unsigned one = 0x3c003c00u;
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int n = 0; n < 8; ++n) {
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%4,%4,%4}, {%4,%4}, "
                         "{%0,%1,%2,%3};\n"
                         : "+f"(c[n][0]), "+f"(c[n][1]), "+f"(c[n][2]), "+f"(c[n][3])
                         : "r"(one));
        }
    }
    float s = 0.f;
    for (int n = 0; n < 8; ++n) s += c[n][0] + c[n][1] + c[n][2] + c[n][3];
    if (s == 12345.f) out[threadIdx.x] = s;
}
"""
# mma_rate's loop issues 8 m16n8k16 a warp an iteration (64 x 64 x 16 / 4 warps = 16 x 64 x 16 a warp: 8 of them);
# flop per iteration and warpgroup: 64 * 64 * 16 * 2 for both kernels.
FLOP_PER_ITER_WG = 64 * 64 * 16 * 2


def nvrtc_module(src: str, arch: str = "sm_90a"):
    """The source compiled by NVRTC for ``arch`` (CuPy's RawModule picks plain sm_90 itself)."""
    from kernels_cu.loader import nvrtc_arch_module

    return nvrtc_arch_module(src, "wgmma_probe.cu", [f"--gpu-architecture={arch}", "-std=c++17"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--iters", type=int, default=4096, help="a multiple of 8")
    args = ap.parse_args(argv)
    import cupy as cp

    report: dict = {"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
                    "sms": cp.cuda.Device().attributes["MultiProcessorCount"]}
    mod = nvrtc_module(SRC)
    rng = np.random.default_rng(0)
    a = (rng.standard_normal((64, 16)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    b = (rng.standard_normal((64, 16)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    af, bf = ((t.astype(np.uint32) << 16).view(np.float32).astype(np.float64) for t in (a, b))
    exact = af @ bf.T
    # FP32 summation of 16 exact BF16 products, in any order: |error| <= gamma_15 sum |a_k b_k| (Higham 3.1)
    u = 2.0**-24
    bound = 15 * u / (1 - 15 * u) * (np.abs(af) @ np.abs(bf).T)
    tile = {}
    for lbo, sbo in ((128, 256), (256, 128)):
        d = cp.full((64, 64), np.nan, np.float32)
        mod.get_function("wg_tile")((1,), (128,), (cp.asarray(a), cp.asarray(b), d, np.uint32(lbo), np.uint32(sbo)))
        got = cp.asnumpy(d).astype(np.float64)
        err = float(np.nanmax(np.abs(got - exact))) if np.isfinite(got).any() else float("nan")
        within = bool(np.isfinite(got).all() and (np.abs(got - exact) <= bound).all())
        tile[f"lbo{lbo}_sbo{sbo}"] = {"max_abs_err": err, "matches": within}
    report["tile"] = tile
    out = cp.zeros(1024, np.float32)
    blocks = 2 * report["sms"]
    rates = {}
    for name in ("wg_rate", "mma_rate"):
        fn = mod.get_function(name)
        fn((blocks,), (256,), (np.int32(16), out))  # warm-up
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn((blocks,), (256,), (np.int32(args.iters), out))
        stop.record()
        stop.synchronize()
        ms = cp.cuda.get_elapsed_time(start, stop)
        flop = blocks * 2 * args.iters * FLOP_PER_ITER_WG  # 2 warpgroups a block
        rates[name] = {"ms": ms, "TFLOPs": flop / ms / 1e9}
    report["rates"] = rates
    report["wgmma_over_mma_sync"] = rates["wg_rate"]["TFLOPs"] / rates["mma_rate"]["TFLOPs"]
    print(json.dumps(report, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
