// One block of 1024 threads runs the last block's sum (common/last_block.cuh)
// as a kernel of its own, after the row kernel has written every partial.
#include "common/sum_partials.cuh"
#include "common/last_block.cuh"

constexpr int SUM_THREADS = 1024;

__global__ void __launch_bounds__(SUM_THREADS)
sum_partials_kernel(const float* __restrict__ partials, int64_t n, float divisor, float* __restrict__ result) {
    const float sum = sum_in_order(partials, n);
    if (threadIdx.x == 0) *result = sum / divisor;
}

cudaError_t launch_sum_partials(const float* partials, int64_t n, float divisor, void* result, cudaStream_t stream) {
    sum_partials_kernel<<<1, SUM_THREADS, 0, stream>>>(partials, n, divisor, static_cast<float*>(result));
    return cudaGetLastError();
}
