// Host launchers of every cross_entropy rung: plain C++, no torch headers, so
// the binding and each rung's .cu compile on their own. Pointers are device
// pointers to contiguous data: logits (the reference's `predictions`) row-major,
// targets int64 class indices. Each launcher enqueues its kernels on `stream`
// and returns the launch status.
//
// A forward runs in three stages: count_targets writes counts = {rows with a
// target in [0, C), targets outside [0, C) that are not ignore_index} (the
// host copies them back while the rest runs); the rung's row kernel writes
// per-row losses and the two parts of each row's log-sum-exp (max and log of
// the sum); valid_mean writes the 0-d loss. The backward reads the row
// statistics and counts[0] back.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>
#include "../common/dtype.h"

// The first three rungs take float32 logits only.
#define CROSS_ENTROPY_FLOAT_LAUNCHERS(variant)                                                  \
    cudaError_t cross_entropy_##variant##_forward(const float* logits,     /* (N, C) */         \
                                                  const int64_t* targets,  /* (N,)   */         \
                                                  const int64_t* counts,   /* (2,)   */         \
                                                  float* row_losses,       /* (N,)   */         \
                                                  float* row_max,          /* (N,)   */         \
                                                  float* row_log_sum,      /* (N,)   */         \
                                                  float* loss,             /* ()     */         \
                                                  int64_t N, int64_t C, cudaStream_t stream);   \
    cudaError_t cross_entropy_##variant##_backward(const float* logits,      /* (N, C) */       \
                                                   const int64_t* targets,   /* (N,)   */       \
                                                   const float* row_max,     /* (N,)   */       \
                                                   const float* row_log_sum, /* (N,)   */       \
                                                   const int64_t* counts,    /* (2,)   */       \
                                                   const float* grad_loss,   /* ()     */       \
                                                   float* grad_logits,       /* (N, C) */       \
                                                   int64_t N, int64_t C, cudaStream_t stream);

CROSS_ENTROPY_FLOAT_LAUNCHERS(naive)
CROSS_ENTROPY_FLOAT_LAUNCHERS(shared_memory)
CROSS_ENTROPY_FLOAT_LAUNCHERS(warp_shuffle)

// vectorized and fused take float32, bfloat16 or float16 logits (`dtype`);
// math in fp32, the gradient written in the logits' dtype.
cudaError_t cross_entropy_vectorized_forward(const void* logits,      // (N, C)
                                             const int64_t* targets,  // (N,)
                                             const int64_t* counts,   // (2,)
                                             float* row_losses,       // (N,)
                                             float* row_max,          // (N,)
                                             float* row_log_sum,      // (N,)
                                             float* loss,             // ()
                                             int64_t N, int64_t C, DType dtype, cudaStream_t stream);
cudaError_t cross_entropy_vectorized_backward(const void* logits,        // (N, C)
                                              const int64_t* targets,    // (N,)
                                              const float* row_max,      // (N,)
                                              const float* row_log_sum,  // (N,)
                                              const int64_t* counts,     // (2,)
                                              const float* grad_loss,    // ()
                                              void* grad_logits,         // (N, C)
                                              int64_t N, int64_t C, DType dtype, cudaStream_t stream);

// The forward also writes dL/dx for grad_loss = 1 (reading n_valid from
// counts); the backward scales it in place, and not at all when grad_loss is 1.
cudaError_t cross_entropy_fused_forward(const void* logits,      // (N, C)
                                        const int64_t* targets,  // (N,)
                                        const int64_t* counts,   // (2,)
                                        float* row_losses,       // (N,)
                                        float* loss,             // ()
                                        void* grad_logits,       // (N, C)
                                        int64_t N, int64_t C, DType dtype, cudaStream_t stream);
cudaError_t cross_entropy_fused_backward(void* grad_logits,       // (n,) written by the forward
                                         const float* grad_loss,  // ()
                                         int64_t n, DType dtype, cudaStream_t stream);

// The stages every forward shares (count_targets.cu, valid_mean.cu).
cudaError_t cross_entropy_count_targets(const int64_t* targets,  // (N,)
                                        int64_t* counts,         // (2,)
                                        int64_t N, int64_t C, cudaStream_t stream);
cudaError_t cross_entropy_valid_mean(const float* row_losses,  // (N,)
                                     const int64_t* counts,    // (2,) read: n_valid
                                     float* loss,              // ()
                                     int64_t N, cudaStream_t stream);
