// Host launchers of every cross_entropy rung, declared once: every rung has the
// same forward and the same backward signature (the typedefs below), so the
// binding, the exported solutions and custom variants all derive from these
// two lines. Plain C++, no torch headers. Pointers are device pointers to
// contiguous data: logits (the reference's `predictions`) row-major, targets
// int64 class indices. Each launcher enqueues its kernels on `stream` and
// returns the launch status. The teaching rungs (naive, shared_memory,
// warp_shuffle) take float32 only and return cudaErrorInvalidValue for
// another dtype.
//
// A forward runs in three stages: count_targets writes counts = {rows with a
// target in [0, C), targets outside [0, C) that are not ignore_index}; the
// rung's row kernel writes per-row losses (NaN on a row whose target is out of
// range) and the two parts of each row's log-sum-exp (max and log of the sum);
// valid_mean writes the 0-d loss. The backward reads the row statistics and
// counts[0] back.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>
#include "common/dtype.h"

typedef cudaError_t cross_entropy_forward_fn(
    const void* logits,      // (N, C) of dtype
    const int64_t* targets,  // (N,) class indices, ignore_index = -100
    const int64_t* counts,   // (2,) from count_targets: n_valid, number out of range
    float* row_losses,       // (N,) scratch: each row's loss
    float* row_max,          // (N,) for the backward: each row's max logit
    float* row_log_sum,      // (N,) for the backward: log sum_j exp(x_j - max)
    float* loss,             // () float32: sum over valid rows / n_valid
    void* grad_logits,       // (N, C) of dtype: dL/dx for grad_loss = 1, written by a rung that fuses the
                             // gradient into its forward (it requires one, and leaves row_max and
                             // row_log_sum unwritten); the others ignore it (null)
    int64_t N, int64_t C, DType dtype, cudaStream_t stream);

typedef cudaError_t cross_entropy_backward_fn(
    const void* logits,        // (N, C) of dtype (unread, may be null, where the forward wrote the gradient)
    const int64_t* targets,    // (N,) (idem)
    const float* row_max,      // (N,) (idem)
    const float* row_log_sum,  // (N,) (idem)
    const int64_t* counts,     // (2,) (idem)
    const float* grad_loss,    // () float32
    void* grad_logits,         // (N, C) of dtype: written; where the forward wrote it, scaled in place
    int64_t N, int64_t C, DType dtype, cudaStream_t stream);

// The rungs, in ladder order (an X-macro: the binding binds each one).
#define CROSS_ENTROPY_RUNGS(X) X(naive) X(shared_memory) X(warp_shuffle) X(vectorized) X(fused) X(cluster)
#define CROSS_ENTROPY_DECLARE(rung)                                 \
    cross_entropy_forward_fn cross_entropy_##rung##_forward;       \
    cross_entropy_backward_fn cross_entropy_##rung##_backward;
CROSS_ENTROPY_RUNGS(CROSS_ENTROPY_DECLARE)
#undef CROSS_ENTROPY_DECLARE

// The stages every forward shares (count_targets.cu, valid_mean.cu).
cudaError_t cross_entropy_count_targets(const int64_t* targets,  // (N,)
                                        int64_t* counts,         // (2,) written
                                        int64_t N, int64_t C, cudaStream_t stream);
cudaError_t cross_entropy_valid_mean(const float* row_losses,  // (N,)
                                     const int64_t* counts,    // (2,) read: n_valid
                                     float* loss,              // ()
                                     int64_t N, cudaStream_t stream);
