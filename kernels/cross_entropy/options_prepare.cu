// The prepare stage of the options forwards that need the denominators before their rows
// (options.h): the mean's denominator and the sum of the weights, in one block.
#include "common/reduce.cuh"
#include "cross_entropy/cross_entropy.cuh"
#include "cross_entropy/options.h"

constexpr int PREPARE_THREADS = 1024;

// One block: the mean's denominator (sum of w_t over the rows not ignored, their count
// without weights, N for class probabilities) and sum_j w_j, each added in a fixed order.
__global__ void __launch_bounds__(PREPARE_THREADS)
cross_entropy_options_prepare_kernel(const int64_t* __restrict__ targets,  // (N,) or null
                                     const float* __restrict__ weight,     // (C,) or null
                                     float* __restrict__ denominators,     // (2,)
                                     int64_t N, int64_t C, int64_t ignore_index) {
    float rows = 0.0f, weights = 0.0f;
    if (targets) {
        for (int64_t i = threadIdx.x; i < N; i += PREPARE_THREADS) {
            const int64_t t = targets[i];
            if (t != ignore_index && target_in_range(t, C)) rows += weight ? weight[t] : 1.0f;
        }
    }
    if (weight)
        for (int64_t j = threadIdx.x; j < C; j += PREPARE_THREADS) weights += weight[j];
    rows = block_reduce_sum(rows);
    weights = block_reduce_sum(weights);
    if (threadIdx.x == 0) {
        denominators[0] = targets ? rows : float(N);
        denominators[1] = weight ? weights : float(C);
    }
}

cudaError_t cross_entropy_options_prepare(const int64_t* targets, const float* weight, float* denominators,
                                          int64_t N, int64_t C, int64_t ignore_index, cudaStream_t stream) {
    cross_entropy_options_prepare_kernel<<<1, PREPARE_THREADS, 0, stream>>>(targets, weight, denominators, N, C,
                                                                           ignore_index);
    return cudaGetLastError();
}
