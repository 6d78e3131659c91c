// The first stage of every cross_entropy forward, launched before the row
// kernels: one block counts the rows whose target is a class (n_valid) and the
// targets outside [0, C) that are not ignore_index. The mean and the fused
// gradient read n_valid on the device; the host never waits for either count.
#include "common/reduce.cuh"
#include "cross_entropy/cross_entropy.cuh"
#include "cross_entropy/launchers.h"

constexpr int COUNT_THREADS = 1024;

__global__ void __launch_bounds__(COUNT_THREADS)
cross_entropy_count_targets_kernel(const int64_t* __restrict__ targets,  // (N,)
                                   int64_t* __restrict__ counts,         // (2,) valid, out of range
                                   int64_t N, int64_t C) {
    int64_t valid = 0, out_of_range = 0;
    // Branch-free body, unrolled so that each thread has 8 loads in flight: one
    // block has few threads to hide the latency of N scattered reads with.
#pragma unroll 8
    for (int64_t i = threadIdx.x; i < N; i += COUNT_THREADS) {
        const int64_t target = targets[i];
        valid += target_in_range(target, C);
        out_of_range += !target_in_range(target, C) && target != IGNORE_INDEX;
    }
    valid = block_reduce_sum(valid);
    out_of_range = block_reduce_sum(out_of_range);
    if (threadIdx.x == 0) {
        counts[0] = valid;
        counts[1] = out_of_range;
    }
}

cudaError_t cross_entropy_count_targets(const int64_t* targets, int64_t* counts, int64_t N, int64_t C,
                                        cudaStream_t stream) {
    cross_entropy_count_targets_kernel<<<1, COUNT_THREADS, 0, stream>>>(targets, counts, N, C);
    return cudaGetLastError();
}
