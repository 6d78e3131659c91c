// Launchers of mse_loss with PyTorch's options (losslab.nn.functional.mse_loss), defined by
// the vectorized and fused rungs. F.mse_loss takes any shape: these launchers see both
// tensors flat, n elements. Kept apart from launchers.h so that its contract (what a
// custom variant defines, what the exercises link) is unchanged. Plain C++, no torch headers.
//
//   term_i = (input_i - target_i)^2          dterm/dinput_i = 2 (input_i - target_i)
//
// reduction none keeps the terms; sum and mean add them and divide by `divisor`
// (1, n), a number the host knows.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>
#include "common/dtype.h"

constexpr int MSE_LOSS_MAX_BLOCKS = 1024;  // the forward's partial sums, at most

typedef cudaError_t mse_loss_options_forward_fn(
    const void* input,       // (n,) of dtype
    const void* target,      // (n,) of dtype
    float* partials,         // (MSE_LOSS_MAX_BLOCKS + 4,) scratch: the blocks' sums, then the ticket
    void* loss,              // () of dtype: sum / divisor (unwritten when elementwise is given)
    void* elementwise,       // (n,) of dtype: each term (reduction none), or null
    void* grad_input,        // (n,) of dtype: dL/dinput for grad_loss = 1 (fused only), or null
    int64_t n, float divisor, DType dtype, cudaStream_t stream);

typedef cudaError_t mse_loss_options_backward_fn(
    const void* input,         // (n,) of dtype
    const void* target,        // (n,) of dtype
    const void* grad_loss,     // () of dtype, read when grad_terms is null
    const void* grad_terms,    // (n,) of dtype: the upstream gradient of reduction none, or null
    void* grad_input,          // (n,) of dtype: written
    int64_t n, float divisor, DType dtype, cudaStream_t stream);

mse_loss_options_forward_fn mse_loss_vectorized_options_forward;    // vectorized.cu
mse_loss_options_backward_fn mse_loss_vectorized_options_backward;  // vectorized.cu
mse_loss_options_forward_fn mse_loss_fused_options_forward;         // fused.cu: requires grad_input
