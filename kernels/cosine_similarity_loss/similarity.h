// F.cosine_similarity itself (losslab.nn.functional.cosine_similarity), beside the loss's
// rungs (launchers.h): each row's cos, not their mean. Defined in vectorized.cu, on its
// kernels. Plain C++, no torch headers; device pointers to contiguous row-major data.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>
#include "common/dtype.h"

// The forward writes each row's cos (the inputs' dtype) and dots; the backward takes each row's
// upstream gradient (float32) and writes the gradient of either input or both (a null one is skipped).
cudaError_t cosine_similarity_loss_rows_forward(const void* x1, const void* x2,  // (B, D) of dtype
                                                float* row_dots,                 // (3, B) written
                                                void* cos,                       // (B,) of dtype written
                                                int64_t B, int64_t D, float eps, DType dtype, cudaStream_t stream);
cudaError_t cosine_similarity_loss_rows_backward(const void* x1, const void* x2,  // (B, D) of dtype
                                                 const float* row_dots,           // (3, B) from the forward
                                                 const float* grad_cos,           // (B,) float32
                                                 void* grad_x1, void* grad_x2,    // (B, D) of dtype, or null
                                                 int64_t B, int64_t D, float eps, DType dtype,
                                                 cudaStream_t stream);
