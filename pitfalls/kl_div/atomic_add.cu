// Pitfall: a float atomicAdd reduction, whose result changes from run to run.
//
// Each block adds its row's sum straight into the loss with atomicAdd: one
// kernel, and no row_partials. But blocks finish in a different order on every
// run, and float addition is not associative, so the last bits of the loss
// depend on the order: two runs on the same inputs disagree. The ladder writes
// per-row partials and adds them in a fixed order instead (its one-kernel rungs
// in the last block to finish, common/last_block.cuh).
// Otherwise this is the warp_shuffle rung.
#include "kl_div/kl_div.cuh"
#include "common/reduce.cuh"
#include "kl_div/launchers.h"

constexpr int THREADS = 256;

__global__ void __launch_bounds__(THREADS)
atomic_kernel(const float* __restrict__ predictions,  // (B, D)
              const float* __restrict__ targets,      // (B, D)
              float* __restrict__ loss,               // ()
              int64_t B, int64_t D) {
    const int64_t row_start = blockIdx.x * D;
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < D; j += THREADS)
        sum += kl_div_term(predictions[row_start + j], targets[row_start + j]);
    sum = block_reduce_sum(sum);
    if (threadIdx.x == 0) atomicAdd(loss, sum / float(B));  // PITFALL: order-dependent float sum
}

cudaError_t kl_div_custom_forward(const void* predictions_, const void* targets_, float* row_partials,
                                  void* loss, void* /*grad_predictions: not fused*/, int64_t B, int64_t D,
                                  DType dtype, cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // float32 only
    const float* predictions = static_cast<const float*>(predictions_);
    const float* targets = static_cast<const float*>(targets_);
    cudaError_t err = cudaMemsetAsync(loss, 0, sizeof(float), stream);
    if (err != cudaSuccess) return err;
    atomic_kernel<<<B, THREADS, 0, stream>>>(predictions, targets, static_cast<float*>(loss), B, D);
    return cudaGetLastError();
}
