// The fused head's tensor maps into device memory from kernel parameters (kernels_cu/fast/head.py device_maps).
//
// fast/head.cu reads its two 128-byte CUtensorMaps (x and w, encoded on the host by cuTensorMapEncodeTiled) from
// global memory, followed by the shared-threshold words its blocks meet in (zero at every launch). Copying those
// 256 bytes from the host is a host-to-device copy: under a CUDA graph capture it would replay whatever the staging
// buffer holds by then, and a copy from pageable memory orders the host after the stream. Passed as this kernel's
// parameters instead, the words travel inside the launch (a captured kernel node keeps its parameters by value), so
// the maps can be made in any stream, captured or not, with no host copy and no host wait.

typedef unsigned long long u64;

#define FM_WORDS 32  // head.py MAP_WORDS: the two maps as u64

struct FmMaps {
    u64 w[FM_WORDS];
};

// dst[0 .. 32): the maps; dst[32 .. 32 + zero_words): 0 (the thresholds and the done-count, head.py MAPS_WORDS)
extern "C" __global__ void fh_put_maps(u64* __restrict__ dst, int zero_words, FmMaps maps) {
    for (int i = threadIdx.x; i < FM_WORDS + zero_words; i += blockDim.x)
        dst[i] = i < FM_WORDS ? maps.w[i] : 0ull;
}
