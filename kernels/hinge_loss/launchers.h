// Host launchers of every hinge_loss rung, declared once: every rung has the same
// forward and the same backward signature (the typedefs below), so the binding, the
// exported solutions and the simulator's driver all derive from these two lines.
// Plain C++, no torch headers. predictions are (B, D) contiguous row-major; targets
// are (D,): targets[j] multiplies column j of every row (the reference's broadcast of
// a (D,) tensor over a (B, D) one). Each launcher enqueues its kernels on `stream`
// and returns the launch status. The loss and grad_loss have the inputs' dtype. The
// teaching rungs (naive, shared_memory, warp_shuffle) take float32 only and return
// cudaErrorInvalidValue for another dtype.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>
#include "common/dtype.h"

// The most partial sums a forward writes, besides naive's one per row: the scratch
// holds max(B, HINGE_LOSS_MAX_PARTIALS) + 4 floats.
constexpr int HINGE_LOSS_MAX_PARTIALS = 1024;

typedef cudaError_t hinge_loss_forward_fn(
    const void* predictions,  // (B, D) of dtype
    const void* targets,      // (D,) of dtype: -1 or +1 (any value is computed as the reference does)
    float* partials,          // (max(B, HINGE_LOSS_MAX_PARTIALS) + 4,) scratch, 16-byte aligned: the partial
                              // sums; the last 16 bytes are the launcher's (a one-kernel forward's ticket while a
                              // graph is captured: common/stream_workspace.cuh)
    void* loss,               // () of dtype: the mean over B * D elements
    void* grad_predictions,   // (B, D) of dtype: dL/dp for grad_loss = 1, written by a rung that fuses the
                              // gradient into its forward (it requires one); the others ignore it (null)
    int64_t B, int64_t D, DType dtype, cudaStream_t stream);

typedef cudaError_t hinge_loss_backward_fn(
    const void* predictions,  // (B, D) of dtype (unread, may be null, where the forward wrote the gradient)
    const void* targets,      // (D,) of dtype (idem)
    const void* grad_loss,    // () of dtype
    void* grad_predictions,   // (B, D) of dtype: written; where the forward wrote it, scaled in place
    int64_t B, int64_t D, DType dtype, cudaStream_t stream);

// The rungs, in ladder order (an X-macro: the binding binds each one).
#define HINGE_LOSS_RUNGS(X) X(naive) X(shared_memory) X(warp_shuffle) X(vectorized) X(fused)
#define HINGE_LOSS_DECLARE(rung) \
    hinge_loss_forward_fn hinge_loss_##rung##_forward; hinge_loss_backward_fn hinge_loss_##rung##_backward;
HINGE_LOSS_RUNGS(HINGE_LOSS_DECLARE)
#undef HINGE_LOSS_DECLARE
