// Pitfall: an int32 index into a tensor of more than 2^31 elements.
//
// The row's first element, blockIdx.x * D, is computed in 64 bits and then
// stored in an int. Below 2^31 elements nothing shows; from row
// ceil(2^31 / D) on, the start wraps around to a negative number: with
// D = 65536, row 32768 starts at 2^31 and reads from -2^31, 8 GiB before the
// tensor (an illegal address, or someone else's memory). Every check at the
// usual sizes passes. Otherwise this is the warp_shuffle rung.
#include "common/reduce.cuh"
#include "common/sum_partials.cuh"
#include "kl_div/kl_div.cuh"
#include "kl_div/elementwise_backward.cuh"
#include "kl_div/launchers.h"

constexpr int THREADS = 256;

__global__ void __launch_bounds__(THREADS)
pitfall_int32_index_kernel(const float* __restrict__ predictions,  // (B, D)
                                   const float* __restrict__ targets,      // (B, D)
                                   float* __restrict__ row_partials,       // (B,)
                                   int64_t D) {
    const int row_start = blockIdx.x * D;  // PITFALL: wraps past 2^31 elements
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < D; j += THREADS)
        sum += kl_div_term(predictions[row_start + j], targets[row_start + j]);
    sum = block_reduce_sum(sum);
    if (threadIdx.x == 0) row_partials[blockIdx.x] = sum;
}

cudaError_t kl_div_custom_forward(const void* predictions, const void* targets, float* row_partials,
                                        void* loss, void* /*grad_predictions: not fused*/, int64_t B, int64_t D,
                                        DType dtype, cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // a teaching rung: float32 only
    pitfall_int32_index_kernel<<<B, THREADS, 0, stream>>>(static_cast<const float*>(predictions),
                                                                  static_cast<const float*>(targets),
                                                                  row_partials, D);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    return launch_sum_partials(row_partials, B, float(B), loss, stream);
}

// The backward has nothing to reduce, so shuffles change nothing there: it is
// shared_memory's coalesced element-wise kernel (elementwise_backward.cuh).
