// shared_memory: one block per row. Consecutive threads read consecutive
// floats, so each warp load is one coalesced 128-byte transaction (fixing
// naive's uncoalesced loads), and the block combines its threads' running
// (max, sum) with tree reductions in shared memory, each step behind a barrier.
#include "cross_entropy/cross_entropy.cuh"
#include "cross_entropy/launchers.h"
#include "cross_entropy/row_backward.cuh"

// Launch knobs (losslab/build/knobs.py): -DLOSSLAB_CROSS_ENTROPY_SHARED_MEMORY_<KNOB>=<value> builds another one.
#ifndef LOSSLAB_CROSS_ENTROPY_SHARED_MEMORY_THREADS
#define LOSSLAB_CROSS_ENTROPY_SHARED_MEMORY_THREADS 256  // threads per block: 32 64 128 256 512 1024
#endif
constexpr int THREADS = LOSSLAB_CROSS_ENTROPY_SHARED_MEMORY_THREADS;
static_assert(THREADS >= 32 && THREADS <= 1024 && (THREADS & (THREADS - 1)) == 0,
              "LOSSLAB_CROSS_ENTROPY_SHARED_MEMORY_THREADS: a power of two from 32 to 1024 (the tree halves it)");

// One value per thread, halved log2(THREADS) = 8 times; at each step half of
// the remaining threads sit idle at the barrier. Every thread gets the result.
template <typename Combine>
__device__ __forceinline__ float tree_reduce(float* partial,  // (THREADS,) shared
                                             float value, Combine combine) {
    partial[threadIdx.x] = value;
    __syncthreads();
    for (int stride = THREADS / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride)
            partial[threadIdx.x] = combine(partial[threadIdx.x], partial[threadIdx.x + stride]);
        __syncthreads();
    }
    const float result = partial[0];
    __syncthreads();  // all have read partial[0] before the next reduction overwrites it
    return result;
}

__global__ void __launch_bounds__(THREADS)
cross_entropy_shared_memory_forward_kernel(const float* __restrict__ logits,     // (N, C)
                                           const int64_t* __restrict__ targets,  // (N,)
                                           float* __restrict__ row_losses,       // (N,)
                                           float* __restrict__ row_max,          // (N,)
                                           float* __restrict__ row_log_sum,      // (N,)
                                           int64_t C) {
    __shared__ float partial[THREADS];
    const int64_t row = blockIdx.x;
    const float* x = logits + row * C;
    LogSumExp lse;
    for (int64_t j = threadIdx.x; j < C; j += THREADS) lse_add(lse, x[j]);
    // The row's max first, then every thread's sum rescaled to it and added up.
    LogSumExp block;
    block.max = tree_reduce(partial, lse.max, [](float a, float b) { return fmaxf(a, b); });
    block.sum = tree_reduce(partial, lse.sum * expf(lse.max - block.max),
                            [](float a, float b) { return a + b; });
    if (threadIdx.x == 0) store_row(x, targets[row], C, block, row, row_losses, row_max, row_log_sum);
}

cudaError_t cross_entropy_shared_memory_forward(const void* logits, const int64_t* targets, int64_t* counts,
                                                float* row_losses, float* row_max, float* row_log_sum, void* loss,
                                                void* /*grad_logits: not fused*/, int64_t N, int64_t C,
                                                DType dtype, cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // a teaching rung: float32 only
    cross_entropy_shared_memory_forward_kernel<<<N, THREADS, 0, stream>>>(
        static_cast<const float*>(logits), targets, row_losses, row_max, row_log_sum, C);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    return cross_entropy_valid_mean(targets, row_losses, counts, loss, N, C, stream);
}

cudaError_t cross_entropy_shared_memory_backward(const void* logits, const int64_t* targets, const float* row_max,
                                                 const float* row_log_sum, const int64_t* counts,
                                                 const void* grad_loss, void* grad_logits, int64_t N, int64_t C,
                                                 DType dtype, cudaStream_t stream) {
    return cross_entropy_row_backward(logits, targets, row_max, row_log_sum, counts,
                                      static_cast<const float*>(grad_loss), grad_logits, N, C, dtype, stream);
}
