// Host launchers of every smooth_l1_loss rung, declared once: every rung has the same
// forward and the same backward signature (the typedefs below), so the binding,
// the exported solutions and custom variants all derive from these two lines.
// Plain C++, no torch headers. Pointers are device pointers to contiguous
// row-major data; each launcher enqueues its kernels on `stream` and returns
// the launch status: the host makes one call per forward and one per backward.
// The loss and grad_loss have the inputs' dtype (no conversion on the host).
// The operator rungs (vectorized, fused) take float32, bfloat16 and float16;
// the teaching ladder's (ladder/) float32 only, cudaErrorInvalidValue otherwise.
// KernelBench's inputs are (B, D); the loss is the mean over all B x D elements.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>
#include "common/dtype.h"

typedef cudaError_t smooth_l1_loss_forward_fn(
    const void* predictions,  // (B, D) of dtype
    const void* targets,      // (B, D) of dtype
    float* row_partials,      // (B + 4,) scratch, 16-byte aligned: each row's sum in the first B; the last 16 bytes
                              // are the launcher's (a one-kernel forward's ticket while a graph is captured:
                              // common/stream_workspace.cuh)
    void* loss,               // () of dtype: sum / (B D)
    void* grad_predictions,   // (B, D) of dtype: dL/dp for grad_loss = 1, written by a rung that fuses the
                              // gradient into its forward (it requires one); the others ignore it (null)
    int64_t B, int64_t D, DType dtype, cudaStream_t stream);

typedef cudaError_t smooth_l1_loss_backward_fn(
    const void* predictions,  // (B, D) of dtype (unread, may be null, where the forward wrote the gradient)
    const void* targets,      // (B, D) of dtype (idem)
    const void* grad_loss,    // () of dtype
    void* grad_predictions,   // (B, D) of dtype: written; where the forward wrote it, scaled in place
    int64_t B, int64_t D, DType dtype, cudaStream_t stream);

// The rungs, in ladder order (an X-macro: the binding binds each one).
#define SMOOTH_L1_LOSS_RUNGS(X) X(vectorized) X(fused)
#define SMOOTH_L1_LOSS_DECLARE(rung) \
    smooth_l1_loss_forward_fn smooth_l1_loss_##rung##_forward;                                   \
    smooth_l1_loss_backward_fn smooth_l1_loss_##rung##_backward;
SMOOTH_L1_LOSS_RUNGS(SMOOTH_L1_LOSS_DECLARE)
#undef SMOOTH_L1_LOSS_DECLARE
