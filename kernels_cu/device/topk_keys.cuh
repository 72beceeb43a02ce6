// The C4 order key of the fast top-k and the helpers that read it, shared by fast/topk.cu (top-k over
// materialized logits) and fast/head.cu (the head GEMM with the top-k in its epilogue), so both order
// candidates by the same bits.
#pragma once
#include "philox.cuh"

using dflash::u32;
using dflash::u64;

// Distinct 64-bit key: ordered float in the high word (-0 folded onto +0), ~row in the low
// word, so a larger key is a better candidate. Key 0 is never a real key. A NaN logit ranks
// after every number, -inf included (docs/contracts.md, C4): ordered word 1, below -inf's.
__device__ __forceinline__ u64 fk_key(float z, int row) {
    if (z == 0.0f) z = 0.0f;
    const u32 b = __float_as_uint(z);
    const u32 ord = (z != z) ? 1u : ((b & 0x80000000u) ? ~b : (b | 0x80000000u));
    return ((u64)ord << 32) | (u64)(0xffffffffu - (u32)row);
}

__device__ __forceinline__ int fk_row(u64 key) { return (int)(0xffffffffu - (u32)(key & 0xffffffffull)); }

// The float a key orders by (KeyFilter's threshold value): its ordered word mapped back through
// fk_key's map. Key 0 (a list not yet full) gives -inf and a NaN key NaN; KeyFilter passes every key
// in both cases, so only a real number's key needs the value.
__device__ __forceinline__ float key_float(u64 key) {
    if (key == 0ull) return __int_as_float(0xff800000);
    const u32 ord = (u32)(key >> 32);
    if (ord == 1u) return __int_as_float(0x7fc00000);
    return __uint_as_float((ord & 0x80000000u) ? (ord & 0x7fffffffu) : ~ord);
}

// `key(z, v) > thr` on the float and the column, without forming the key: ord(z) > ord(thr) is z > f
// and ord(z) == ord(thr) is z == f (f the threshold's float; -0 == +0 as the key folds them; a NaN z
// fails both, its key being below every number's), then the lower column wins the tie. Every key
// passes while the list is empty (thr 0) and when the threshold is a NaN key (float compares cannot
// order NaNs by column; the whole key decides later).
struct KeyFilter {
    float f;
    u32 row;
    bool all;
    __device__ __forceinline__ explicit KeyFilter(u64 thr)
        : f(key_float(thr)), row(0xffffffffu - (u32)(thr & 0xffffffffull)), all(thr == 0ull || (thr >> 32) == 1ull) {}
    // bitwise, not short-circuit: predicates, no branch per column
    __device__ __forceinline__ bool passes(float z, int v) const { return all | (z > f) | ((z == f) & ((u32)v < row)); }
};

// The warp's 32 keys (one per lane; u64 keys, or u32 ordered words) sorted descending across the lanes
// (lane 0 the largest): a bitonic network, blocks of `size` lanes sorted descending where
// (lane & size) == 0, ascending elsewhere, so the last stage (size 32) leaves one descending run.
template <typename T>
__device__ __forceinline__ T warp_sort_desc(T x, int lane) {
#pragma unroll
    for (int size = 2; size <= 32; size <<= 1) {
#pragma unroll
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            const T y = __shfl_xor_sync(0xffffffffu, x, stride);
            const bool keep_max = ((lane & stride) == 0) == ((lane & size) == 0);
            x = keep_max ? (x > y ? x : y) : (x < y ? x : y);
        }
    }
    return x;
}
