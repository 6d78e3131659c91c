// The second stage of every cross_entropy forward: one block adds the per-row
// losses in a fixed order (bitwise reproducible: no float atomicAdd) and divides
// by the number of rows whose target is a class, so ignored rows leave both the
// sum and the denominator; with every row ignored that is 0 / 0 = NaN, as in
// PyTorch. It also counts out-of-range targets, which the host reads back to
// raise a clear error.
#include "cross_entropy.cuh"
#include "launchers.h"
#include "../common/reduce.cuh"

constexpr int MEAN_THREADS = 1024;

__global__ void __launch_bounds__(MEAN_THREADS)
cross_entropy_valid_mean_kernel(const float* __restrict__ row_losses,  // (N,) 0 on ignored rows
                                const int64_t* __restrict__ targets,   // (N,)
                                float* __restrict__ loss,              // ()
                                int64_t* __restrict__ counts,          // (2,) valid, out of range
                                int64_t N, int64_t C) {
    float sum = 0.0f;
    int64_t valid = 0, out_of_range = 0;
    // Branch-free body, so the compiler can issue several iterations' loads at once.
#pragma unroll 4
    for (int64_t i = threadIdx.x; i < N; i += MEAN_THREADS) {
        const int64_t target = targets[i];
        sum += row_losses[i];  // NaN on an out-of-range row: the loss is never a wrong number
        valid += target_in_range(target, C);
        out_of_range += !target_in_range(target, C) && target != IGNORE_INDEX;
    }
    sum = block_reduce_sum(sum);
    valid = block_reduce_sum(valid);
    out_of_range = block_reduce_sum(out_of_range);
    if (threadIdx.x == 0) {
        *loss = sum / float(valid);
        counts[0] = valid;
        counts[1] = out_of_range;
    }
}

cudaError_t cross_entropy_valid_mean(const float* row_losses, const int64_t* targets, float* loss,
                                     int64_t* counts, int64_t N, int64_t C, cudaStream_t stream) {
    cross_entropy_valid_mean_kernel<<<1, MEAN_THREADS, 0, stream>>>(row_losses, targets, loss,
                                                                    counts, N, C);
    return cudaGetLastError();
}
