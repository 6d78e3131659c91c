// warp_shuffle: the block's sum by __shfl_xor_sync inside each warp, one shared slot per warp.
// flaw of shared_memory: its tree takes 8 steps, each behind a barrier, with a shared-memory
//     store and load per step and most threads idle (128, 64, ..., 1 of 256 at work).
// idea: the 32 lanes of a warp exchange registers directly: 5 butterfly steps of
//     __shfl_xor_sync leave the warp's sum in every lane; lane 0 of each warp writes one
//     shared slot, one barrier, and warp 0 sums the 8 slots the same way. The backward has
//     nothing to reduce: shared_memory's element-wise kernel, unchanged.
// not faster: forward, forward_backward (a subtraction and an FMA per element leave the
//     forward bound by DRAM, where the tree's barriers hide behind other blocks' loads, as
//     kl_div's identical step measured; the backward is the same kernel)
#include "common/sum_partials.cuh"
#include "mse_loss/mse_loss.cuh"
#include "mse_loss/ladder/ladder.h"

namespace {

constexpr int THREADS = 256;

// A warp's 32 values summed by butterfly exchanges between registers: after 5 steps of
// __shfl_xor_sync (offsets 16, 8, 4, 2, 1) every lane holds the sum. No shared memory.
__device__ __forceinline__ float warp_sum(float value) {
    for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
    return value;
}

// The block's sum, in thread 0: each warp sums its lanes, lane 0 of each warp writes one
// shared slot, and after one barrier warp 0 sums the THREADS / 32 slots.
__device__ __forceinline__ float block_sum(float value) {
    __shared__ float partial[THREADS / 32];
    value = warp_sum(value);
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = value;
    __syncthreads();
    return threadIdx.x < 32 ? warp_sum(threadIdx.x < THREADS / 32 ? partial[threadIdx.x] : 0.0f) : 0.0f;
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

cudaError_t mse_loss_warp_shuffle_forward(
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

cudaError_t mse_loss_warp_shuffle_backward(
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
