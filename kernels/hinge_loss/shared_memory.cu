// shared_memory: blocks take rows in turn, coalesced loads, a tree reduction in shared memory.
// flaw of naive: neighbouring threads read predictions D floats apart (32 cache lines per
//     warp load), and B threads leave most SMs idle.
// idea: a grid of min(B, 1024) blocks of 256 threads; block b takes rows b, b + 1024, ...,
//     and thread k of it elements k, k + 256, ... of each row, so a warp load is 32
//     consecutive floats, one 128-byte line (t[j] too, from L1/L2: every row reads it). The
//     block adds its threads' sums with a tree in shared memory: one partial per block, not
//     per row. The backward has no reduction: the same walk writes the gradient.
#include <algorithm>
#include "common/sum_partials.cuh"
#include "hinge_loss/hinge_loss.cuh"
#include "hinge_loss/launchers.h"

// Launch knobs (losslab/build/knobs.py): -DLOSSLAB_HINGE_LOSS_SHARED_MEMORY_<KNOB>=<value> builds another one.
#ifndef LOSSLAB_HINGE_LOSS_SHARED_MEMORY_THREADS
#define LOSSLAB_HINGE_LOSS_SHARED_MEMORY_THREADS 256  // threads per block: 32 64 128 256 512 1024
#endif
constexpr int THREADS = LOSSLAB_HINGE_LOSS_SHARED_MEMORY_THREADS;
static_assert(THREADS >= 32 && THREADS <= 1024 && (THREADS & (THREADS - 1)) == 0,
              "LOSSLAB_HINGE_LOSS_SHARED_MEMORY_THREADS: a power of two from 32 to 1024 (the tree halves it)");

namespace {

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

cudaError_t hinge_loss_shared_memory_forward(
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

cudaError_t hinge_loss_shared_memory_backward(
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
