// shared_memory: one block per row. Consecutive threads read consecutive
// floats, so each warp load is one coalesced 128-byte transaction (fixing
// naive's uncoalesced loads), and the block combines its threads' running
// (max, sum) with tree reductions in shared memory, each step behind a barrier.
#include "cross_entropy.cuh"
#include "launchers.h"

constexpr int THREADS = 256;

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

// The gradient has no reduction: one block per row, coalesced element-wise,
// each thread reading the row's statistics once.
__global__ void __launch_bounds__(THREADS)
cross_entropy_shared_memory_backward_kernel(const float* __restrict__ logits,       // (N, C)
                                            const int64_t* __restrict__ targets,    // (N,)
                                            const float* __restrict__ row_max,      // (N,)
                                            const float* __restrict__ row_log_sum,  // (N,)
                                            const int64_t* __restrict__ counts,     // (2,)
                                            const float* __restrict__ grad_loss,    // ()
                                            float* __restrict__ grad_logits,        // (N, C)
                                            int64_t C) {
    const int64_t row = blockIdx.x;
    const int64_t target = targets[row];
    const float scale = row_grad_scale(target, C, *grad_loss / float(counts[0]));
    const float m = row_max[row], log_sum = row_log_sum[row];
    const float* x = logits + row * C;
    float* g = grad_logits + row * C;
    for (int64_t j = threadIdx.x; j < C; j += THREADS)
        g[j] = cross_entropy_grad(x[j], j, target, m, log_sum, scale);
}

cudaError_t cross_entropy_shared_memory_forward(const float* logits, const int64_t* targets,
                                                const int64_t* counts, float* row_losses, float* row_max,
                                                float* row_log_sum, float* loss, int64_t N, int64_t C,
                                                cudaStream_t stream) {
    cross_entropy_shared_memory_forward_kernel<<<N, THREADS, 0, stream>>>(
        logits, targets, row_losses, row_max, row_log_sum, C);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    return cross_entropy_valid_mean(row_losses, counts, loss, N, stream);
}

cudaError_t cross_entropy_shared_memory_backward(const float* logits, const int64_t* targets,
                                                 const float* row_max, const float* row_log_sum,
                                                 const int64_t* counts, const float* grad_loss,
                                                 float* grad_logits, int64_t N, int64_t C,
                                                 cudaStream_t stream) {
    cross_entropy_shared_memory_backward_kernel<<<N, THREADS, 0, stream>>>(
        logits, targets, row_max, row_log_sum, counts, grad_loss, grad_logits, C);
    return cudaGetLastError();
}
