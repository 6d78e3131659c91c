// Pitfall: a missing __syncthreads() (a shared-memory race).
//
// Each thread writes its sum into partial[threadIdx.x], then the tree reads
// partial[threadIdx.x + stride], a slot another warp writes. Without a barrier
// between the writes and the first reads, a warp can read a slot before its
// owner has written it: it adds what the slot held before (the previous
// block's value on that SM, or garbage). The loss changes from run to run;
// compute-sanitizer --tool racecheck reports the hazard on partial.
// Otherwise this is the shared_memory rung.
#include "common/sum_partials.cuh"
#include "kl_div/kl_div.cuh"
#include "kl_div/elementwise_backward.cuh"
#include "kl_div/launchers.h"

constexpr int THREADS = 256;

__global__ void __launch_bounds__(THREADS)
pitfall_missing_sync_kernel(const float* __restrict__ predictions,  // (B, D)
                                    const float* __restrict__ targets,      // (B, D)
                                    float* __restrict__ row_partials,       // (B,)
                                    int64_t D) {
    __shared__ float partial[THREADS];
    const int64_t row_start = blockIdx.x * D;
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < D; j += THREADS)
        sum += kl_div_term(predictions[row_start + j], targets[row_start + j]);
    partial[threadIdx.x] = sum;
    // PITFALL: no __syncthreads() here: the tree below reads other warps' slots before they are written
    for (int stride = THREADS / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
        __syncthreads();
    }
    if (threadIdx.x == 0) row_partials[blockIdx.x] = partial[0];
}

cudaError_t kl_div_custom_forward(const void* predictions, const void* targets, float* row_partials,
                                         void* loss, void* /*grad_predictions: not fused*/, int64_t B, int64_t D,
                                         DType dtype, cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // a teaching rung: float32 only
    pitfall_missing_sync_kernel<<<B, THREADS, 0, stream>>>(static_cast<const float*>(predictions),
                                                                   static_cast<const float*>(targets),
                                                                   row_partials, D);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    return launch_sum_partials(row_partials, B, float(B), loss, stream);
}
