// naive: one thread per row, looping over the row -- the formula written down
// directly, with a one-pass (online) log-sum-exp. Its flaw: neighbouring
// threads read addresses C floats apart, so every warp-wide load touches 32
// different cache lines (uncoalesced), and only N threads exist to hide latency.
#include "cross_entropy/cross_entropy.cuh"
#include "cross_entropy/launchers.h"

// Launch knobs (losslab/build/knobs.py): -DLOSSLAB_CROSS_ENTROPY_NAIVE_<KNOB>=<value> builds another one.
#ifndef LOSSLAB_CROSS_ENTROPY_NAIVE_THREADS
#define LOSSLAB_CROSS_ENTROPY_NAIVE_THREADS 256  // threads per block: 32 64 128 256 512 1024
#endif
constexpr int THREADS = LOSSLAB_CROSS_ENTROPY_NAIVE_THREADS;
static_assert(THREADS >= 32 && THREADS <= 1024 && THREADS % 32 == 0,
              "LOSSLAB_CROSS_ENTROPY_NAIVE_THREADS: a multiple of 32 from 32 to 1024 (whole warps)");

__global__ void cross_entropy_naive_forward_kernel(const float* __restrict__ logits,     // (N, C)
                                                   const int64_t* __restrict__ targets,  // (N,)
                                                   float* __restrict__ row_losses,       // (N,)
                                                   float* __restrict__ row_max,          // (N,)
                                                   float* __restrict__ row_log_sum,      // (N,)
                                                   int64_t N, int64_t C) {
    const int64_t row = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
    if (row >= N) return;
    const float* x = logits + row * C;
    LogSumExp lse;
    for (int64_t j = 0; j < C; ++j) lse_add(lse, x[j]);
    store_row(x, targets[row], C, lse, row, row_losses, row_max, row_log_sum);
}

__global__ void cross_entropy_naive_backward_kernel(const float* __restrict__ logits,       // (N, C)
                                                    const int64_t* __restrict__ targets,    // (N,)
                                                    const float* __restrict__ row_max,      // (N,)
                                                    const float* __restrict__ row_log_sum,  // (N,)
                                                    const int64_t* __restrict__ counts,     // (2,)
                                                    const float* __restrict__ grad_loss,    // ()
                                                    float* __restrict__ grad_logits,        // (N, C)
                                                    int64_t N, int64_t C) {
    const int64_t row = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
    if (row >= N) return;
    const int64_t target = targets[row];
    const float scale = row_grad_scale(target, C, *grad_loss / float(counts[0]));
    const float m = row_max[row], log_sum = row_log_sum[row];
    for (int64_t j = 0; j < C; ++j) {
        const int64_t i = row * C + j;
        grad_logits[i] = cross_entropy_grad(logits[i], j, target, m, log_sum, scale);
    }
}

cudaError_t cross_entropy_naive_forward(const void* logits, const int64_t* targets, int64_t* counts,
                                        float* row_losses, float* row_max, float* row_log_sum, void* loss,
                                        void* /*grad_logits: not fused*/, int64_t N, int64_t C, DType dtype,
                                        cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // a teaching rung: float32 only
    const int64_t blocks = (N + THREADS - 1) / THREADS;
    cross_entropy_naive_forward_kernel<<<blocks, THREADS, 0, stream>>>(
        static_cast<const float*>(logits), targets, row_losses, row_max, row_log_sum, N, C);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    return cross_entropy_valid_mean(targets, row_losses, counts, loss, N, C, stream);
}

cudaError_t cross_entropy_naive_backward(const void* logits, const int64_t* targets, const float* row_max,
                                         const float* row_log_sum, const int64_t* counts, const void* grad_loss,
                                         void* grad_logits, int64_t N, int64_t C, DType dtype,
                                         cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // a teaching rung: float32 only
    const int64_t blocks = (N + THREADS - 1) / THREADS;
    cross_entropy_naive_backward_kernel<<<blocks, THREADS, 0, stream>>>(
        static_cast<const float*>(logits), targets, row_max, row_log_sum, counts,
        static_cast<const float*>(grad_loss), static_cast<float*>(grad_logits), N, C);
    return cudaGetLastError();
}
