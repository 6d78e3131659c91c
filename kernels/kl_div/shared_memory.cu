// shared_memory: one block per row. Consecutive threads read consecutive
// floats, so each warp load is one coalesced 128-byte transaction (fixing
// naive's uncoalesced loads), and the block combines its threads' sums with a
// tree reduction in shared memory: log2(256) = 8 steps, each behind a barrier.
#include "kl_div.cuh"
#include "launchers.h"
#include <algorithm>
#include "../common/sum_partials.cuh"

constexpr int THREADS = 256;

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

// The gradient has no reduction: a flat, coalesced element-wise pass.
__global__ void __launch_bounds__(THREADS)
kl_div_shared_memory_backward_kernel(const float* __restrict__ predictions,  // (B, D)
                                     const float* __restrict__ targets,      // (B, D)
                                     const float* __restrict__ grad_loss,    // ()
                                     float* __restrict__ grad_predictions,   // (B, D)
                                     int64_t n, float B) {
    const float scaled_grad = *grad_loss / B;
    const int64_t stride = int64_t(gridDim.x) * THREADS;
    for (int64_t i = blockIdx.x * int64_t(THREADS) + threadIdx.x; i < n; i += stride)
        grad_predictions[i] = kl_div_grad(predictions[i], targets[i], scaled_grad);
}

cudaError_t kl_div_shared_memory_forward(const float* predictions, const float* targets,
                                         float* row_partials, float* loss, int64_t B,
                                         int64_t D, cudaStream_t stream) {
    kl_div_shared_memory_forward_kernel<<<B, THREADS, 0, stream>>>(predictions, targets,
                                                                   row_partials, D);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    return launch_sum_partials(row_partials, B, float(B), loss, stream);
}

cudaError_t kl_div_shared_memory_backward(const float* predictions, const float* targets,
                                          const float* grad_loss, float* grad_predictions,
                                          int64_t B, int64_t D, cudaStream_t stream) {
    const int64_t n = B * D;
    const int64_t blocks = std::min<int64_t>((n + THREADS - 1) / THREADS, 1 << 20);
    kl_div_shared_memory_backward_kernel<<<blocks, THREADS, 0, stream>>>(
        predictions, targets, grad_loss, grad_predictions, n, float(B));
    return cudaGetLastError();
}
