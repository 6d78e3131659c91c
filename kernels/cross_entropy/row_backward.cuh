// The backward of shared_memory and warp_shuffle: the gradient has no
// reduction, so it is one block per row, coalesced element-wise, each thread
// reading the row's statistics once (warp shuffles would change nothing
// here). A header, so that each rung's .cu stands alone.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>
#include "common/dtype.h"
#include "cross_entropy/cross_entropy.cuh"

constexpr int ROW_BACKWARD_THREADS = 256;

// static: each .cu that includes this header has its own copy (no duplicate symbol)
static __global__ void __launch_bounds__(ROW_BACKWARD_THREADS)
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
    for (int64_t j = threadIdx.x; j < C; j += ROW_BACKWARD_THREADS)
        g[j] = cross_entropy_grad(x[j], j, target, m, log_sum, scale);
}

inline cudaError_t cross_entropy_row_backward(const void* logits, const int64_t* targets, const float* row_max,
                                             const float* row_log_sum, const int64_t* counts, const float* grad_loss,
                                             void* grad_logits, int64_t N, int64_t C, DType dtype,
                                             cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // a teaching rung: float32 only
    cross_entropy_shared_memory_backward_kernel<<<N, ROW_BACKWARD_THREADS, 0, stream>>>(
        static_cast<const float*>(logits), targets, row_max, row_log_sum, counts, grad_loss,
        static_cast<float*>(grad_logits), C);
    return cudaGetLastError();
}
