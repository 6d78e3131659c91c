// warp_shuffle: shared_memory's tree took eight barrier-separated steps, most
// threads idle at each. Here the 32 lanes of a warp combine in registers with five
// __shfl_xor_sync butterflies (no shared memory, no barrier), then one shared slot
// per warp and a barrier finish the block: the max first, then the sums rescaled to
// it, so a thread takes one expf (merging (max, sum) pairs at every step took 26, as
// many exps as the row's 16 logits a thread at the seed). The row loop is
// shared_memory's, line for line. The backward has nothing to reduce: it is shared_memory's.
// not faster: forward_backward (the backward, shared_memory's own kernel at the DRAM
//   roof, is 60% of it: the forward's gain of a few microseconds is within the noise)
#include "cross_entropy/cross_entropy.cuh"
#include "cross_entropy/ladder/ladder.h"

namespace {

constexpr int THREADS = 256;

// The block's (max, sum), every thread getting it, in two rounds of five butterfly
// exchanges (a warp's 32 lanes combined in registers, every lane getting the warp's)
// and one shared slot per warp, a barrier, every thread adding the slots: the block's
// max first, then each thread's sum rescaled to it (one expf a thread) and summed.
__device__ __forceinline__ LogSumExp block_logsumexp(LogSumExp lse) {
    __shared__ float warp_max[THREADS / 32], warp_sum[THREADS / 32];
    float m = lse.max;
    for (int lanes = 16; lanes > 0; lanes /= 2)  // the partner: this lane's index xor 16, 8, 4, 2, 1
        m = fmaxf(m, __shfl_xor_sync(FULL_WARP, m, lanes));
    if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = m;
    __syncthreads();
    LogSumExp block;
    for (int w = 0; w < THREADS / 32; ++w) block.max = fmaxf(block.max, warp_max[w]);
    float s = lse.sum * expf(lse.max - block.max);  // NaN stays NaN: it never raised a max
    for (int lanes = 16; lanes > 0; lanes /= 2) s += __shfl_xor_sync(FULL_WARP, s, lanes);
    if (threadIdx.x % 32 == 0) warp_sum[threadIdx.x / 32] = s;
    __syncthreads();
    for (int w = 0; w < THREADS / 32; ++w) block.sum += warp_sum[w];
    return block;
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

cudaError_t cross_entropy_warp_shuffle_forward(
    const void* logits, const int64_t* targets, int64_t* counts, float* row_losses, float* row_max,
    float* row_log_sum, void* loss, void* /*grad_logits*/, int64_t N, int64_t C, DType dtype, cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // float32 only
    forward_kernel<<<N, THREADS, 0, stream>>>(
        static_cast<const float*>(logits), targets, row_losses, row_max, row_log_sum, N, C);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    return cross_entropy_valid_mean(targets, row_losses, counts, loss, N, C, stream);  // counts, then the mean
}

cudaError_t cross_entropy_warp_shuffle_backward(
    const void* logits, const int64_t* targets, const float* row_max, const float* row_log_sum,
    const int64_t* counts, const void* grad_loss, void* grad_logits, int64_t N, int64_t C, DType dtype,
    cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // float32 only
    backward_kernel<<<N, THREADS, 0, stream>>>(
        static_cast<const float*>(logits), targets, row_max, row_log_sum, counts,
        static_cast<const float*>(grad_loss), static_cast<float*>(grad_logits), N, C);
    return cudaGetLastError();
}
