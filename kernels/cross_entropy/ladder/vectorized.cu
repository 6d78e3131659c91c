// vectorized: warp_shuffle reads one float per load instruction, so few bytes
// are in flight per thread. Here each load and store moves a float4 (16 bytes,
// one LDG.E.128/STG.E.128), forward and backward. 16-byte accesses must be
// aligned: a row that does not start on a 16-byte boundary (odd C, a sliced
// input) takes a scalar head up to the first boundary and a scalar tail.
#include "common/row_split.cuh"
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
