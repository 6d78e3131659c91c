// Host launchers of the vocabulary-parallel cross-entropy (losslab/distributed/): one kernel
// per step, plain C++, no torch headers. Each rank holds the logits of one contiguous
// slice of the vocabulary, columns [vocab_start, vocab_start + V) of the full [N, vocab_size]
// logits; `targets` are global class ids. Pointers are device pointers to contiguous data;
// each launcher enqueues one kernel on `stream` and returns the launch status.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>
#include "common/dtype.h"

// Forward, before the one collective: each row of this rank's slice reduced to four floats,
// (max, sum of exp(x - max), the target's logit where this slice holds the target else 0,
// the sum of the logits).
cudaError_t vocab_parallel_statistics(
    const void* logits,      // (N, V) of dtype: this rank's slice
    const int64_t* targets,  // (N,) global class ids
    float* statistics,       // (N, 4) written
    int64_t N, int64_t V, int64_t vocab_start, DType dtype, cudaStream_t stream);

// Forward, after the collective: every rank's statistics of each row, as the all-gather stacks
// them, combined into the row's global max M = max_r m_r, log S with S = sum_r s_r exp(m_r - M),
// its loss (M - x_t) + log S (label smoothing eps: (1 - eps) times that plus
// eps ((M - sum_j x_j / vocab_size) + log S); 0 where the target is ignore_index, NaN where it
// is outside [0, vocab_size)) and its weight (1 kept, 0 ignored, NaN where the loss is NaN).
cudaError_t vocab_parallel_combine(
    const float* gathered,   // (W, N, 4): statistics of the W ranks
    const int64_t* targets,  // (N,) global class ids
    float* out,              // (4, N) written: row max, row log-sum, row loss, row weight
    int64_t W, int64_t N, int64_t vocab_size, int64_t ignore_index, float label_smoothing,
    cudaStream_t stream);

// Backward, no collective: this slice's gradient from the saved global log-sum-exp,
//   dL/dx_j = (exp(x_j - max - log_sum) - (1 - eps) [j == target] - eps / vocab_size) * scale,
//   scale = row_weight[row] * grad_loss[row * grad_loss_stride].
cudaError_t vocab_parallel_gradient(
    const void* logits,          // (N, V) of dtype: this rank's slice
    const int64_t* targets,      // (N,) global class ids
    const float* row_max,        // (N,) the global max of each row
    const float* row_log_sum,    // (N,) log of the global sum of exp(x - max)
    const float* row_weight,     // (N,) 0 on an ignored row; 1 / n_valid (mean) or 1 (sum, none)
    const void* grad_loss,       // () or (N,) of dtype: the loss's gradient
    int64_t grad_loss_stride,    // 0 for a 0-d grad_loss, 1 for reduction "none"
    void* grad_logits,           // (N, V) of dtype written
    int64_t N, int64_t V, int64_t vocab_start, float target_weight /* 1 - eps */,
    float smoothing_per_class /* eps / vocab_size */, DType dtype, cudaStream_t stream);
