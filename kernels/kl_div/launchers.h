// Host launchers of every kl_div rung: plain C++, no torch headers, so the
// binding and each rung's .cu compile on their own. Pointers are device
// pointers to contiguous row-major data; each launcher enqueues its kernels on
// `stream` and returns the launch status. The loss is written as float32.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>
#include "../common/dtype.h"

// The first three rungs take float32 only.
#define KL_DIV_FLOAT_LAUNCHERS(variant)                                              \
    cudaError_t kl_div_##variant##_forward(const float* predictions,  /* (B, D) */    \
                                           const float* targets,      /* (B, D) */    \
                                           float* row_partials,       /* (B,)   */    \
                                           float* loss,               /* ()     */    \
                                           int64_t B, int64_t D, cudaStream_t stream); \
    cudaError_t kl_div_##variant##_backward(const float* predictions, /* (B, D) */    \
                                            const float* targets,     /* (B, D) */    \
                                            const float* grad_loss,   /* ()     */    \
                                            float* grad_predictions,  /* (B, D) */    \
                                            int64_t B, int64_t D, cudaStream_t stream);

KL_DIV_FLOAT_LAUNCHERS(naive)
KL_DIV_FLOAT_LAUNCHERS(shared_memory)
KL_DIV_FLOAT_LAUNCHERS(warp_shuffle)

// vectorized and fused take float32, bfloat16 or float16 (`dtype`), math in fp32.
cudaError_t kl_div_vectorized_forward(const void* predictions,  // (B, D)
                                      const void* targets,      // (B, D)
                                      float* row_partials,      // (B,)
                                      float* loss,              // ()
                                      int64_t B, int64_t D, DType dtype, cudaStream_t stream);
cudaError_t kl_div_vectorized_backward(const void* predictions,  // (B, D)
                                       const void* targets,      // (B, D)
                                       const float* grad_loss,   // ()
                                       void* grad_predictions,   // (B, D)
                                       int64_t B, int64_t D, DType dtype, cudaStream_t stream);

// The forward also writes dL/dp for grad_loss = 1; the backward scales it in place.
cudaError_t kl_div_fused_forward(const void* predictions,  // (B, D)
                                 const void* targets,      // (B, D)
                                 float* row_partials,      // (B,)
                                 float* loss,              // ()
                                 void* grad_predictions,   // (B, D)
                                 int64_t B, int64_t D, DType dtype, cudaStream_t stream);
cudaError_t kl_div_fused_backward(void* grad_predictions,  // (n,) written by the forward
                                  const float* grad_loss,  // ()
                                  int64_t n, DType dtype, cudaStream_t stream);
