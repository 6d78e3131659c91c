// Host launchers of every kl_div rung: plain C++, no torch headers, so the
// binding and each rung's .cu compile on their own. Pointers are device
// pointers to contiguous row-major float32 data; each launcher enqueues its
// kernels on `stream` and returns the launch status.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

#define KL_DIV_LAUNCHERS(variant)                                                    \
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

KL_DIV_LAUNCHERS(naive)
KL_DIV_LAUNCHERS(shared_memory)
KL_DIV_LAUNCHERS(warp_shuffle)
KL_DIV_LAUNCHERS(vectorized)
