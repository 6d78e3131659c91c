// Host launchers of every cross_entropy rung: plain C++, no torch headers, so
// the binding and each rung's .cu compile on their own. Pointers are device
// pointers to contiguous data: logits (the reference's `predictions`) float32
// row-major, targets int64 class indices. Each launcher enqueues its kernels on
// `stream` and returns the launch status.
//
// The forward writes per-row losses and the two parts of each row's
// log-sum-exp (max and log of the sum), then the second stage (valid_mean.cu)
// writes the 0-d loss and counts = {rows with a target in [0, C), rows with a
// target outside [0, C) that is not ignore_index}. The backward reads the row
// statistics and counts[0] back.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

#define CROSS_ENTROPY_LAUNCHERS(variant)                                                        \
    cudaError_t cross_entropy_##variant##_forward(const float* logits,     /* (N, C) */         \
                                                  const int64_t* targets,  /* (N,)   */         \
                                                  float* row_losses,       /* (N,)   */         \
                                                  float* row_max,          /* (N,)   */         \
                                                  float* row_log_sum,      /* (N,)   */         \
                                                  float* loss,             /* ()     */         \
                                                  int64_t* counts,         /* (2,)   */         \
                                                  int64_t N, int64_t C, cudaStream_t stream);   \
    cudaError_t cross_entropy_##variant##_backward(const float* logits,      /* (N, C) */       \
                                                   const int64_t* targets,   /* (N,)   */       \
                                                   const float* row_max,     /* (N,)   */       \
                                                   const float* row_log_sum, /* (N,)   */       \
                                                   const int64_t* counts,    /* (2,)   */       \
                                                   const float* grad_loss,   /* ()     */       \
                                                   float* grad_logits,       /* (N, C) */       \
                                                   int64_t N, int64_t C, cudaStream_t stream);

CROSS_ENTROPY_LAUNCHERS(naive)
CROSS_ENTROPY_LAUNCHERS(shared_memory)
CROSS_ENTROPY_LAUNCHERS(warp_shuffle)
CROSS_ENTROPY_LAUNCHERS(vectorized)

// The second stage shared by every forward (valid_mean.cu).
cudaError_t cross_entropy_valid_mean(const float* row_losses,  // (N,)
                                     const int64_t* targets,   // (N,)
                                     float* loss,              // ()
                                     int64_t* counts,          // (2,)
                                     int64_t N, int64_t C, cudaStream_t stream);
