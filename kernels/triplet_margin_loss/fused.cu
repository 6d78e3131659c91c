// fused: vectorized's row kernel with the gradient written in the forward (for grad_loss = 1), from
// the packs each thread still holds: the backward then only scales it in place (no work when
// grad_loss is 1), where vectorized's backward reads the three (N, D) inputs a second time. Rows
// longer than THREADS * CACHE packs read their rest again from L2 for the gradient.
#include "common/scale.cuh"
#include "common/dispatch.cuh"
#include "triplet_margin_loss/launchers.h"
#include "triplet_margin_loss/options.h"
#include "triplet_margin_loss/rows.cuh"

// Launch knobs (losslab/build/knobs.py): -DLOSSLAB_TRIPLET_MARGIN_LOSS_FUSED_<KNOB>=<value> builds another one.
#ifndef LOSSLAB_TRIPLET_MARGIN_LOSS_FUSED_THREADS
#define LOSSLAB_TRIPLET_MARGIN_LOSS_FUSED_THREADS 512  // threads per float32 row (16-bit: half): 128 256 512 1024
#endif
// 2 packs, so two blocks fit an SM (60 registers, not 100): one loads while the other reduces or
// writes. Measured, forward+backward, CACHE 4 -> 2, ms: H200 32768 x 8192 float32 1.181 -> 1.076,
// bfloat16 0.613 -> 0.567, 2048 x 131072 float32 1.875 -> 1.731; H100 (already at its copy
// bandwidth) 32768 x 8192 float32 1.432 -> 1.426, bfloat16 0.730 -> 0.730.
#ifndef LOSSLAB_TRIPLET_MARGIN_LOSS_FUSED_CACHE
#define LOSSLAB_TRIPLET_MARGIN_LOSS_FUSED_CACHE 2  // 16-byte packs per tensor a thread holds: 1 2 4 8
#endif
constexpr int THREADS = LOSSLAB_TRIPLET_MARGIN_LOSS_FUSED_THREADS;
constexpr int CACHE = LOSSLAB_TRIPLET_MARGIN_LOSS_FUSED_CACHE;
static_assert(THREADS >= 32 && THREADS <= 1024 && THREADS % 32 == 0,
              "LOSSLAB_TRIPLET_MARGIN_LOSS_FUSED_THREADS: a multiple of 32 from 32 to 1024 (whole warps)");
static_assert(CACHE >= 1, "LOSSLAB_TRIPLET_MARGIN_LOSS_FUSED_CACHE: at least 1");

// Needs a gradient buffer: inference runs the vectorized forward instead (the rung table says so).
cudaError_t triplet_margin_loss_fused_forward(const void* anchor, const void* positive, const void* negative,
                                              float* row_losses, void* loss, void* grad_anchor, int64_t N,
                                              int64_t D, DType dtype, cudaStream_t stream) {
    if (grad_anchor == nullptr) return cudaErrorInvalidValue;
    return dispatch_dtype(dtype, [&](auto tag) {
        using T = decltype(tag);
        return triplet_rows<T, row_block<T>(THREADS), CACHE>(anchor, positive, negative, grad_anchor, nullptr,
            nullptr, row_losses, loss, nullptr, nullptr, 0, N, D, TRIPLET_DEFAULTS, stream);
    });
}

// The forward wrote dL/da for grad_loss = 1: scale it in place (no work when grad_loss is 1).
cudaError_t triplet_margin_loss_fused_backward(const void* /*anchor: unread*/, const void* /*positive*/,
                                               const void* /*negative*/, const void* grad_loss, void* grad_anchor,
                                               int64_t N, int64_t D, DType dtype, cudaStream_t stream) {
    return scale_in_place(grad_anchor, grad_loss, N * D, dtype, stream);
}

// PyTorch's options with the gradients of the inputs given written in the same pass, for reductions
// sum and mean (none needs each row's upstream gradient: vectorized's options backward).
cudaError_t triplet_margin_loss_fused_options_forward(
        const void* anchor, const void* positive, const void* negative, float* row_losses, void* loss,
        void* grad_anchor, void* grad_positive, void* grad_negative, int64_t N, int64_t D, float margin, float eps,
        int swap, int reduction, DType dtype, cudaStream_t stream) {
    if (reduction == TRIPLET_NONE || !(grad_anchor || grad_positive || grad_negative)) return cudaErrorInvalidValue;
    const TripletOptions opt{margin, eps, swap, reduction};
    return dispatch_dtype(dtype, [&](auto tag) {
        using T = decltype(tag);
        return triplet_rows<T, row_block<T>(THREADS), CACHE>(anchor, positive, negative, grad_anchor, grad_positive,
            grad_negative, row_losses, loss, nullptr, nullptr, 0, N, D, opt, stream);
    });
}
