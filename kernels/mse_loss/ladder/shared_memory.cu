// shared_memory: one block per row, coalesced loads, a tree reduction in shared memory.
// flaw of naive: neighbouring threads read addresses D floats apart (32 cache lines per
//     warp load), and B threads leave most SMs idle.
// idea: a block of 256 threads per row: thread k reads elements k, k + 256, ..., so a warp
//     load is 32 consecutive floats, one 128-byte line; the block adds its threads' sums
//     with a tree in shared memory; the grid's B block sums go to the second kernel. The
//     backward has no reduction: one thread per element of the flat tensor, coalesced.
#include "common/sum_partials.cuh"
#include "mse_loss/mse_loss.cuh"
#include "mse_loss/ladder/ladder.h"

namespace {

constexpr int THREADS = 256;

// The block's sum, in thread 0: every thread stores its value, then a tree halves the
// active threads each step: log2(256) = 8 steps, each behind a barrier.
__device__ __forceinline__ float block_sum(float value) {
    __shared__ float partial[THREADS];
    partial[threadIdx.x] = value;
    __syncthreads();
    for (int stride = THREADS / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
        __syncthreads();
    }
    return partial[0];
}

__global__ void __launch_bounds__(THREADS) forward_kernel(
    const float* __restrict__ predictions,  // (B, D)
    const float* __restrict__ targets,      // (B, D)
    float* __restrict__ row_partials,       // (B,)
    int64_t D) {
    const float* p = predictions + blockIdx.x * D;  // this block's row
    const float* t = targets + blockIdx.x * D;
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < D; j += THREADS) sum += mse_loss_term(p[j], t[j]);  // lane k + 1: the next float
    sum = block_sum(sum);
    if (threadIdx.x == 0) row_partials[blockIdx.x] = sum;
}

__global__ void __launch_bounds__(THREADS) backward_kernel(
    const float* __restrict__ predictions,  // (B, D)
    const float* __restrict__ targets,      // (B, D)
    const float* __restrict__ grad_loss,    // ()
    float* __restrict__ grad_predictions,   // (B, D)
    int64_t B, int64_t D) {
    const float scaled_grad = 2.0f * *grad_loss / (float(B) * float(D));
    const int64_t stride = int64_t(gridDim.x) * THREADS;
    for (int64_t i = blockIdx.x * int64_t(THREADS) + threadIdx.x; i < B * D; i += stride)
        grad_predictions[i] = mse_loss_grad(predictions[i], targets[i], scaled_grad);
}

}  // namespace

cudaError_t mse_loss_shared_memory_forward(
    const void* predictions,  // (B, D)
    const void* targets,      // (B, D)
    float* row_partials,      // (B + 4,): each row's sum in the first B
    void* loss,               // (): the sum of the rows / (B D)
    void* grad_predictions,   // (B, D): unused (only fused writes the gradient in the forward)
    int64_t B, int64_t D, DType dtype, cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // a teaching rung: float32 only
    const int64_t blocks = B;  // one block per row
    forward_kernel<<<blocks, THREADS, 0, stream>>>(static_cast<const float*>(predictions),
                                                   static_cast<const float*>(targets), row_partials, D);
    const cudaError_t err = cudaGetLastError();
    return err != cudaSuccess ? err : launch_sum_partials(row_partials, B, float(B) * float(D), loss, stream);
}

cudaError_t mse_loss_shared_memory_backward(
    const void* predictions,  // (B, D)
    const void* targets,      // (B, D)
    const void* grad_loss,    // ()
    void* grad_predictions,   // (B, D): written
    int64_t B, int64_t D, DType dtype, cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // a teaching rung: float32 only
    const int64_t blocks = (B * D + THREADS - 1) / THREADS;  // one thread per element
    backward_kernel<<<blocks, THREADS, 0, stream>>>(static_cast<const float*>(predictions),
                                                    static_cast<const float*>(targets),
                                                    static_cast<const float*>(grad_loss),
                                                    static_cast<float*>(grad_predictions), B, D);
    return cudaGetLastError();
}
