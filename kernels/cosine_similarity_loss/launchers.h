// Host launchers of every cosine_similarity_loss rung, declared once: every rung has
// the same forward and the same backward signature (the typedefs below), so the
// binding, the exported solutions and custom variants all derive from these two
// lines. Plain C++, no torch headers. Pointers are device pointers to contiguous
// row-major data; each launcher enqueues its kernels on `stream` and returns the
// launch status: the host makes one call per forward and one per backward. The loss
// and grad_loss have the inputs' dtype (no conversion on the host). The teaching
// rungs (kernels/cosine_similarity_loss/ladder/) take float32 only, write dL/dp only
// (grad_targets must be null) and return cudaErrorInvalidValue otherwise.
//
// loss = mean over the B rows of 1 - cos(p_i, t_i), cos with each norm clamped to eps
// (cosine.cuh); the forward keeps each row's three dot products for the backward.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>
#include "common/dtype.h"

typedef cudaError_t cosine_similarity_loss_forward_fn(
    const void* predictions,  // (B, D) of dtype
    const void* targets,      // (B, D) of dtype
    float* row_dots,          // (3, B) for the backward: each row's p.t, p.p and t.t (unwritten by a rung
                              // that writes the gradient in its forward)
    float* row_partials,      // (B + 4,) scratch, 16-byte aligned: the 1 - cos of each row (or of each block's
                              // rows) first; the last 16 bytes are the launcher's (a one-kernel forward's
                              // ticket while a graph is captured: common/stream_workspace.cuh)
    void* loss,               // () of dtype: sum of the rows' 1 - cos / B
    void* grad_predictions,   // (B, D) of dtype: dL/dp for grad_loss = 1, written by a rung that fuses the
                              // gradient into its forward (it requires one); the others ignore it (null)
    void* grad_targets,       // (B, D) of dtype or null: dL/dt likewise, where targets need a gradient
    int64_t B, int64_t D, float eps, DType dtype, cudaStream_t stream);

typedef cudaError_t cosine_similarity_loss_backward_fn(
    const void* predictions,  // (B, D) of dtype (unread, may be null, where the forward wrote the gradient)
    const void* targets,      // (B, D) of dtype (idem)
    const float* row_dots,    // (3, B) from the forward (idem)
    const void* grad_loss,    // () of dtype
    void* grad_predictions,   // (B, D) of dtype: written; where the forward wrote it, scaled in place
    void* grad_targets,       // (B, D) of dtype or null: likewise
    int64_t B, int64_t D, float eps, DType dtype, cudaStream_t stream);

// The rungs, in ladder order (an X-macro: the binding binds each one).
#define COSINE_SIMILARITY_LOSS_RUNGS(X) X(naive) X(shared_memory) X(warp_shuffle) X(vectorized) X(fused)
#define COSINE_SIMILARITY_LOSS_DECLARE(rung)                                     \
    cosine_similarity_loss_forward_fn cosine_similarity_loss_##rung##_forward;   \
    cosine_similarity_loss_backward_fn cosine_similarity_loss_##rung##_backward;
COSINE_SIMILARITY_LOSS_RUNGS(COSINE_SIMILARITY_LOSS_DECLARE)
#undef COSINE_SIMILARITY_LOSS_DECLARE
