// Host launchers of every cross_entropy rung, declared once: every rung has the
// same forward and the same backward signature (the typedefs below), so the
// binding, the exported solutions and custom variants all derive from these
// two lines. Plain C++, no torch headers. Pointers are device pointers to
// contiguous data: logits (the reference's `predictions`) row-major, targets
// int64 class indices. Each launcher enqueues all its stages on `stream` and
// returns the launch status: the host makes one call per forward and one per
// backward. The loss and grad_loss have the logits' dtype (no conversion on
// the host). The teaching rungs (naive, shared_memory, warp_shuffle) take
// float32 only and return cudaErrorInvalidValue for another dtype.
//
// A forward writes per-row losses (NaN on a row whose target is out of range)
// and the two parts of each row's log-sum-exp (max and log of the sum), counts
// the targets (rows with a target in [0, C); targets outside [0, C) that are
// not ignore_index) and writes the 0-d loss: the teaching rungs with a row
// kernel, then cross_entropy_valid_mean; vectorized in one kernel whose last
// block writes the loss. The backward reads the row statistics and counts[0].
#pragma once
#include <cstdint>
#include <cuda_runtime.h>
#include "common/dtype.h"

typedef cudaError_t cross_entropy_forward_fn(
    const void* logits,      // (N, C) of dtype
    const int64_t* targets,  // (N,) class indices, ignore_index = -100
    int64_t* counts,         // (4,) written: n_valid, number out of range (the backward reads n_valid); the last
                             // 16 bytes are the launcher's scratch (common/stream_workspace.cuh: while a graph is
                             // captured, a one-kernel forward counts in the whole 32 bytes and keeps its ticket there)
    float* row_losses,       // (N,) scratch, 16-byte aligned: each row's loss (or each block's)
    float* row_max,          // (N,) for the backward: each row's max logit
    float* row_log_sum,      // (N,) for the backward: log sum_j exp(x_j - max)
    void* loss,              // () of dtype: sum over valid rows / n_valid; NaN if a target is out of range
    void* grad_logits,       // (N, C) of dtype: dL/dx for grad_loss = 1, written by a rung that fuses the
                             // gradient into its forward (it requires one, and leaves row_max and
                             // row_log_sum unwritten); the others ignore it (null)
    int64_t N, int64_t C, DType dtype, cudaStream_t stream);

typedef cudaError_t cross_entropy_backward_fn(
    const void* logits,        // (N, C) of dtype (unread, may be null, where the forward wrote the gradient)
    const int64_t* targets,    // (N,) (idem)
    const float* row_max,      // (N,) (idem)
    const float* row_log_sum,  // (N,) (idem)
    const int64_t* counts,     // (4,) (idem)
    const void* grad_loss,     // () of dtype
    void* grad_logits,         // (N, C) of dtype: written; where the forward wrote it, scaled in place
    int64_t N, int64_t C, DType dtype, cudaStream_t stream);

// The rungs, in ladder order (an X-macro: the binding binds each one).
#define CROSS_ENTROPY_RUNGS(X) X(naive) X(shared_memory) X(warp_shuffle) X(vectorized) X(fused) X(cluster)
#define CROSS_ENTROPY_DECLARE(rung)                                 \
    cross_entropy_forward_fn cross_entropy_##rung##_forward;       \
    cross_entropy_backward_fn cross_entropy_##rung##_backward;
CROSS_ENTROPY_RUNGS(CROSS_ENTROPY_DECLARE)
#undef CROSS_ENTROPY_DECLARE

// Stages a rung's launcher may run (count_targets.cu, valid_mean.cu); the host never calls them.
// count_targets: add the targets' counts from many blocks (int atomics: exact, so deterministic) into
// *counters, the stream's workspace (or `counts` while a graph is captured), for a rung that needs n_valid
// before its row kernel (fused). That kernel's finish_mean copies them to `counts` and zeroes the workspace.
cudaError_t cross_entropy_count_targets(const int64_t* targets,  // (N,)
                                        int64_t* counts,         // (4,) the forward's
                                        int64_t N, int64_t C, cudaStream_t stream,
                                        int64_t** counters);     // set: (4,) n_valid, out of range, the ticket
// valid_mean: one block counts the targets and adds the row losses in a fixed order (the teaching rungs'
// second kernel).
cudaError_t cross_entropy_valid_mean(const int64_t* targets,   // (N,)
                                     const float* row_losses,  // (N,)
                                     int64_t* counts,          // (4,) written: n_valid, number out of range
                                     void* loss,               // () float32 (the teaching rungs' dtype)
                                     int64_t N, int64_t C, cudaStream_t stream);
