// vectorized: warp_shuffle reads one float per load instruction, so few bytes
// are in flight per thread. Here each load and store moves a float4 (16 bytes,
// one LDG.E.128/STG.E.128), forward and backward. 16-byte accesses must be
// aligned: a row that does not start on a 16-byte boundary (odd C, a sliced
// input) takes a scalar head up to the first boundary and a scalar tail. In the SASS
// the forward's loop (unrolled 4 times, in 32 registers) keeps two LDG.E.128 in flight
// a thread, 32 bytes, where warp_shuffle's keeps four 4-byte loads, 16.
#include "common/row_split.cuh"
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
    const RowSplit s = split_row(C, x);  // s.head scalars, s.packs float4s, then the tail
    const float4* xv = reinterpret_cast<const float4*>(x + s.head);
    LogSumExp lse;
#pragma unroll 4
    for (int64_t k = threadIdx.x; k < s.packs; k += THREADS) lse_add4(lse, xv[k]);
    for (int64_t j = threadIdx.x; j < s.head; j += THREADS) lse_add(lse, x[j]);
    for (int64_t j = s.head + 4 * s.packs + threadIdx.x; j < C; j += THREADS) lse_add(lse, x[j]);
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
    const RowSplit s = split_row(C, x, g);  // no packs unless x and g are equally aligned
    const float4* xv = reinterpret_cast<const float4*>(x + s.head);
    float4* gv = reinterpret_cast<float4*>(g + s.head);
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

cudaError_t cross_entropy_vectorized_forward(
    const void* logits, const int64_t* targets, int64_t* counts, float* row_losses, float* row_max,
    float* row_log_sum, void* loss, void* /*grad_logits*/, int64_t N, int64_t C, DType dtype, cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // float32 only
    forward_kernel<<<N, THREADS, 0, stream>>>(
        static_cast<const float*>(logits), targets, row_losses, row_max, row_log_sum, N, C);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    return cross_entropy_valid_mean(targets, row_losses, counts, loss, N, C, stream);  // counts, then the mean
}

cudaError_t cross_entropy_vectorized_backward(
    const void* logits, const int64_t* targets, const float* row_max, const float* row_log_sum,
    const int64_t* counts, const void* grad_loss, void* grad_logits, int64_t N, int64_t C, DType dtype,
    cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // float32 only
    backward_kernel<<<N, THREADS, 0, stream>>>(
        static_cast<const float*>(logits), targets, row_max, row_log_sum, counts,
        static_cast<const float*>(grad_loss), static_cast<float*>(grad_logits), N, C);
    return cudaGetLastError();
}
