// The C4 total order of the exact selection kernels (exact/select.cu, exact/accept.cu) and the fast
// target_distribution (fast/target_distribution.cu), in one place so that they order candidates by the same bits.
#pragma once
#include "philox.cuh"

namespace okey {

using dflash::u32;
using dflash::u64;

// Total order used for top-k (C4): value descending, then the lower id first. The float is mapped to an
// unsigned key that orders like the value; -0 is folded onto +0 first because C4 compares values and -0 == +0 is a
// tie the id must decide. The low word holds ~id, so a larger key is a better candidate and all keys are distinct.
__device__ __forceinline__ u64 order_key(float z, int v) {
    if (z == 0.0f) z = 0.0f;
    const u32 b = __float_as_uint(z);
    const u32 ord = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    return ((u64)ord << 32) | (u64)(0xffffffffu - (u32)v);
}

// The id (row / column) a key was made from.
__device__ __forceinline__ int key_id(u64 key) { return (int)(0xffffffffu - (u32)(key & 0xffffffffull)); }

}  // namespace okey
