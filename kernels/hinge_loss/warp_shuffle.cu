// warp_shuffle: the block's sum by __shfl_xor_sync inside each warp, one shared slot per warp.
// flaw of shared_memory: its tree takes 8 steps, each behind a barrier, with a shared-memory
//     store and load per step and most threads idle (128, 64, ..., 1 of 256 at work).
// idea: the 32 lanes of a warp exchange registers directly: 5 butterfly steps of
//     __shfl_xor_sync leave the warp's sum in every lane; lane 0 of each warp writes one
//     shared slot, one barrier, and warp 0 sums the 8 slots the same way. The backward has
//     nothing to reduce: shared_memory's walk, unchanged.
// not faster: forward, forward_backward (the forward is bound by DRAM: the tree's barriers,
//     once per block at the end of 32 rows, hide behind other blocks' loads; the backward
//     is the same kernel)
#include <algorithm>
#include "common/sum_partials.cuh"
#include "hinge_loss/hinge_loss.cuh"
#include "hinge_loss/launchers.h"

// Launch knobs (losslab/build/knobs.py): -DLOSSLAB_HINGE_LOSS_WARP_SHUFFLE_<KNOB>=<value> builds another one.
#ifndef LOSSLAB_HINGE_LOSS_WARP_SHUFFLE_THREADS
#define LOSSLAB_HINGE_LOSS_WARP_SHUFFLE_THREADS 256  // threads per block: 32 64 128 256 512 1024
#endif
constexpr int THREADS = LOSSLAB_HINGE_LOSS_WARP_SHUFFLE_THREADS;
static_assert(THREADS >= 32 && THREADS <= 1024 && THREADS % 32 == 0,
              "LOSSLAB_HINGE_LOSS_WARP_SHUFFLE_THREADS: a multiple of 32 from 32 to 1024 (whole warps)");

namespace {

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
    const float* __restrict__ targets,      // (D,)
    float* __restrict__ partials,           // (gridDim.x,)
    int64_t B, int64_t D) {
    float sum = 0.0f;
    for (int64_t row = blockIdx.x; row < B; row += gridDim.x)  // this block's rows
        for (int64_t j = threadIdx.x; j < D; j += THREADS)     // lane k + 1: the next float
            sum += hinge_term(hinge_margin(predictions[row * D + j], targets[j]));
    sum = block_sum(sum);
    if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

__global__ void __launch_bounds__(THREADS) backward_kernel(
    const float* __restrict__ predictions,  // (B, D)
    const float* __restrict__ targets,      // (D,)
    const float* __restrict__ grad_loss,    // ()
    float* __restrict__ grad_predictions,   // (B, D)
    int64_t B, int64_t D) {
    const float scaled_grad = *grad_loss / (float(B) * float(D));
    for (int64_t row = blockIdx.x; row < B; row += gridDim.x)
        for (int64_t j = threadIdx.x; j < D; j += THREADS)
            grad_predictions[row * D + j] = hinge_grad(hinge_margin(predictions[row * D + j], targets[j]),
                                                       targets[j], scaled_grad);
}

}  // namespace

cudaError_t hinge_loss_warp_shuffle_forward(
    const void* predictions,  // (B, D)
    const void* targets,      // (D,)
    float* partials,          // (max(B, 1024) + 4,): each block's sum in the first min(B, 1024)
    void* loss,               // (): the sum of the blocks / (B * D)
    void* grad_predictions,   // (B, D): unused (only fused writes the gradient in the forward)
    int64_t B, int64_t D, DType dtype, cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // a teaching rung: float32 only
    const int64_t blocks = std::min<int64_t>(B, HINGE_LOSS_MAX_PARTIALS);  // rows in turn
    forward_kernel<<<blocks, THREADS, 0, stream>>>(static_cast<const float*>(predictions),
                                                   static_cast<const float*>(targets), partials, B, D);
    const cudaError_t err = cudaGetLastError();
    return err != cudaSuccess ? err : launch_sum_partials(partials, blocks, float(B) * float(D), loss, stream);
}

cudaError_t hinge_loss_warp_shuffle_backward(
    const void* predictions,  // (B, D)
    const void* targets,      // (D,)
    const void* grad_loss,    // ()
    void* grad_predictions,   // (B, D): written
    int64_t B, int64_t D, DType dtype, cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // a teaching rung: float32 only
    const int64_t blocks = std::min<int64_t>(B, HINGE_LOSS_MAX_PARTIALS);  // rows in turn
    backward_kernel<<<blocks, THREADS, 0, stream>>>(static_cast<const float*>(predictions),
                                                    static_cast<const float*>(targets),
                                                    static_cast<const float*>(grad_loss),
                                                    static_cast<float*>(grad_predictions), B, D);
    return cudaGetLastError();
}
