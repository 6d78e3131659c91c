// The backward of shared_memory and warp_shuffle: the gradient has no
// reduction, so it is a flat, coalesced element-wise pass (warp shuffles would
// change nothing here). A header, so that each rung's .cu stands alone.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cuda_runtime.h>
#include "common/dtype.h"
#include "kl_div/kl_div.cuh"

constexpr int ELEMENTWISE_THREADS = 256;

// static: each .cu that includes this header has its own copy (no duplicate symbol)
static __global__ void __launch_bounds__(ELEMENTWISE_THREADS)
kl_div_shared_memory_backward_kernel(const float* __restrict__ predictions,  // (B, D)
                                     const float* __restrict__ targets,      // (B, D)
                                     const float* __restrict__ grad_loss,    // ()
                                     float* __restrict__ grad_predictions,   // (B, D)
                                     int64_t n, float B) {
    const float scaled_grad = *grad_loss / B;
    const int64_t stride = int64_t(gridDim.x) * ELEMENTWISE_THREADS;
    for (int64_t i = blockIdx.x * int64_t(ELEMENTWISE_THREADS) + threadIdx.x; i < n; i += stride)
        grad_predictions[i] = kl_div_grad(predictions[i], targets[i], scaled_grad);
}

inline cudaError_t kl_div_elementwise_backward(const void* predictions, const void* targets, const float* grad_loss,
                                               void* grad_predictions, int64_t B, int64_t D, DType dtype,
                                               cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // a teaching rung: float32 only
    const int64_t n = B * D;
    const int64_t blocks = std::min<int64_t>((n + ELEMENTWISE_THREADS - 1) / ELEMENTWISE_THREADS, 1 << 20);
    kl_div_shared_memory_backward_kernel<<<blocks, ELEMENTWISE_THREADS, 0, stream>>>(
        static_cast<const float*>(predictions), static_cast<const float*>(targets), grad_loss,
        static_cast<float*>(grad_predictions), n, float(B));
    return cudaGetLastError();
}
