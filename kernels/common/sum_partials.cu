// One block of 1024 threads: thread i adds partials i, i + 1024, ... in order,
// then a shuffle-based block reduction combines the 1024 sums in a fixed tree.
#include "common/sum_partials.cuh"
#include "common/reduce.cuh"

constexpr int SUM_THREADS = 1024;

__global__ void __launch_bounds__(SUM_THREADS)
sum_partials_kernel(const float* __restrict__ partials, int64_t n, float divisor,
                    float* __restrict__ result) {
    float sum = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += SUM_THREADS) sum += partials[i];
    sum = block_reduce_sum(sum);
    if (threadIdx.x == 0) *result = sum / divisor;
}

cudaError_t launch_sum_partials(const float* partials, int64_t n, float divisor,
                                float* result, cudaStream_t stream) {
    sum_partials_kernel<<<1, SUM_THREADS, 0, stream>>>(partials, n, divisor, result);
    return cudaGetLastError();
}
