// Philox4x32-10 and the keyed draws of CONTRACTS C3, bit-identical to reference/rng.py.
//
// Everything here is __host__ __device__ so a host build can check it against the
// reference without a GPU. Only 32-bit integer arithmetic decides bits, so FMA
// contraction and -ftz cannot change them; the one float step (word -> U) is an
// exact conversion of a 24-bit integer times a power of two.
//
// No standard headers: NVRTC compiles this without a host include path.
#pragma once

#ifndef DFLASH_HD
#define DFLASH_HD __host__ __device__ __forceinline__
#endif

namespace dflash {

typedef unsigned int u32;
typedef unsigned long long u64;

// Purposes (C3). The batch row is never part of a key or a counter.
enum Purpose : u32 { DFLASH2_PROPOSAL = 1, ACCEPT = 2, CORRECTION = 3, BONUS = 4 };

struct Words {
    u32 x0, x1, x2, x3;
};

DFLASH_HD u32 mulhi32(u32 a, u32 b) {
#ifdef __CUDA_ARCH__
    return __umulhi(a, b);
#else
    return (u32)(((u64)a * (u64)b) >> 32);
#endif
}

// Random123 philox4x32_R with R = 10: the key is bumped before every round but the first.
DFLASH_HD Words philox4x32_10(Words c, u32 k0, u32 k1) {
    const u32 M0 = 0xD2511F53u, M1 = 0xCD9E8D57u;
    const u32 W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
#pragma unroll
    for (int r = 0; r < 10; ++r) {
        if (r) {
            k0 += W0;
            k1 += W1;
        }
        const u32 hi0 = mulhi32(M0, c.x0), lo0 = M0 * c.x0;
        const u32 hi1 = mulhi32(M1, c.x2), lo1 = M1 * c.x2;
        Words n;
        n.x0 = hi1 ^ c.x1 ^ k0;
        n.x1 = lo1;
        n.x2 = hi0 ^ c.x3 ^ k1;
        n.x3 = lo0;
        c = n;
    }
    return c;
}

// key = (seed lo, seed hi); counter = (position lo, position hi, purpose, index).
DFLASH_HD Words keyed_words(u64 seed, u64 position, u32 purpose, u32 index) {
    Words c;
    c.x0 = (u32)(position & 0xffffffffull);
    c.x1 = (u32)(position >> 32);
    c.x2 = purpose;
    c.x3 = index;
    return philox4x32_10(c, (u32)(seed & 0xffffffffull), (u32)(seed >> 32));
}

// U = ((x0 >> 8) | 1) * 2^-24: the 24-bit integer converts exactly and the scale is a
// power of two, so the result is exact in float (and in double); never 0, never 1.
DFLASH_HD float word_to_uniform(u32 x0) { return (float)((x0 >> 8) | 1u) * 5.9604644775390625e-08f; }

DFLASH_HD float keyed_uniform(u64 seed, u64 position, u32 purpose, u32 index) {
    return word_to_uniform(keyed_words(seed, position, purpose, index).x0);
}

// Float <-> double without flushing. Under -ftz=true nvcc emits cvt.ftz for (double)f
// and (float)d, which would zero subnormal fp32 probabilities on the way into the race
// or out of a softmax; the reference keeps them. Plain cvt never flushes.
DFLASH_HD double f32_to_f64(float x) {
#ifdef __CUDA_ARCH__
    double r;
    asm("cvt.f64.f32 %0, %1;" : "=d"(r) : "f"(x));
    return r;
#else
    return (double)x;
#endif
}

DFLASH_HD float f64_to_f32_rn(double x) {
#ifdef __CUDA_ARCH__
    float r;
    asm("cvt.rn.f32.f64 %0, %1;" : "=f"(r) : "d"(x));
    return r;
#else
    return (float)x;
#endif
}

// Exponential race (C3): the winner maximises r(v) / E_v, E_v = -ln U_v, over r(v) > 0.
// Scored as log r - log(-log U) (same order, no overflow) in double so the race itself
// adds nothing measurable to the error of the weights it is given; the reference
// computes the same expression in float64.
struct RaceEntry {
    double score;
    int index;  // RACE_NONE: no contender yet
};

#define DFLASH_RACE_NONE 0x7fffffff

DFLASH_HD RaceEntry race_empty() {
    RaceEntry e;
    e.score = 0.0;
    e.index = DFLASH_RACE_NONE;
    return e;
}

DFLASH_HD double race_score(double weight, float u) { return log(weight) - log(-log(f32_to_f64(u))); }

// The explicit order: a real contender beats none; a higher score wins; equal scores go
// to the lower index. The score comparison only runs between two real contenders, whose
// scores are finite (weight > 0 finite, 0 < U < 1), so no NaN can reach it.
DFLASH_HD bool race_better(const RaceEntry& a, const RaceEntry& b) {
    if (a.index == DFLASH_RACE_NONE) return false;
    if (b.index == DFLASH_RACE_NONE) return true;
    if (a.score != b.score) return a.score > b.score;
    return a.index < b.index;
}

#ifdef __CUDACC__
// The warp's best entry by race_better, in every lane (a butterfly over the 32 lanes).
__device__ __forceinline__ RaceEntry warp_race(RaceEntry e) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        RaceEntry t;
        t.score = __shfl_xor_sync(0xffffffffu, e.score, o);
        t.index = __shfl_xor_sync(0xffffffffu, e.index, o);
        if (race_better(t, e)) e = t;
    }
    return e;
}
#endif

DFLASH_HD void race_offer(RaceEntry& best, double weight, u64 seed, u64 position, u32 purpose, int index) {
    if (!(weight > 0.0)) return;
    RaceEntry e;
    e.score = race_score(weight, keyed_uniform(seed, position, purpose, (u32)index));
    e.index = index;
    if (race_better(e, best)) best = e;
}

}  // namespace dflash
