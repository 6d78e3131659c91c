// A wrong answer to the mse_block_sum exercise, test data for tests/test_exercises.py:
// no barrier between the steps of the tree: a step reads slots the last one has not written yet.
//
// naive gives each thread a whole row: a warp's loads touch 32 cache lines,
// and only B threads exist. Here each row gets a block of THREADS threads,
// thread k reading elements k, k + THREADS, ... (written for you): then each
// thread holds a part of the row's sum, and the block must add its THREADS
// parts into one.
//
// Contract of block_sum: called by all THREADS threads of the block with
// their `value`, it returns the sum of the THREADS values in thread 0 (the
// other threads' results are unused). Every thread has stored its value in
// partial[threadIdx.x] (written for you); at each step of the tree the first
// `stride` threads add the slot `stride` further into their own, halving
// `stride` from THREADS / 2 down to 1, until partial[0] holds the block's sum.
// A thread reads slots other threads wrote: each step must see the last one's.
#include "mse_loss/mse_loss.cuh"
#include "common/sum_partials.cuh"
#include "mse_loss/launchers.h"

constexpr int THREADS = 256;

// The sum of `value` over the block's THREADS threads, in thread 0.
__device__ __forceinline__ float block_sum(float value) {
    __shared__ float partial[THREADS];
    partial[threadIdx.x] = value;
    __syncthreads();
    for (int stride = THREADS / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    }
    return partial[0];
}

__global__ void __launch_bounds__(THREADS)
tree_forward_kernel(const float* __restrict__ predictions,  // (B, D)
                    const float* __restrict__ targets,      // (B, D)
                    float* __restrict__ row_partials,       // (B,)
                    int64_t D) {
    const int64_t row_start = blockIdx.x * D;  // this block's row
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < D; j += THREADS)  // lane k + 1: the next float
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
    tree_forward_kernel<<<B, THREADS, 0, stream>>>(predictions, targets, row_partials, D);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    return launch_sum_partials(row_partials, B, float(B) * float(D), loss, stream);  // the mean over B D
}
