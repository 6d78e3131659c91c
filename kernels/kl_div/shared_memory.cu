// shared_memory: one block per row. Consecutive threads read consecutive
// floats, so each warp load is one coalesced 128-byte transaction (fixing
// naive's uncoalesced loads), and the block combines its threads' sums with a
// tree reduction in shared memory: log2(256) = 8 steps, each behind a barrier.
#include "common/sum_partials.cuh"
#include "kl_div/kl_div.cuh"
#include "kl_div/elementwise_backward.cuh"
#include "kl_div/launchers.h"

// Launch knobs (losslab/build/knobs.py): -DLOSSLAB_KL_DIV_SHARED_MEMORY_<KNOB>=<value> builds another one.
#ifndef LOSSLAB_KL_DIV_SHARED_MEMORY_THREADS
#define LOSSLAB_KL_DIV_SHARED_MEMORY_THREADS 256  // threads per block: 32 64 128 256 512 1024
#endif
constexpr int THREADS = LOSSLAB_KL_DIV_SHARED_MEMORY_THREADS;
static_assert(THREADS >= 32 && THREADS <= 1024 && (THREADS & (THREADS - 1)) == 0,
              "LOSSLAB_KL_DIV_SHARED_MEMORY_THREADS: a power of two from 32 to 1024 (the tree halves it)");

__global__ void __launch_bounds__(THREADS)
kl_div_shared_memory_forward_kernel(const float* __restrict__ predictions,  // (B, D)
                                    const float* __restrict__ targets,      // (B, D)
                                    float* __restrict__ row_partials,       // (B,)
                                    int64_t D) {
    __shared__ float partial[THREADS];
    const int64_t row_start = blockIdx.x * D;
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < D; j += THREADS)
        sum += kl_div_term(predictions[row_start + j], targets[row_start + j]);
    partial[threadIdx.x] = sum;
    __syncthreads();
    for (int stride = THREADS / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
        __syncthreads();
    }
    if (threadIdx.x == 0) row_partials[blockIdx.x] = partial[0];
}

cudaError_t kl_div_shared_memory_forward(const void* predictions, const void* targets, float* row_partials,
                                         void* loss, void* /*grad_predictions: not fused*/, int64_t B, int64_t D,
                                         DType dtype, cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // a teaching rung: float32 only
    kl_div_shared_memory_forward_kernel<<<B, THREADS, 0, stream>>>(static_cast<const float*>(predictions),
                                                                   static_cast<const float*>(targets),
                                                                   row_partials, D);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    return launch_sum_partials(row_partials, B, float(B), loss, stream);
}

cudaError_t kl_div_shared_memory_backward(const void* predictions, const void* targets, const void* grad_loss,
                                          void* grad_predictions, int64_t B, int64_t D, DType dtype,
                                          cudaStream_t stream) {
    return kl_div_elementwise_backward(predictions, targets, static_cast<const float*>(grad_loss), grad_predictions,
                                       B, D, dtype, stream);
}
