// Pitfall: batchmean divided by B * D instead of B.
//
// reduction="batchmean" divides the total by the batch size B: the mean over
// rows of each row's KL divergence. Dividing by the number of elements B * D
// is reduction="mean", which PyTorch itself warns is not the KL divergence:
// the loss comes out D times too small (and so does its gradient).
// Otherwise this is the warp_shuffle rung.
#include "kl_div/kl_div.cuh"
#include "common/reduce.cuh"
#include "common/sum_partials.cuh"
#include "kl_div/launchers.h"

constexpr int THREADS = 256;

__global__ void __launch_bounds__(THREADS)
batchmean_kernel(const float* __restrict__ predictions,  // (B, D)
                 const float* __restrict__ targets,      // (B, D)
                 float* __restrict__ row_partials,       // (B,)
                 int64_t D) {
    const int64_t row_start = blockIdx.x * D;
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < D; j += THREADS)
        sum += kl_div_term(predictions[row_start + j], targets[row_start + j]);
    sum = block_reduce_sum(sum);
    if (threadIdx.x == 0) row_partials[blockIdx.x] = sum;
}

cudaError_t kl_div_custom_forward(const void* predictions_, const void* targets_, float* row_partials,
                                  void* loss, void* /*grad_predictions: not fused*/, int64_t B, int64_t D,
                                  DType dtype, cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // float32 only
    const float* predictions = static_cast<const float*>(predictions_);
    const float* targets = static_cast<const float*>(targets_);
    batchmean_kernel<<<B, THREADS, 0, stream>>>(predictions, targets, row_partials, D);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    return launch_sum_partials(row_partials, B, float(B) * float(D), loss, stream);  // PITFALL: B * D, not B
}
