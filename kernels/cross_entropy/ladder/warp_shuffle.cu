// warp_shuffle: shared_memory's tree took eight barrier-separated steps, most
// threads idle at each. Here the 32 lanes of a warp combine their (max, sum) in
// registers with five __shfl_xor_sync butterflies (no shared memory, no barrier),
// then one shared slot per warp and a single barrier finish the block. The
// backward has nothing to reduce: it is shared_memory's.
// not faster: forward, forward_backward (at the seed both forwards stream DRAM at the
//   same pace, the reduction hidden behind other blocks' loads; it shows on short rows)
#include "cross_entropy/cross_entropy.cuh"
#include "cross_entropy/ladder/ladder.h"

namespace {

constexpr int THREADS = 256;

// Two running log-sum-exps as one: the larger max, each sum rescaled to it.
__device__ __forceinline__ LogSumExp lse_merge(LogSumExp a, LogSumExp b) {
    const float m = fmaxf(a.max, b.max);
    return {m, a.sum * expf(a.max - m) + b.sum * expf(b.max - m)};
}

// The block's (max, sum), every thread getting it: five butterfly exchanges
// combine a warp's 32 lanes (every lane ends with the warp's), then each warp's
// lane 0 writes one shared slot, and after one barrier every thread adds the slots.
__device__ __forceinline__ LogSumExp block_logsumexp(LogSumExp lse) {
    __shared__ float warp_max[THREADS / 32], warp_sum[THREADS / 32];
    for (int lanes = 16; lanes > 0; lanes /= 2)  // the partner: this lane's index xor 16, 8, 4, 2, 1
        lse = lse_merge(lse, {__shfl_xor_sync(FULL_WARP, lse.max, lanes), __shfl_xor_sync(FULL_WARP, lse.sum, lanes)});
    if (threadIdx.x % 32 == 0) {
        warp_max[threadIdx.x / 32] = lse.max;
        warp_sum[threadIdx.x / 32] = lse.sum;
    }
    __syncthreads();
    LogSumExp block;
    for (int w = 0; w < THREADS / 32; ++w) block = lse_merge(block, {warp_max[w], warp_sum[w]});
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
