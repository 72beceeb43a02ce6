// feature_capture's gather in the fast mode (kernels_cu/fast/capture.py): the chosen target
// blocks' BF16 rows concatenated per row, out[t, j * Ht + c] = blocks[ids[j], t, c], as raw
// bits (a copy: the values are exact). 16-byte loads and stores when Ht % 8 == 0 (every official
// width) and the blocks are 16-byte aligned, a 2-byte path otherwise. ids is a small device
// array the caller keeps (no copy per call).
#include "common.cuh"

using dfl::u16;

extern "C" __global__ void fc_gather_bits(const u16* __restrict__ blocks, const int* __restrict__ ids, int nids,
                                          long long T, int Ht, int vec, u16* __restrict__ out) {
    const long long step = (long long)gridDim.x * blockDim.x;
    const long long row = (long long)nids * Ht;  // elements per output row
    if (vec) {  // Ht % 8 == 0 and blocks 16-byte aligned (the caller checks)
        const int v = Ht >> 3;  // 16-byte vectors per block row
        const long long nv = T * nids * v;
        const uint4* src = reinterpret_cast<const uint4*>(blocks);
        uint4* dst = reinterpret_cast<uint4*>(out);
        for (long long q = blockIdx.x * (long long)blockDim.x + threadIdx.x; q < nv; q += step) {
            const long long t = q / ((long long)nids * v);
            const long long rem = q - t * nids * v;
            const int j = (int)(rem / v), c = (int)(rem - (long long)j * v);
            dst[q] = src[((long long)ids[j] * T + t) * v + c];
        }
    } else {
        const long long n = T * row;
        for (long long q = blockIdx.x * (long long)blockDim.x + threadIdx.x; q < n; q += step) {
            const long long t = q / row;
            const long long rem = q - t * row;
            const int j = (int)(rem / Ht), c = (int)(rem - (long long)j * Ht);
            out[q] = blocks[((long long)ids[j] * T + t) * Ht + c];
        }
    }
}
