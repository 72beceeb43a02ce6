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
