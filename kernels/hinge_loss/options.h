// Launchers of hinge_loss with losslab.nn's options (losslab.nn.functional.hinge_loss), defined by
// the vectorized and fused rungs, which also build their ladder launchers (launchers.h) on
// them. Kept apart from launchers.h so that its contract (what the simulator's driver and the
// exported solutions link) is unchanged. Plain C++, no torch headers.
//
//   term_ij = max(0, 1 - input_ij * target_j)          input (B, D), target (D,)
//
// reduction none keeps the terms; sum and mean add them and divide by `divisor` (1, B * D).
// A target of the input's shape is the case B = 1, D = its number of elements.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>
#include "common/dtype.h"

typedef cudaError_t hinge_loss_options_forward_fn(
    const void* input,       // (B, D) of dtype
    const void* target,      // (D,) of dtype
    float* partials,         // (HINGE_LOSS_MAX_PARTIALS + 4,) scratch: the blocks' sums, then the ticket
    void* loss,              // () of dtype: sum / divisor (unwritten when elementwise is given)
    void* elementwise,       // (B, D) of dtype: each term (reduction none), or null
    void* grad_input,        // (B, D) of dtype: dL/dinput for grad_loss = 1 (fused only), or null
    int64_t B, int64_t D, float divisor, DType dtype, cudaStream_t stream);

typedef cudaError_t hinge_loss_options_backward_fn(
    const void* input,       // (B, D) of dtype
    const void* target,      // (D,) of dtype
    const void* grad_loss,   // () of dtype, read when grad_terms is null
    const void* grad_terms,  // (B, D) of dtype: the upstream gradient of reduction none, or null
    void* grad_input,        // (B, D) of dtype: written
    int64_t B, int64_t D, float divisor, DType dtype, cudaStream_t stream);

hinge_loss_options_forward_fn hinge_loss_vectorized_options_forward;    // vectorized.cu
hinge_loss_options_backward_fn hinge_loss_vectorized_options_backward;  // vectorized.cu
hinge_loss_options_forward_fn hinge_loss_fused_options_forward;         // fused.cu: requires grad_input
