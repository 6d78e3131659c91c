// Solution of exercise 6 -- a block's (max, sum) through a tree in shared memory (cross_entropy's
// shared_memory rung).
//
// naive gives each thread a whole row: neighbouring threads read logits C floats
// apart, one cache line per lane. Here a block of THREADS threads shares a row
// (thread k reads k, k + THREADS, ...: a warp reads one 128-byte line), so each
// thread ends with the (max, sum) state of its share and the block must merge
// the THREADS states: a tree in shared memory, halving the active threads at
// each step, a barrier between steps (a thread reads a slot another one wrote).
//
#include "cross_entropy/cross_entropy.cuh"
#include "cross_entropy/launchers.h"

constexpr int THREADS = 256;

// The state of the union of two parts: the larger max, each sum rescaled to it.
__device__ __forceinline__ LogSumExp lse_merge(LogSumExp a, LogSumExp b) {
    const float m = fmaxf(a.max, b.max);
    return {m, a.sum * expf(a.max - m) + b.sum * expf(b.max - m)};
}

// The block's state, every thread getting it, through a tree in shared memory.
__device__ __forceinline__ LogSumExp block_logsumexp(LogSumExp lse) {
    __shared__ float tree_max[THREADS], tree_sum[THREADS];
    tree_max[threadIdx.x] = lse.max;
    tree_sum[threadIdx.x] = lse.sum;
    __syncthreads();
    for (int stride = THREADS / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride) {
            lse = lse_merge(lse, {tree_max[threadIdx.x + stride], tree_sum[threadIdx.x + stride]});
            tree_max[threadIdx.x] = lse.max;
            tree_sum[threadIdx.x] = lse.sum;
        }
        __syncthreads();  // this step's slots written before the next step reads them
    }
    return {tree_max[0], tree_sum[0]};
}

__global__ void __launch_bounds__(THREADS)
tree_forward_kernel(const float* __restrict__ logits,     // (N, C)
                    const int64_t* __restrict__ targets,  // (N,)
                    float* __restrict__ row_losses,       // (N,)
                    float* __restrict__ row_max,          // (N,)
                    float* __restrict__ row_log_sum,      // (N,)
                    int64_t C) {
    const int64_t row = blockIdx.x;  // one block per row
    const float* x = logits + row * C;
    LogSumExp lse;
    for (int64_t j = threadIdx.x; j < C; j += THREADS) lse_add(lse, x[j]);
    lse = block_logsumexp(lse);
    if (threadIdx.x == 0) store_row(x, targets[row], C, lse, row, row_losses, row_max, row_log_sum);
}

cudaError_t cross_entropy_custom_forward(const void* logits, const int64_t* targets, int64_t* counts,
                                         float* row_losses, float* row_max, float* row_log_sum, void* loss,
                                         void* /*grad_logits: not fused*/, int64_t N, int64_t C, DType dtype,
                                         cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // float32 only
    tree_forward_kernel<<<N, THREADS, 0, stream>>>(static_cast<const float*>(logits), targets, row_losses,
                                                   row_max, row_log_sum, C);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    return cross_entropy_valid_mean(targets, row_losses, counts, loss, N, C, stream);
}
