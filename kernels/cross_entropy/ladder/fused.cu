// fused: in training, vectorized reads the logits from DRAM twice, in the forward
// and again in the backward. Here the forward also writes dL/dx for grad_loss = 1,
// (softmax - onehot) / n_valid, re-reading the row its block has just read (16 KiB
// at C = 4096: from L1/L2, not DRAM), and the backward only scales it by grad_loss
// (no work when it is 1). Each row's gradient needs n_valid: a one-block
// count_kernel runs first. Inference (no gradient buffer) runs vectorized's forward.
// not faster: forward (it also writes the gradient, twice the bytes; forward_backward,
//   training, is where it pays)
#include "common/row_split.cuh"
#include "common/scale.cuh"
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

// Four logits at once: the running max raised once for all four, then four exps.
__device__ __forceinline__ void lse_add4(LogSumExp& lse, float4 v) {
    lse_raise_max(lse, fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w)));
    lse.sum += (expf(v.x - lse.max) + expf(v.y - lse.max)) + (expf(v.z - lse.max) + expf(v.w - lse.max));
}

// --- forward: n_valid; then each row's loss, max, log-sum and gradient; then cross_entropy_valid_mean ---

__global__ void __launch_bounds__(1024)  // one block of 1024 threads: N targets, 64 KiB of loads in flight
count_kernel(const int64_t* __restrict__ targets,  // (N,)
             int64_t* __restrict__ counts,         // (4,) written: counts[0] = n_valid
             int64_t N, int64_t C) {
    int64_t valid = 0;
#pragma unroll 8
    for (int64_t i = threadIdx.x; i < N; i += 1024) valid += target_in_range(targets[i], C);
    valid = block_reduce_sum(valid);  // common/reduce.cuh
    if (threadIdx.x == 0) counts[0] = valid;
}

__global__ void __launch_bounds__(THREADS)
forward_kernel(const float* __restrict__ logits,     // (N, C)
               const int64_t* __restrict__ targets,  // (N,) class indices, ignore_index = -100
               const int64_t* __restrict__ counts,   // (4,) from count_kernel: n_valid first
               float* __restrict__ row_losses,       // (N,) written: each row's loss
               float* __restrict__ row_max,          // (N,) written: each row's max logit
               float* __restrict__ row_log_sum,      // (N,) written: log sum_j exp(x_j - max)
               float* __restrict__ grad_logits,      // (N, C) written: dL/dx for grad_loss = 1
               int64_t N, int64_t C) {
    const int64_t row = blockIdx.x;  // one block per row
    const int64_t target = targets[row];
    const float scale = row_grad_scale(target, C, 1.0f / float(counts[0]));
    const float* x = logits + row * C;
    float* g = grad_logits + row * C;
    const RowSplit s = split_row(C, x, g);  // no packs unless x and g are equally aligned
    const float4* xv = reinterpret_cast<const float4*>(x + s.head);
    float4* gv = reinterpret_cast<float4*>(g + s.head);
    LogSumExp lse;
#pragma unroll 4
    for (int64_t k = threadIdx.x; k < s.packs; k += THREADS) lse_add4(lse, xv[k]);
    for (int64_t j = threadIdx.x; j < s.head; j += THREADS) lse_add(lse, x[j]);
    for (int64_t j = s.head + 4 * s.packs + threadIdx.x; j < C; j += THREADS) lse_add(lse, x[j]);
    lse = block_logsumexp(lse);
    if (threadIdx.x == 0) store_row(x, target, C, lse, row, row_losses, row_max, row_log_sum);

    // The gradient, from the row this block has just read (in L1/L2).
    const float m = lse.max, log_sum = logf(lse.sum);
    auto grad = [&](float v, int64_t j) { return cross_entropy_grad(v, j, target, m, log_sum, scale); };
#pragma unroll 4
    for (int64_t k = threadIdx.x; k < s.packs; k += THREADS) {
        const float4 v = xv[k];
        const int64_t j = s.head + 4 * k;
        gv[k] = make_float4(grad(v.x, j), grad(v.y, j + 1), grad(v.z, j + 2), grad(v.w, j + 3));
    }
    for (int64_t j = threadIdx.x; j < s.head; j += THREADS) g[j] = grad(x[j], j);
    for (int64_t j = s.head + 4 * s.packs + threadIdx.x; j < C; j += THREADS) g[j] = grad(x[j], j);
}

}  // namespace

// --- the launchers (launchers.h) ---

cudaError_t cross_entropy_fused_forward(
    const void* logits, const int64_t* targets, int64_t* counts, float* row_losses, float* row_max,
    float* row_log_sum, void* loss, void* grad_logits, int64_t N, int64_t C, DType dtype, cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // float32 only
    if (grad_logits == nullptr) return cudaErrorInvalidValue;   // training only
    count_kernel<<<1, 1024, 0, stream>>>(targets, counts, N, C);
    forward_kernel<<<N, THREADS, 0, stream>>>(static_cast<const float*>(logits), targets, counts, row_losses,
                                              row_max, row_log_sum, static_cast<float*>(grad_logits), N, C);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    return cross_entropy_valid_mean(targets, row_losses, counts, loss, N, C, stream);  // counts, then the mean
}

cudaError_t cross_entropy_fused_backward(
    const void* logits, const int64_t* targets, const float* row_max, const float* row_log_sum,
    const int64_t* counts, const void* grad_loss, void* grad_logits, int64_t N, int64_t C, DType dtype,
    cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // float32 only
    return scale_in_place(grad_logits, grad_loss, N * C, dtype, stream);  // common/scale.cu: the forward's, in place
}
