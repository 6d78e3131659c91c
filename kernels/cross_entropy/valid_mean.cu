// The teaching rungs' second kernel: one block counts the targets (n_valid, and
// those outside [0, C) that are not ignore_index) and adds the per-row losses in
// a fixed order (common/last_block.cuh's sum_in_order: bitwise reproducible, no
// float atomicAdd), then writes the counts for the backward and the mean.
#include "common/last_block.cuh"
#include "common/reduce.cuh"
#include "cross_entropy/launchers.h"
#include "cross_entropy/valid_mean.cuh"

constexpr int MEAN_THREADS = 1024;

__global__ void __launch_bounds__(MEAN_THREADS)
cross_entropy_valid_mean_kernel(const int64_t* __restrict__ targets,   // (N,)
                                const float* __restrict__ row_losses,  // (N,) 0 on ignored rows
                                int64_t* __restrict__ counts,          // (4,)
                                float* __restrict__ loss,              // ()
                                int64_t N, int64_t C) {
    int64_t valid = 0, out_of_range = 0;
#pragma unroll 8
    for (int64_t i = threadIdx.x; i < N; i += MEAN_THREADS) count_target(targets[i], C, valid, out_of_range);
    valid = block_reduce_sum(valid);
    out_of_range = block_reduce_sum(out_of_range);
    const float sum = sum_in_order(row_losses, N);
    if (threadIdx.x == 0) {
        counts[0] = valid;
        counts[1] = out_of_range;
        counts[2] = counts[3] = 0;  // unused here: written, so that every call's stats are alike
        write_mean(sum, valid, out_of_range, loss);
    }
}

cudaError_t cross_entropy_valid_mean(const int64_t* targets, const float* row_losses, int64_t* counts, void* loss,
                                     int64_t N, int64_t C, cudaStream_t stream) {
    cross_entropy_valid_mean_kernel<<<1, MEAN_THREADS, 0, stream>>>(targets, row_losses, counts,
                                                                   static_cast<float*>(loss), N, C);
    return cudaGetLastError();
}
