// Exercise 12 -- replace the shared-memory tree with warp shuffles (mse_loss's warp_shuffle rung).
//
// The shared_memory rung adds a block's 256 sums with a tree in shared memory:
// 8 steps, each behind a __syncthreads(), most threads idle. The 32 lanes of a
// warp can instead exchange registers: __shfl_xor_sync(mask, v, offset)
// returns v from the lane whose index differs from this lane's in the bits of
// `offset`; __shfl_down_sync(mask, v, offset) returns v from lane + offset.
//
// Contract of warp_sum: called by all 32 lanes of a warp (FULL_WARP), it
// returns the sum of their `value`s, at least in lane 0 (block_sum uses lane
// 0's result), with no shared memory and no barrier. block_sum (one shared
// slot per warp) is written for you and calls it twice.
//
// Grade it from the shell: python -m losslab grade exercises/mse_loss/mse_warp_sum.cu
// (in Python: losslab.teach.exercises.grade("mse_warp_sum")). Done when it is green and its machine
// code shows a shuffle (SHFL.BFLY or SHFL.DOWN).
#include "mse_loss/mse_loss.cuh"
#include "common/sum_partials.cuh"
#include "mse_loss/launchers.h"

constexpr int THREADS = 256;
constexpr unsigned FULL_WARP = 0xffffffffu;

// The sum of `value` over the 32 lanes of the calling warp, at least in lane 0 (every lane with a butterfly).
__device__ __forceinline__ float warp_sum(float value) {
    // FILL ME IN (roughly 2 lines): the warp's sum through shuffles (contract above).
    return value;
}

// The sum over the block: each warp adds its lanes, lane 0 of each warp
// writes one shared slot, then the first warp adds the slots.
__device__ __forceinline__ float block_sum(float value) {
    __shared__ float warp_sums[THREADS / 32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    value = warp_sum(value);
    if (lane == 0) warp_sums[warp] = value;
    __syncthreads();
    value = lane < THREADS / 32 ? warp_sums[lane] : 0.0f;
    return warp == 0 ? warp_sum(value) : 0.0f;
}

__global__ void __launch_bounds__(THREADS)
shuffle_forward_kernel(const float* __restrict__ predictions,  // (B, D)
                       const float* __restrict__ targets,      // (B, D)
                       float* __restrict__ row_partials,       // (B,)
                       int64_t D) {
    const int64_t row_start = blockIdx.x * D;
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < D; j += THREADS)
        sum += mse_loss_term(predictions[row_start + j], targets[row_start + j]);
    sum = block_sum(sum);
    if (threadIdx.x == 0) row_partials[blockIdx.x] = sum;
}

cudaError_t mse_loss_custom_forward(const void* predictions_, const void* targets_, float* row_partials,
                                    void* loss, void* /*grad_predictions: not fused*/, int64_t B, int64_t D,
                                    DType dtype, cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // float32 only
    const float* predictions = static_cast<const float*>(predictions_);
    const float* targets = static_cast<const float*>(targets_);
    shuffle_forward_kernel<<<B, THREADS, 0, stream>>>(predictions, targets, row_partials, D);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    return launch_sum_partials(row_partials, B, float(B) * float(D), loss, stream);  // the mean over B D
}
