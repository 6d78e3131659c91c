// Grid sizes taken from the GPU at hand, for launches whose blocks take their work in turn (a
// grid-stride loop, rows in turn): as many blocks as it holds at once is one wave and no tail.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

// The current device's streaming multiprocessors (132 on an H100 SXM and on an H200).
inline int sm_count() {
    int device = 0, sms = 1;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    return sms;
}

// Blocks of Kernel at THREADS threads a block (no dynamic shared memory) the current device holds
// at once: its occupancy (asked once a process) times its SMs.
template <auto Kernel, int THREADS>
int64_t resident_blocks() {
    static const int per_sm = [] {
        int count = 1;
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&count, Kernel, THREADS, 0);
        return count < 1 ? 1 : count;
    }();
    return int64_t(per_sm) * sm_count();
}

// A grid-stride launch over n elements at work_per_block each: as many blocks as the work needs, at
// most blocks_per_sm an SM (one wave) and at most max_blocks (the partials' buffer), at least one.
inline int64_t one_wave_blocks(int64_t work_per_block, int64_t n, int blocks_per_sm, int64_t max_blocks) {
    const int64_t wanted = (n + work_per_block - 1) / work_per_block;
    const int64_t wave = int64_t(sm_count()) * blocks_per_sm;
    const int64_t blocks = wanted < wave ? wanted : wave;
    return blocks < 1 ? 1 : blocks < max_blocks ? blocks : max_blocks;
}
