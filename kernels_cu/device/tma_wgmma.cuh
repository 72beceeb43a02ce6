// The tensor-copy and wgmma helpers of the sm_90a kernels (fast/head.cu, fast_wgemm.cu): shared-memory
// addresses, the 128-byte-swizzle K-major descriptor, mbarrier waits, one 2-D tensor copy. Include inside an
// __CUDA_ARCH_FEAT_SM90_ALL guard (wgmma and the tensor copies exist on sm_90a only).
#pragma once
#include "philox.cuh"

using dflash::u64;

__device__ __forceinline__ unsigned ht_smem_u32(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// K-major descriptor of a 128-byte-swizzled tile (what the tensor copies write): start address >> 4, leading offset
// unused for this layout (1), stride offset 1024 B (the next 8 rows) >> 4, layout type 1 (128-byte swizzle) in
// bits 62-63. The k16 slices of a 64-wide K stage start 32 bytes apart.
__device__ __forceinline__ u64 ht_desc(unsigned addr) {
    return (u64)((addr & 0x3FFFF) >> 4) | (1ull << 16) | ((u64)(1024 >> 4) << 32) | (1ull << 62);
}

__device__ __forceinline__ void ht_bar_wait(unsigned bar, unsigned parity) {
    asm volatile(
        "{\n.reg .pred p;\nHT_WAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
        "@!p bra HT_WAIT;\n}\n" ::"r"(bar), "r"(parity)
        : "memory");
}

// One tensor copy: the box at (k0, row) of the map (K innermost) into shared memory at dst, counted on bar.
__device__ __forceinline__ void ht_tma(unsigned dst, const u64* map, int k0, int row, unsigned bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
        ::"r"(dst), "l"(map), "r"(k0), "r"(row), "r"(bar)
        : "memory");
}

// One thread of the block: each stage's full barrier (one arrival: the issuing thread's expect_tx) and empty barrier
// (`consumers` arrivals: every thread that reads the stage), then the fences that make them visible to the tensor
// copies. The block synchronises before any other thread uses them.
__device__ __forceinline__ void ht_init_stage_bars(unsigned full0, unsigned empty0, int stages, unsigned consumers) {
    for (int st = 0; st < stages; ++st) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(full0 + 8 * st) : "memory");
        asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(empty0 + 8 * st), "r"(consumers) : "memory");
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
