// Launchers of smooth_l1_loss with PyTorch's options (losslab.nn.functional.smooth_l1_loss and
// huber_loss), defined by the vectorized and fused rungs. They take any shape: these launchers see
// both tensors flat, n elements. Kept apart from launchers.h so that its contract (what a custom
// variant defines, what the exercises link) is unchanged. Plain C++, no torch headers.
//
//   term_i = factor * smooth_l1(input_i - target_i; beta)   dterm/dinput_i = factor * slope(...)
//
// (smooth_l1_loss.cuh): F.smooth_l1_loss is factor 1, F.huber_loss beta = factor = delta.
// reduction none keeps the terms; sum and mean add them and divide by `divisor`
// (1, n), a number the host knows.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>
#include "common/dtype.h"

constexpr int SMOOTH_L1_LOSS_MAX_BLOCKS = 1024;  // the forward's partial sums, at most

typedef cudaError_t smooth_l1_loss_options_forward_fn(
    const void* input,       // (n,) of dtype
    const void* target,      // (n,) of dtype
    float* partials,         // (SMOOTH_L1_LOSS_MAX_BLOCKS + 4,) scratch: the blocks' sums, then the ticket
    void* loss,              // () of dtype: sum / divisor (unwritten when elementwise is given)
    void* elementwise,       // (n,) of dtype: each term (reduction none), or null
    void* grad_input,        // (n,) of dtype: dL/dinput for grad_loss = 1 (fused only), or null
    int64_t n, float divisor, float beta, float factor, DType dtype, cudaStream_t stream);

typedef cudaError_t smooth_l1_loss_options_backward_fn(
    const void* input,         // (n,) of dtype
    const void* target,        // (n,) of dtype
    const void* grad_loss,     // () of dtype, read when grad_terms is null
    const void* grad_terms,    // (n,) of dtype: the upstream gradient of reduction none, or null
    void* grad_input,          // (n,) of dtype: written
    int64_t n, float divisor, float beta, float factor, DType dtype, cudaStream_t stream);

smooth_l1_loss_options_forward_fn smooth_l1_loss_vectorized_options_forward;    // vectorized.cu
smooth_l1_loss_options_backward_fn smooth_l1_loss_vectorized_options_backward;  // vectorized.cu
smooth_l1_loss_options_forward_fn smooth_l1_loss_fused_options_forward;         // fused.cu: requires grad_input
