// Launchers of kl_div with PyTorch's options (losslab.nn.functional.kl_div), defined by
// the vectorized and fused rungs only. PyTorch's kl_div takes `input` as LOG-probabilities
// (the ladder's launchers.h takes probabilities; so does log_input = 0 here), and any shape:
// these launchers see both tensors flat, n elements. Kept apart from launchers.h so that its
// contract (what a custom variant defines, what the exercises link) is unchanged. Plain C++,
// no torch headers. With x_i = input_i (log_input), else log(input_i):
//
//   term_i = xlogy(t_i, t_i) - t_i * x_i          dterm/dx_i = -t_i
//   term_i = exp(t_i) * (t_i - x_i)  (log_target) dterm/dx_i = -exp(t_i)
//   dterm/dinput_i = dterm/dx_i (log_input), else dterm/dx_i / input_i
//
// reduction none keeps the terms; sum, mean and batchmean add them and divide by
// `divisor` (1, n, the batch size input.size(0)), a shape the host knows.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>
#include "common/dtype.h"

constexpr int KL_DIV_OPTIONS_MAX_BLOCKS = 1024;  // the forward's partial sums, at most

typedef cudaError_t kl_div_options_forward_fn(
    const void* input,       // (n,) of dtype: log-probabilities (probabilities without log_input)
    const void* target,      // (n,) of dtype: probabilities (log-probabilities with log_target)
    float* partials,         // (KL_DIV_OPTIONS_MAX_BLOCKS + 4,) scratch: the blocks' sums, then the ticket
    void* loss,              // () of dtype: sum / divisor (unwritten when elementwise is given)
    void* elementwise,       // (n,) of dtype: each term (reduction none), or null
    void* grad_input,        // (n,) of dtype: dL/dinput for grad_loss = 1 (fused only), or null
    int64_t n, int log_target, int log_input, float divisor, DType dtype, cudaStream_t stream);

typedef cudaError_t kl_div_options_backward_fn(
    const void* input,         // (n,) of dtype, read without log_input only (else may be null)
    const void* target,        // (n,) of dtype
    const void* grad_loss,     // () of dtype, read when grad_terms is null
    const void* grad_terms,    // (n,) of dtype: the upstream gradient of reduction none, or null
    void* grad_input,          // (n,) of dtype: written
    int64_t n, int log_target, int log_input, float divisor, DType dtype, cudaStream_t stream);

kl_div_options_forward_fn kl_div_vectorized_options_forward;    // vectorized.cu
kl_div_options_backward_fn kl_div_vectorized_options_backward;  // vectorized.cu
kl_div_options_forward_fn kl_div_fused_options_forward;         // fused.cu: requires grad_input
