// Pitfall: KL computed in the wrong direction.
//
// F.kl_div(log(p), t) is KL(t || p) = sum t * log(t / p): the targets weight
// the log-ratio. Swapping the roles gives KL(p || t) = sum p * log(p / t), a
// different number (KL is not symmetric) that is still >= 0 and looks plausible.
// Otherwise this is the warp_shuffle rung.
#include "common/reduce.cuh"
#include "common/sum_partials.cuh"
#include "common/xlogy.cuh"
#include "kl_div/launchers.h"

constexpr int THREADS = 256;

__global__ void __launch_bounds__(THREADS)
wrong_direction_kernel(const float* __restrict__ predictions,  // (B, D)
                       const float* __restrict__ targets,      // (B, D)
                       float* __restrict__ row_partials,       // (B,)
                       int64_t D) {
    const int64_t row_start = blockIdx.x * D;
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < D; j += THREADS) {
        const float p = predictions[row_start + j], t = targets[row_start + j];
        sum += xlogy(p, p) - p * logf(t);  // PITFALL: p * log(p / t); the loss is t * log(t / p)
    }
    sum = block_reduce_sum(sum);
    if (threadIdx.x == 0) row_partials[blockIdx.x] = sum;
}

cudaError_t kl_div_custom_forward(const void* predictions_, const void* targets_, float* row_partials,
                                  void* loss, void* /*grad_predictions: not fused*/, int64_t B, int64_t D,
                                  DType dtype, cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // float32 only
    const float* predictions = static_cast<const float*>(predictions_);
    const float* targets = static_cast<const float*>(targets_);
    wrong_direction_kernel<<<B, THREADS, 0, stream>>>(predictions, targets, row_partials, D);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    return launch_sum_partials(row_partials, B, float(B), loss, stream);
}
