// Host launchers of every triplet_margin_loss rung, declared once: every rung has the same
// forward and the same backward signature (the typedefs below), so the binding, the exported
// solutions and custom variants all derive from these two lines. Plain C++, no torch headers.
// Pointers are device pointers to contiguous row-major (N, D) data; each launcher enqueues its
// kernels on `stream` and returns the launch status. PyTorch's default options: margin 1,
// p = 2, eps = 1e-6, no swap, mean reduction (options.h has the others):
//
//   d(x, y)_i = || x_i - y_i + eps ||_2        loss = mean_i max(d(a, p)_i - d(a, n)_i + 1, 0)
//
// The loss and grad_loss have the inputs' dtype. The teaching rungs take float32 only and return
// cudaErrorInvalidValue for another dtype. The gradient is the anchor's (the rungs' contract); the
// options launchers write the positive's and the negative's too.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>
#include "common/dtype.h"

typedef cudaError_t triplet_margin_loss_forward_fn(
    const void* anchor,      // (N, D) of dtype
    const void* positive,    // (N, D) of dtype
    const void* negative,    // (N, D) of dtype
    float* row_losses,       // (N + 4,) scratch, 16-byte aligned: each row's loss in the first N; the last
                             // 16 bytes are the launcher's (a one-kernel forward's ticket while a graph is
                             // captured: common/stream_workspace.cuh)
    void* loss,              // () of dtype: sum / N
    void* grad_anchor,       // (N, D) of dtype: dL/da for grad_loss = 1, written by a rung that fuses the
                             // gradient into its forward (it requires one); the others ignore it (null)
    int64_t N, int64_t D, DType dtype, cudaStream_t stream);

typedef cudaError_t triplet_margin_loss_backward_fn(
    const void* anchor,      // (N, D) of dtype (unread, may be null, where the forward wrote the gradient)
    const void* positive,    // (N, D) of dtype (idem)
    const void* negative,    // (N, D) of dtype (idem)
    const void* grad_loss,   // () of dtype
    void* grad_anchor,       // (N, D) of dtype: written; where the forward wrote it, scaled in place
    int64_t N, int64_t D, DType dtype, cudaStream_t stream);

// The rungs, in ladder order (an X-macro: the binding binds each one).
#define TRIPLET_MARGIN_LOSS_RUNGS(X) X(vectorized) X(fused)
#define TRIPLET_MARGIN_LOSS_DECLARE(rung)                                   \
    triplet_margin_loss_forward_fn triplet_margin_loss_##rung##_forward;    \
    triplet_margin_loss_backward_fn triplet_margin_loss_##rung##_backward;
TRIPLET_MARGIN_LOSS_RUNGS(TRIPLET_MARGIN_LOSS_DECLARE)
#undef TRIPLET_MARGIN_LOSS_DECLARE
