// Launchers of cross_entropy with PyTorch's options (losslab.nn.functional.cross_entropy),
// defined by the vectorized and fused rungs only: per-class weights, any ignore_index,
// label smoothing, class-probability targets and the reductions none/sum/mean. The
// teaching rungs keep the canonical definition of launchers.h; these are kept apart from
// it so that its contract (what a custom variant defines, what the exercises link) is
// unchanged. Plain C++, no torch headers; device pointers to contiguous row-major data.
//
// With a_j the weight the row's target puts on class j,
//   class indices t:        a_j = (1 - eps) * w_t * [j == t] + eps / C * w_j    (0 on an ignored row)
//   class probabilities q:  a_j = w_j * ((1 - eps) * q_j + eps / C)
// a row's loss is sum_j a_j * (logsumexp(x) - x_j) and its gradient
// dL/dx_j = (softmax(x)_j * A - a_j) * scale with A = sum_j a_j. "mean" divides by
// the denominator PyTorch uses: the sum of w_t over the rows not ignored (class indices;
// their count without weights), the number of rows (class probabilities).
#pragma once
#include <cstdint>
#include <cuda_runtime.h>
#include "common/dtype.h"

enum CrossEntropyReduction : int { CE_NONE = 0, CE_MEAN = 1, CE_SUM = 2 };  // torch's Reduction enum

// The prepare stage, run first by an options forward that needs the denominators before its
// rows (fused, for the mean's scale of its gradient; either rung with weights, whose sum the
// label smoothing needs): denominators = {the mean's denominator, sum_j w_j}.
typedef cudaError_t cross_entropy_options_prepare_fn(
    const int64_t* targets,  // (N,) class indices, or null for class-probability targets
    const float* weight,     // (C,) float32, or null (every weight 1)
    float* denominators,     // (2,) float32: written
    int64_t N, int64_t C, int64_t ignore_index, cudaStream_t stream);

// The rows, and the block that finishes last writes the 0-d loss (common/last_block.cuh):
// without weights, vectorized is one kernel, counting the mean's denominator as it goes.
// vectorized writes row_max, row_log_sum and row_coef (A) for its backward where they are
// given; fused (reduction sum or mean only) writes the gradient for grad_loss = 1 instead.
typedef cudaError_t cross_entropy_options_forward_fn(
    const void* logits,           // (N, C) of dtype
    const int64_t* targets,       // (N,) class indices, or null
    const void* probs,            // (N, C) of dtype: class probabilities, or null
    const float* weight,          // (C,) float32, or null
    float* denominators,          // (2,) written, for the backward: the mean's denominator, sum_j w_j
    float* row_losses,            // (N,) each row's loss: written for reduction none; null otherwise
    float* row_max,               // (N,) for the backward (vectorized), or null: not written
    float* row_log_sum,           // (N,) likewise
    float* row_coef,              // (N,) A, likewise
    float* workspace,             // (2N + 4,) float32 scratch, 16-byte aligned: the blocks' partials
                                  // (and, while a graph is captured, the ticket in its first word)
    void* loss,                   // () of dtype: sum or mean (unwritten for none)
    void* grad_logits,            // (N, C) of dtype: fused writes dL/dx for grad_loss = 1; null otherwise
    int64_t N, int64_t C, int64_t ignore_index, float label_smoothing, int reduction, DType dtype,
    cudaStream_t stream);

typedef cudaError_t cross_entropy_options_backward_fn(
    const void* logits,           // (N, C) of dtype
    const int64_t* targets,       // (N,) or null
    const void* probs,            // (N, C) of dtype or null
    const float* weight,          // (C,) float32 or null
    const float* denominators,    // (2,)
    const float* row_max,         // (N,)
    const float* row_log_sum,     // (N,)
    const float* row_coef,        // (N,)
    const float* grad_loss,       // () float32, or (N,) float32 for reduction none
    void* grad_logits,            // (N, C) of dtype: written
    int64_t N, int64_t C, int64_t ignore_index, float label_smoothing, int reduction, DType dtype,
    cudaStream_t stream);

cross_entropy_options_prepare_fn cross_entropy_options_prepare;            // options_prepare.cu
cross_entropy_options_forward_fn cross_entropy_vectorized_options_forward;  // vectorized.cu
cross_entropy_options_backward_fn cross_entropy_vectorized_options_backward;
cross_entropy_options_forward_fn cross_entropy_fused_options_forward;       // fused.cu (sum, mean)
