// shared_memory: one block per row, forward and backward. naive's flaw was its
// loads, neighbouring threads C floats apart; here consecutive threads read
// consecutive floats, so a warp's load is one coalesced 128-byte line, and N
// blocks fill the GPU. The block combines its threads' (max, sum) with a tree in
// shared memory, halving the active threads at each step, a barrier between steps.
#include "cross_entropy/cross_entropy.cuh"
#include "cross_entropy/ladder/ladder.h"

namespace {

constexpr int THREADS = 256;

// Two running log-sum-exps as one: the larger max, each sum rescaled to it.
__device__ __forceinline__ LogSumExp lse_merge(LogSumExp a, LogSumExp b) {
    const float m = fmaxf(a.max, b.max);
    return {m, a.sum * expf(a.max - m) + b.sum * expf(b.max - m)};
}

// The block's (max, sum), every thread getting it: a tree in shared memory,
// log2(THREADS) = 8 steps, each halving the active threads, a barrier after each.
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
        __syncthreads();
    }
    return {tree_max[0], tree_sum[0]};
}

// --- forward: each row's loss, max and log-sum; then cross_entropy_valid_mean ---

__global__ void __launch_bounds__(THREADS)
forward_kernel(const float* __restrict__ logits,     // (N, C)
               const int64_t* __restrict__ targets,  // (N,) class indices, ignore_index = -100
               float* __restrict__ row_losses,       // (N,) written: each row's loss
               float* __restrict__ row_max,          // (N,) written: each row's max logit
               float* __restrict__ row_log_sum,      // (N,) written: log sum_j exp(x_j - max)
               int64_t N, int64_t C) {
    const int64_t row = blockIdx.x;  // one block per row
    const int64_t target = targets[row];
    const float* x = logits + row * C;
    LogSumExp lse;
    for (int64_t j = threadIdx.x; j < C; j += THREADS) lse_add(lse, x[j]);
    lse = block_logsumexp(lse);
    if (threadIdx.x == 0) store_row(x, target, C, lse, row, row_losses, row_max, row_log_sum);
}

// --- backward: dL/dx = (softmax(x) - onehot(t)) * grad_loss / n_valid ---

__global__ void __launch_bounds__(THREADS)
backward_kernel(const float* __restrict__ logits,       // (N, C)
                const int64_t* __restrict__ targets,    // (N,)
                const float* __restrict__ row_max,      // (N,) from the forward
                const float* __restrict__ row_log_sum,  // (N,) from the forward
                const int64_t* __restrict__ counts,     // (4,) from the forward: n_valid first
                const float* __restrict__ grad_loss,    // ()
                float* __restrict__ grad_logits,        // (N, C) written
                int64_t N, int64_t C) {
    const int64_t row = blockIdx.x;  // one block per row
    const int64_t target = targets[row];
    const float scale = row_grad_scale(target, C, *grad_loss / float(counts[0]));
    const float m = row_max[row], log_sum = row_log_sum[row];
    const float* x = logits + row * C;
    float* g = grad_logits + row * C;
    for (int64_t j = threadIdx.x; j < C; j += THREADS) g[j] = cross_entropy_grad(x[j], j, target, m, log_sum, scale);
}

}  // namespace

// --- the launchers (launchers.h) ---

cudaError_t cross_entropy_shared_memory_forward(
    const void* logits, const int64_t* targets, int64_t* counts, float* row_losses, float* row_max,
    float* row_log_sum, void* loss, void* /*grad_logits*/, int64_t N, int64_t C, DType dtype, cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // float32 only
    forward_kernel<<<N, THREADS, 0, stream>>>(
        static_cast<const float*>(logits), targets, row_losses, row_max, row_log_sum, N, C);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    return cross_entropy_valid_mean(targets, row_losses, counts, loss, N, C, stream);  // counts, then the mean
}

cudaError_t cross_entropy_shared_memory_backward(
    const void* logits, const int64_t* targets, const float* row_max, const float* row_log_sum,
    const int64_t* counts, const void* grad_loss, void* grad_logits, int64_t N, int64_t C, DType dtype,
    cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // float32 only
    backward_kernel<<<N, THREADS, 0, stream>>>(
        static_cast<const float*>(logits), targets, row_max, row_log_sum, counts,
        static_cast<const float*>(grad_loss), static_cast<float*>(grad_logits), N, C);
    return cudaGetLastError();
}
