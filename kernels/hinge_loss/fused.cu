// fused: one pass for training. The forward reads p and t once and writes both the partial
// sums and dL/dp = -(x > 0) * t / divisor for grad_loss = 1, so the backward has nothing
// left to read but a scale by grad_loss, skipped when it is 1 (loss.backward()). It removes
// the second read of p that vectorized's backward pays: two passes over B x D for training
// instead of three. vectorized's walk (walk.cuh) and kernel (forward.cuh), with the gradient;
// float32, bfloat16 and float16 through its dispatch_dtype, fp32 math.
#include "common/scale.cuh"
#include "hinge_loss/forward.cuh"
#include "hinge_loss/launchers.h"
#include "hinge_loss/options.h"

// Launch knobs (losslab/build/knobs.py): -DLOSSLAB_HINGE_LOSS_FUSED_<KNOB>=<value> builds another one.
// 1024 threads and 2 rows in flight, chosen by measurement (forward+backward, 256 x 4 -> 1024 x 2, ms:
// 32768 x 32768 H100 float32 3.068 -> 3.023, bfloat16 1.578 -> 1.511; H200 float32 2.263 -> 2.173,
// bfloat16 1.165 -> 1.086).
#ifndef LOSSLAB_HINGE_LOSS_FUSED_THREADS
#define LOSSLAB_HINGE_LOSS_FUSED_THREADS 1024  // threads per block: 32 64 128 256 512 1024
#endif
#ifndef LOSSLAB_HINGE_LOSS_FUSED_UNROLL
#define LOSSLAB_HINGE_LOSS_FUSED_UNROLL 2  // rows whose 16-byte pack is in flight per thread: 1 2 4 8 16
#endif
constexpr int THREADS = LOSSLAB_HINGE_LOSS_FUSED_THREADS;
constexpr int UNROLL = LOSSLAB_HINGE_LOSS_FUSED_UNROLL;
static_assert(THREADS >= 32 && THREADS <= 1024 && THREADS % 32 == 0,
              "LOSSLAB_HINGE_LOSS_FUSED_THREADS: a multiple of 32 from 32 to 1024 (whole warps)");
static_assert(UNROLL >= 1, "LOSSLAB_HINGE_LOSS_FUSED_UNROLL: at least 1");

// Reductions sum and mean (reduction none needs each element's upstream gradient: vectorized's
// backward); the backward is fused_backward's scale in place.
cudaError_t hinge_loss_fused_options_forward(const void* input, const void* target, float* partials, void* loss,
                                             void* elementwise, void* grad_input, int64_t B, int64_t D, float divisor,
                                             DType dtype, cudaStream_t stream) {
    if (grad_input == nullptr || elementwise != nullptr) return cudaErrorInvalidValue;
    return hinge_loss_forward_launch<THREADS, UNROLL, Mode::sum_and_grad>(input, target, partials, loss, grad_input,
                                                                          B, D, divisor, dtype, stream);
}

// Needs a gradient buffer: inference runs the vectorized forward instead (the rung table says so).
cudaError_t hinge_loss_fused_forward(const void* predictions, const void* targets, float* partials, void* loss,
                                     void* grad_predictions, int64_t B, int64_t D, DType dtype, cudaStream_t stream) {
    return hinge_loss_fused_options_forward(predictions, targets, partials, loss, nullptr, grad_predictions, B, D,
                                            float(B * D), dtype, stream);
}

// The forward wrote dL/dp for grad_loss = 1: scale it in place (no work when grad_loss is 1).
cudaError_t hinge_loss_fused_backward(const void* /*predictions: unread*/, const void* /*targets: unread*/,
                                      const void* grad_loss, void* grad_predictions, int64_t B, int64_t D,
                                      DType dtype, cudaStream_t stream) {
    return scale_in_place(grad_predictions, grad_loss, B * D, dtype, stream);
}
