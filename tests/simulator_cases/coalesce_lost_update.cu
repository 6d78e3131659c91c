// A wrong answer to the coalesce exercise, test data for tests/test_simulator.py: every thread adds its
// sum into partial[0] with no atomic (a lost update on a GPU; the simulator runs each update whole).
#include "kl_div/kl_div.cuh"
#include "common/sum_partials.cuh"
#include "kl_div/launchers.h"

constexpr int THREADS = 256;

__global__ void __launch_bounds__(THREADS)
coalesced_forward_kernel(const float* __restrict__ predictions,  // (B, D)
                         const float* __restrict__ targets,      // (B, D)
                         float* __restrict__ row_partials,       // (B,)
                         int64_t D) {
    __shared__ float partial[THREADS];
    const int64_t row_start = blockIdx.x * D;  // this block's row
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < D; j += THREADS)
        sum += kl_div_term(predictions[row_start + j], targets[row_start + j]);

    if (threadIdx.x == 0) partial[0] = 0.0f;
    __syncthreads();
    partial[0] += sum;  // wrong: every thread reads, adds and writes one address: updates are lost on a GPU
    __syncthreads();
    if (threadIdx.x == 0) row_partials[blockIdx.x] = partial[0];
}

cudaError_t kl_div_custom_forward(const void* predictions_, const void* targets_, float* row_partials,
                                  void* loss, void* /*grad_predictions: not fused*/, int64_t B, int64_t D,
                                  DType dtype, cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // float32 only
    const float* predictions = static_cast<const float*>(predictions_);
    const float* targets = static_cast<const float*>(targets_);
    coalesced_forward_kernel<<<B, THREADS, 0, stream>>>(predictions, targets, row_partials, D);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    return launch_sum_partials(row_partials, B, float(B), loss, stream);
}
