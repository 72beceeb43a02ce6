// Helpers shared by the exact selection kernels (select.cu) and the fast selector
// (fast/selector.cu): BF16 bits to fp32, one RNE rounding of a double to BF16 bits, the fixed
// warp butterfly sum. Included after philox.cuh's types (dflash::u32, dflash::f64_to_f32_rn).
#pragma once
#include "philox.cuh"

namespace selc {

typedef unsigned short u16;

__device__ __forceinline__ float bf16_value(u16 b) { return __uint_as_float(((dflash::u32)b) << 16); }

// RNE double -> BF16 in one step (no detour through fp32, which would round twice):
// scale by the BF16 spacing at |x| (a power of two, so exact), rint (ties to even),
// scale back; below 2^-126 the spacing stays 2^-133 (subnormals kept); past the largest
// finite BF16 the result is inf. The rounded value is a BF16 value, so its fp32 image is
// exact and its top 16 bits are the pattern.
__device__ __forceinline__ u16 bf16_round_bits_f64(double x) {
    if (isnan(x)) return 0x7fc0;
    if (isinf(x)) return x > 0 ? 0x7f80 : 0xff80;
    int e;
    frexp(x, &e);  // |x| in [2^(e-1), 2^e)
    const int qe = e - 8 > -133 ? e - 8 : -133;
    double y = ldexp(rint(ldexp(x, -qe)), qe);
    if (fabs(y) > 3.3895313892515355e38) y = x > 0 ? 1.0 / 0.0 : -1.0 / 0.0;
    return (u16)(__float_as_uint(dflash::f64_to_f32_rn(y)) >> 16);
}

// Fixed butterfly: every lane ends with the same, run-to-run identical sum.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

}  // namespace selc
