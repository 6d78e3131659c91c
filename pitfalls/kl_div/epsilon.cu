// Pitfall: an epsilon added to both inputs "for safety".
//
// Adding eps to p and t before the logarithms avoids log(0), but it changes
// every term, so the loss is no longer PyTorch's: a target of exactly 0 now
// contributes eps * log(eps / (p + eps)) instead of 0, and a prediction of
// exactly 0 under a positive target gives a finite, ordinary-looking loss where PyTorch
// gives +inf (the signal that something is badly wrong disappears).
// Otherwise this is the warp_shuffle rung.
#include "kl_div/kl_div.cuh"
#include "common/reduce.cuh"
#include "common/sum_partials.cuh"
#include "kl_div/launchers.h"

constexpr int THREADS = 256;
constexpr float EPS = 1e-8f;  // PITFALL: the "safety" epsilon

__global__ void __launch_bounds__(THREADS)
epsilon_kernel(const float* __restrict__ predictions,  // (B, D)
               const float* __restrict__ targets,      // (B, D)
               float* __restrict__ row_partials,       // (B,)
               int64_t D) {
    const int64_t row_start = blockIdx.x * D;
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < D; j += THREADS)
        sum += kl_div_term(predictions[row_start + j] + EPS, targets[row_start + j] + EPS);  // PITFALL: + EPS on both
    sum = block_reduce_sum(sum);
    if (threadIdx.x == 0) row_partials[blockIdx.x] = sum;
}

cudaError_t kl_div_custom_forward(const void* predictions_, const void* targets_, float* row_partials,
                                  void* loss, void* /*grad_predictions: not fused*/, int64_t B, int64_t D,
                                  DType dtype, cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // float32 only
    const float* predictions = static_cast<const float*>(predictions_);
    const float* targets = static_cast<const float*>(targets_);
    epsilon_kernel<<<B, THREADS, 0, stream>>>(predictions, targets, row_partials, D);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    return launch_sum_partials(row_partials, B, float(B), loss, stream);
}
