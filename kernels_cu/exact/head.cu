// DFlash proposal head argmax (reference/proposal_head.py; CONTRACTS C4 ties).
// logits [rows, Vr] come from an fp32 cuBLAS GEMM. Head row r has global id r (full
// head) or shortlist[r] (indexed head); rows whose id >= vocab_size are never chosen.
// The winner is the largest logit, the lowest row among equal maxima, then remapped.
// One block per row: strided scan then a fixed-order tree, so the choice is
// deterministic and independent of thread timing.
#include "common.cuh"

#define HEAD_THREADS 256

__device__ __forceinline__ bool head_better(float v, int r, float bv, int br) {
    return v > bv || (v == bv && r < br);
}

extern "C" __global__ void __launch_bounds__(HEAD_THREADS)
argmax_rows(const float* __restrict__ logits, int rows, int Vr, const int* __restrict__ shortlist,
            long long vocab_size, int* __restrict__ tokens) {
    __shared__ float sv[HEAD_THREADS];
    __shared__ int sr[HEAD_THREADS];
    const int row = blockIdx.x;
    if (row >= rows) return;
    const float* z = logits + (long long)row * Vr;
    float bv = dfl::neg_inf();
    int br = 0x7fffffff;
    for (int r = threadIdx.x; r < Vr; r += HEAD_THREADS) {
        const long long id = shortlist ? (long long)shortlist[r] : (long long)r;
        if (id < vocab_size && head_better(z[r], r, bv, br)) {
            bv = z[r];
            br = r;
        }
    }
    sv[threadIdx.x] = bv;
    sr[threadIdx.x] = br;
    __syncthreads();
    for (int s = HEAD_THREADS / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s && head_better(sv[threadIdx.x + s], sr[threadIdx.x + s], sv[threadIdx.x], sr[threadIdx.x])) {
            sv[threadIdx.x] = sv[threadIdx.x + s];
            sr[threadIdx.x] = sr[threadIdx.x + s];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        const int r = sr[0];
        tokens[row] = r == 0x7fffffff ? -1 : (shortlist ? shortlist[r] : r);
    }
}
