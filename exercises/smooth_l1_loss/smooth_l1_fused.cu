// Exercise 22 -- fuse the gradient into the forward (smooth_l1_loss's fused rung).
//
// Training runs the forward, then the backward, which reads p and t again to
// form dL/dp: five passes over B x D memory (read p, t; read p, t, write the
// gradient). The fused rung writes the gradient while the forward has p and t
// in registers anyway, so the backward only scales it by grad_loss in place
// (and does nothing when grad_loss is 1, as in loss.backward()): three passes.
//
// Contract: the forward gets grad_predictions (B, D), never null here, and
// must leave in it dL/dp for grad_loss = 1, where L is the mean of
// smooth_l1_term(p, t) over all B x D elements: with d = p - t, 0.5 d^2 where
// |d| < 1, |d| - 0.5 elsewhere (beta = 1; smooth_l1_loss/smooth_l1_loss.cuh has
// the term and its derivative; inv_n = 1 / (B D)), every element written
// exactly once, while reading each p and t only once. The backward below scales
// it by grad_loss and is written for you.
//
// Grade it from the shell: python -m losslab grade exercises/smooth_l1_loss/smooth_l1_fused.cu
// (in Python: losslab.teach.exercises.grade("smooth_l1_fused")). Done when it is green.
#include "smooth_l1_loss/smooth_l1_loss.cuh"
#include "common/reduce.cuh"
#include "common/scale.cuh"
#include "common/sum_partials.cuh"
#include "smooth_l1_loss/launchers.h"

constexpr int THREADS = 256;

__global__ void __launch_bounds__(THREADS)
fused_forward_kernel(const float* __restrict__ predictions,  // (B, D)
                     const float* __restrict__ targets,      // (B, D)
                     float* __restrict__ row_partials,       // (B,)
                     float* __restrict__ grad_predictions,   // (B, D): dL/dp for grad_loss = 1
                     int64_t D, float inv_n) {
    const int64_t row_start = blockIdx.x * D;
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < D; j += THREADS) {
        const float p = predictions[row_start + j], t = targets[row_start + j];
        sum += smooth_l1_term(p, t);
        // FILL ME IN (1 line): the gradient of this element (contract above).
    }
    sum = block_reduce_sum(sum);
    if (threadIdx.x == 0) row_partials[blockIdx.x] = sum;
}

cudaError_t smooth_l1_loss_custom_forward(const void* predictions, const void* targets, float* row_partials,
                                          void* loss, void* grad_predictions, int64_t B, int64_t D, DType dtype,
                                          cudaStream_t stream) {
    if (dtype != DType::float32 || grad_predictions == nullptr) return cudaErrorInvalidValue;
    fused_forward_kernel<<<B, THREADS, 0, stream>>>(static_cast<const float*>(predictions),
                                                    static_cast<const float*>(targets), row_partials,
                                                    static_cast<float*>(grad_predictions), D,
                                                    1.0f / (float(B) * float(D)));
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    return launch_sum_partials(row_partials, B, float(B) * float(D), loss, stream);  // the mean over B D
}

// The forward wrote dL/dp for grad_loss = 1: scale it in place by grad_loss (read on the device).
cudaError_t smooth_l1_loss_custom_backward(const void* /*predictions: unread*/, const void* /*targets: unread*/,
                                           const void* grad_loss, void* grad_predictions, int64_t B, int64_t D,
                                           DType dtype, cudaStream_t stream) {
    return scale_in_place(grad_predictions, grad_loss, B * D, dtype, stream);
}
