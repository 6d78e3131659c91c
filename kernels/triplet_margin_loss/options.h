// Launchers of triplet_margin_loss with PyTorch's options (losslab.nn.functional.triplet_margin_loss):
// margin, eps, swap and the reductions, p = 2, and the gradients of all three inputs. Kept apart from
// launchers.h so that its contract (what a custom variant defines) is unchanged. Plain C++.
//
//   u = a - p + eps, v = a - n + eps, w = p - n + eps (swap)     d_ap = |u|, d_an = |v|, d_pn = |w|
//   d_neg = swap ? min(d_an, d_pn) : d_an        row = max(margin + d_ap - d_neg, 0) (NaN stays NaN)
//
// The gradient follows PyTorch's autograd (aten's derivatives): clamp_min passes where its input is
// > 0 (not at 0, not at NaN), min splits a tie in half, and a zero distance passes no gradient (norm's backward).
#pragma once
#include <cstdint>
#include <cuda_runtime.h>
#include "common/dtype.h"

enum TripletReduction : int { TRIPLET_NONE = 0, TRIPLET_MEAN = 1, TRIPLET_SUM = 2 };  // torch's Reduction enum

struct TripletOptions {
    float margin, eps;
    int swap, reduction;
};

typedef cudaError_t triplet_margin_loss_options_forward_fn(
    const void* anchor, const void* positive, const void* negative,  // (N, D) of dtype each
    float* row_losses,     // (N + 4,) 16-byte aligned: each row's loss (reduction none: the output), then scratch
    void* loss,            // () of dtype: the sum or the mean (unwritten for reduction none)
    void* grad_anchor,     // (N, D) of dtype: dL/da for grad_loss = 1 (fused only; sum and mean), or null
    void* grad_positive,   // (N, D) of dtype: dL/dp for grad_loss = 1 (idem), or null
    void* grad_negative,   // (N, D) of dtype: dL/dn for grad_loss = 1 (idem), or null
    int64_t N, int64_t D, float margin, float eps, int swap, int reduction, DType dtype, cudaStream_t stream);

typedef cudaError_t triplet_margin_loss_options_backward_fn(
    const void* anchor, const void* positive, const void* negative,  // (N, D) of dtype each
    const float* grad_loss,  // float32: () for sum and mean, (N,) for none
    void* grad_anchor, void* grad_positive, void* grad_negative,     // (N, D) of dtype each, or null: written
    int64_t N, int64_t D, float margin, float eps, int swap, int reduction, DType dtype, cudaStream_t stream);

triplet_margin_loss_options_forward_fn triplet_margin_loss_vectorized_options_forward;    // vectorized.cu
triplet_margin_loss_options_backward_fn triplet_margin_loss_vectorized_options_backward;  // vectorized.cu
triplet_margin_loss_options_forward_fn triplet_margin_loss_fused_options_forward;         // fused.cu
