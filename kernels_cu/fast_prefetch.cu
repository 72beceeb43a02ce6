// Issue 12, H200 probe (benchmarks/l2_prefetch_probe.py): can a GEMM's BF16 weight be pulled into
// L2 on a side stream while the round runs latency-bound kernels that leave DRAM idle, so that the
// cuBLAS GEMM which follows reads it from L2? Two kernels, nothing in the round calls them yet:
//
//   l2_prefetch  hands [p, p + bytes) to the TMA unit as bulk L2 prefetches of `chunk` bytes each
//                (cp.async.bulk.prefetch.L2, sm_90): one instruction a chunk, a grid-stride loop
//                over the chunks, nothing written, nothing waited for (a prefetch is a hint). With
//                evict_last != 0 the lines carry an L2::evict_last policy (createpolicy.fractional,
//                fraction 1.0). `chunk` is a multiple of 16 and p 16-byte aligned (the host checks;
//                CuPy allocations are 256-byte aligned); the last chunk is cut down to a multiple
//                of 16 bytes, so up to 15 trailing bytes are not prefetched. One instruction takes
//                at most 65535 * 16 = 1048560 bytes: ptxas (CUDA 13, sm_90) keeps size / 16 in a
//                16-bit field (SHF.R 4 then PRMT 0x5410 before UBLKPF.L2), so a 1 MiB chunk would
//                become 0 bytes; the probe keeps `chunk` at or below that. Below sm_90 (an NVRTC
//                build on an A100) it falls back to one prefetch.global.L2 per 128-byte line.
//   spin_ns      stands in for the round's attention and glue kernels: each block's thread 0
//                waits until `ns` nanoseconds of %globaltimer have passed since it started, then
//                the block syncs and exits. No memory traffic.
#include "common.cuh"

extern "C" __global__ void l2_prefetch(const char* p, unsigned long long bytes, unsigned chunk, int evict_last) {
    if (chunk < 16u) return;
    const unsigned long long nchunks = (bytes + chunk - 1) / chunk;
    const unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    unsigned long long policy = 0;
    if (evict_last) asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
#endif
    for (unsigned long long c = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; c < nchunks; c += step) {
        const unsigned long long off = c * chunk;
        const unsigned long long left = bytes - off;
        const unsigned size = (unsigned)((left < chunk ? left : (unsigned long long)chunk) & ~15ull);
        if (size == 0) continue;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
        unsigned long long g;  // the .global address of p + off
        asm("cvta.to.global.u64 %0, %1;" : "=l"(g) : "l"(p + off));
#endif
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        if (evict_last)
            asm volatile("cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, %2;" ::"l"(g), "r"(size),
                         "l"(policy)
                         : "memory");
        else
            asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(g), "r"(size) : "memory");
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
        for (unsigned o = 0; o < size; o += 128u) {
            if (evict_last)
                asm volatile("prefetch.global.L2::evict_last [%0];" ::"l"(g + o) : "memory");
            else
                asm volatile("prefetch.global.L2 [%0];" ::"l"(g + o) : "memory");
        }
#endif
    }
}

extern "C" __global__ void spin_ns(unsigned long long ns) {
    if (threadIdx.x == 0) {
        unsigned long long t0, t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
        do {
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        } while (t - t0 < ns);
    }
    __syncthreads();
}

// ring_prefetch (session v22, fast_attention.ring_prefetch): the context tiles the attention kernel
// (fast_attention.cu attn_body) will read first, asked into L2 by bulk prefetches some kernels ahead of it,
// while the block's glue and GEMMs leave DRAM part idle. It follows attn_body's split exactly: n_ctx =
// min(F, C, S - 1), slot0 = (F - n_ctx) mod C, T = ceil(n_ctx / 64) tiles, split s takes tiles
// [T s / ns, T (s + 1) / ns); this kernel asks for tiles first .. first + tiles - 1 of each split (those
// inside it), key rows kk < n_ctx, of both rings. A key row (slot) is Hk * D 16-bit values, contiguous in
// [B, C, Hk, D]; a tile's rows are contiguous unless they wrap past slot C - 1 (two pieces then).
// One thread a (tile, ring); grid (ceil(2 * tiles / blockDim.x), ns, B). A prefetch is a hint: nothing is
// written, so no result can depend on it. It reads only frontier (written by no kernel of the block).
// Under PDL (kernels_cu/pdl.py) it triggers at once and waits for the kernel ahead only at its end, so that
// the kernel after it, whose wait covers this grid's completion, still covers every kernel before.
extern "C" __global__ void ring_prefetch(const char* kc, const char* vc, const long long* frontier, long long C,
                                         unsigned row_bytes, long long window, int ns, int first, int tiles) {
    dfl::pdl_trigger();
    const int b = blockIdx.z, split = blockIdx.y;
    const int job = blockIdx.x * blockDim.x + threadIdx.x;
    if (job < 2 * tiles) {
        const int t_rel = job >> 1;
        const char* ring = (job & 1) ? vc : kc;
        const long long F = frontier[b];
        long long nc = F < C ? F : C;
        if (nc < 0) nc = 0;
        if (window > 0 && nc > window - 1) nc = window - 1;
        const long long T = (nc + 63) / 64;
        const long long t_lo = T * split / ns, t_hi = T * (split + 1) / ns;
        const long long t = t_lo + first + t_rel;
        if (t < t_hi) {
            const long long slot0 = nc > 0 ? (F - nc) % C : 0;
            long long kk = t * 64, kend = kk + 64 < nc ? kk + 64 : nc;
            const unsigned long long max_piece = 65535ull * 16ull / row_bytes;  // rows a prefetch may take
            while (kk < kend) {
                long long slot = slot0 + kk;
                if (slot >= C) slot -= C;
                long long rows = kend - kk;
                if (rows > C - slot) rows = C - slot;  // up to the ring's end
                if ((unsigned long long)rows > max_piece) rows = (long long)max_piece;
                if (rows < 1) break;  // a row wider than one prefetch: not asked for
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
                unsigned long long g;
                asm("cvta.to.global.u64 %0, %1;" : "=l"(g) : "l"(ring + ((long long)b * C + slot) * row_bytes));
                asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(g), "r"((unsigned)(rows * row_bytes))
                             : "memory");
#endif
                kk += rows;
            }
        }
    }
    dfl::pdl_wait();
}
