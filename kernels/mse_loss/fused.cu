// fused: one pass for training. The forward reads input and target once and writes both
// the loss and dL/dinput = 2 (input - target) / divisor for grad_loss = 1 (options.cuh's
// kernel with a gradient), so the backward has nothing left to read but a scale by
// grad_loss, skipped when it is 1 (loss.backward()). It removes the second read of both
// inputs that vectorized's backward pays: three passes over the tensors instead of five.
#include "common/dispatch.cuh"
#include "common/scale.cuh"
#include "mse_loss/launchers.h"
#include "mse_loss/options.h"

// Launch knobs (losslab/build/knobs.py): -DLOSSLAB_MSE_LOSS_FUSED_<KNOB>=<value> builds another one.
#ifndef LOSSLAB_MSE_LOSS_FUSED_THREADS
#define LOSSLAB_MSE_LOSS_FUSED_THREADS 256  // threads per block: 64 128 256 512 1024
#endif
#ifndef LOSSLAB_MSE_LOSS_FUSED_UNROLL
#define LOSSLAB_MSE_LOSS_FUSED_UNROLL 4  // 16-byte loads in flight per tensor in the forward: 1 2 4 8
#endif
constexpr int THREADS = LOSSLAB_MSE_LOSS_FUSED_THREADS;
constexpr int UNROLL = LOSSLAB_MSE_LOSS_FUSED_UNROLL;
static_assert(THREADS >= 64 && THREADS <= 1024 && (THREADS & (THREADS - 1)) == 0,
              "LOSSLAB_MSE_LOSS_FUSED_THREADS: a power of two from 64 to 1024 (whole warps)");
static_assert(UNROLL >= 1, "LOSSLAB_MSE_LOSS_FUSED_UNROLL: at least 1");

#include "mse_loss/options.cuh"

namespace {

// options.cuh's forward for the dtype's element type.
cudaError_t forward_any(const void* input, const void* target, float* partials, void* loss, void* elementwise,
                        void* grad_input, int64_t n, float divisor, DType dtype, cudaStream_t stream) {
    return dispatch_dtype(dtype, [&](auto tag) {
        return mse_loss_forward_launch<decltype(tag)>(input, target, partials, loss, elementwise, grad_input, n,
                                                      divisor, stream);
    });
}

}  // namespace

// Needs a gradient buffer: inference runs the vectorized forward instead (the rung table says so).
cudaError_t mse_loss_fused_forward(const void* predictions, const void* targets, float* row_partials, void* loss,
                                   void* grad_predictions, int64_t B, int64_t D, DType dtype, cudaStream_t stream) {
    if (grad_predictions == nullptr) return cudaErrorInvalidValue;
    return forward_any(predictions, targets, row_partials, loss, nullptr, grad_predictions, B * D,
                                   float(B * D), dtype, stream);
}

// The forward wrote dL/dp for grad_loss = 1: scale it in place (no work when grad_loss is 1).
cudaError_t mse_loss_fused_backward(const void* /*predictions: unread*/, const void* /*targets: unread*/,
                                    const void* grad_loss, void* grad_predictions, int64_t B, int64_t D,
                                    DType dtype, cudaStream_t stream) {
    return scale_in_place(grad_predictions, grad_loss, B * D, dtype, stream);
}

// PyTorch's options (options.h), reductions sum and mean: the sum and the gradient in the
// same pass; the backward is fused's above. Reduction none needs each element's upstream
// gradient: vectorized's backward.
cudaError_t mse_loss_fused_options_forward(const void* input, const void* target, float* partials, void* loss,
                                           void* elementwise, void* grad_input, int64_t n, float divisor,
                                           DType dtype, cudaStream_t stream) {
    if (grad_input == nullptr || elementwise != nullptr) return cudaErrorInvalidValue;
    return forward_any(input, target, partials, loss, nullptr, grad_input, n, divisor, dtype, stream);
}
