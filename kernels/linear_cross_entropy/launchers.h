// The one launcher of the linear cross-entropy's own kernel (rows.cu). The GEMMs around it
// (logits = input @ W^T + b, then the input's and the weight's gradients) are cuBLAS's,
// through torch (losslab/linear_cross_entropy/chunked.py); this kernel does the rest on one
// chunk of logits. Plain C++, no torch headers; device pointers to contiguous row-major data.
//
// With y = softcap * tanh(z / softcap) (y = z without softcap), p = softmax(y), w the class
// weights (1 without), W = sum_j w_j, eps the label smoothing and t the row's target
// (PyTorch's F.cross_entropy with weight and label_smoothing, aten/src/ATen/native/LossNLL.cpp):
//   a_j  = (1 - eps) * w_t * [j == t] + eps / V * w_j          (0 on an ignored row)
//   loss = sum_j a_j * (logsumexp(y) - y_j)
//   dloss/dz_j = (p_j * A - a_j) * (1 - (y_j / softcap)^2) * scale,   A = sum_j a_j
// scale = row_scale[row] (when given) times 1 / stats[0] for the mean (the sum of w_t over
// the rows not ignored: PyTorch's divisor), 1 otherwise.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>
#include "common/dtype.h"

typedef cudaError_t linear_cross_entropy_rows_fn(
    void* logits,              // (rows, V) of dtype: read; overwritten with dloss/dlogits when write_grad
    const int64_t* targets,    // (rows,) class indices (ignore_index leaves the row out)
    const float* weight,       // (V,) float32 class weights, or null
    const float* stats,        // (2,) float32: the mean's divisor, W = sum_j w_j
    const float* row_scale,    // (rows,) float32 grad_output per row (reduction none's backward), or null
    float* row_losses,         // (rows,) float32: each row's loss, written (0 on an ignored row, NaN out of range)
    int64_t rows, int64_t V, int64_t ignore_index, float label_smoothing,
    float softcap,             // 0: none
    int mean,                  // 1: scale the gradient by 1 / stats[0]
    int write_grad,            // 0: the losses only (inference, or reduction none's forward)
    DType dtype, cudaStream_t stream);

linear_cross_entropy_rows_fn linear_cross_entropy_rows;  // rows.cu
