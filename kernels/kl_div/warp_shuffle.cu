// warp_shuffle: as shared_memory, but the block reduction uses __shfl_xor_sync
// inside each warp and one shared slot per warp. It replaces shared_memory's
// eight barrier-separated tree steps (most threads idle) with register-to-
// register exchanges and two barriers.
#include "common/reduce.cuh"
#include "common/sum_partials.cuh"
#include "kl_div/kl_div.cuh"
#include "kl_div/elementwise_backward.cuh"
#include "kl_div/launchers.h"

// Launch knobs (losslab/build/knobs.py): -DLOSSLAB_KL_DIV_WARP_SHUFFLE_<KNOB>=<value> builds another one.
#ifndef LOSSLAB_KL_DIV_WARP_SHUFFLE_THREADS
#define LOSSLAB_KL_DIV_WARP_SHUFFLE_THREADS 256  // threads per block: 32 64 128 256 512 1024
#endif
constexpr int THREADS = LOSSLAB_KL_DIV_WARP_SHUFFLE_THREADS;
static_assert(THREADS >= 32 && THREADS <= 1024 && THREADS % 32 == 0,
              "LOSSLAB_KL_DIV_WARP_SHUFFLE_THREADS: a multiple of 32 from 32 to 1024 (whole warps)");

__global__ void __launch_bounds__(THREADS)
kl_div_warp_shuffle_forward_kernel(const float* __restrict__ predictions,  // (B, D)
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

cudaError_t kl_div_warp_shuffle_forward(const void* predictions, const void* targets, float* row_partials,
                                        void* loss, void* /*grad_predictions: not fused*/, int64_t B, int64_t D,
                                        DType dtype, cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // a teaching rung: float32 only
    kl_div_warp_shuffle_forward_kernel<<<B, THREADS, 0, stream>>>(static_cast<const float*>(predictions),
                                                                  static_cast<const float*>(targets),
                                                                  row_partials, D);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    return launch_sum_partials(row_partials, B, float(B), loss, stream);
}

// The backward has nothing to reduce, so shuffles change nothing there: it is
// shared_memory's coalesced element-wise kernel (elementwise_backward.cuh).
cudaError_t kl_div_warp_shuffle_backward(const void* predictions, const void* targets, const void* grad_loss,
                                         void* grad_predictions, int64_t B, int64_t D, DType dtype,
                                         cudaStream_t stream) {
    return kl_div_elementwise_backward(predictions, targets, static_cast<const float*>(grad_loss), grad_predictions,
                                       B, D, dtype, stream);
}
