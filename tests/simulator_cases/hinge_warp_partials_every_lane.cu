// A wrong answer to the hinge_warp_partials exercise, test data for tests/test_exercises.py:
// the first warp reads a slot for each of its 32 lanes: there are THREADS / 32.
//
// The shared_memory rung adds a block's 256 sums with a tree in shared memory:
// 8 steps, each behind a __syncthreads(), most threads idle. warp_sum (written
// for you) adds a warp's 32 values through register shuffles instead, with no
// shared memory and no barrier: 5 steps, the sum in every lane. What is left
// is the step between warps, which cannot exchange registers.
//
// Contract of block_sum: called by all THREADS threads of the block, it
// returns the sum of their `value`s in thread 0 (the others' results are
// unused): each warp sums its lanes with warp_sum, lane 0 of each warp stores
// the warp's sum in its slot of warp_sums, and after one barrier the first warp
// sums the THREADS / 32 slots with warp_sum again (its other lanes adding 0).
// Shared memory: THREADS / 32 floats, not THREADS.
#include <algorithm>
#include "hinge_loss/hinge_loss.cuh"
#include "common/sum_partials.cuh"
#include "hinge_loss/launchers.h"

constexpr int THREADS = 256;
constexpr unsigned FULL_WARP = 0xffffffffu;

// The sum of `value` over the 32 lanes of the calling warp, in every lane (a butterfly).
__device__ __forceinline__ float warp_sum(float value) {
    for (int offset = 16; offset > 0; offset >>= 1)
        value += __shfl_xor_sync(FULL_WARP, value, offset);
    return value;
}

// The sum of `value` over the block, in thread 0.
__device__ __forceinline__ float block_sum(float value) {
    __shared__ float warp_sums[THREADS / 32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    value = warp_sum(value);
    if (lane == 0) warp_sums[warp] = value;
    __syncthreads();
    value = warp_sums[lane];
    return warp == 0 ? warp_sum(value) : 0.0f;
}

__global__ void __launch_bounds__(THREADS)
shuffle_forward_kernel(const float* __restrict__ predictions,  // (B, D)
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

cudaError_t hinge_loss_custom_forward(const void* predictions_, const void* targets_, float* partials,
                                      void* loss, void* /*grad_predictions: not fused*/, int64_t B, int64_t D,
                                      DType dtype, cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // float32 only
    const float* predictions = static_cast<const float*>(predictions_);
    const float* targets = static_cast<const float*>(targets_);
    const int64_t blocks = std::min<int64_t>(B, HINGE_LOSS_MAX_PARTIALS);  // rows in turn
    shuffle_forward_kernel<<<blocks, THREADS, 0, stream>>>(predictions, targets, partials, B, D);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    return launch_sum_partials(partials, blocks, float(B) * float(D), loss, stream);  // the mean over B D
}
