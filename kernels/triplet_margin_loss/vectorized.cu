// vectorized: a block a row (the forward alone: rows in turn on the blocks resident at once),
// 16-byte loads of the three rows (a scalar head and tail where a row does not start on a 16-byte
// boundary), each thread's first packs all in flight at once, and the three squared distances
// reduced with warp shuffles (rows.cuh). Its forward writes the loss only (inference pays for no
// gradient); its backward reads the rows again and writes dL/danchor (and, through the options
// launchers, dL/dpositive and dL/dnegative) from the packs it holds.
#include "common/dispatch.cuh"
#include "triplet_margin_loss/launchers.h"
#include "triplet_margin_loss/options.h"
#include "triplet_margin_loss/rows.cuh"

// Launch knobs (losslab/build/knobs.py): -DLOSSLAB_TRIPLET_MARGIN_LOSS_VECTORIZED_<KNOB>=<value> builds another one.
#ifndef LOSSLAB_TRIPLET_MARGIN_LOSS_VECTORIZED_THREADS
#define LOSSLAB_TRIPLET_MARGIN_LOSS_VECTORIZED_THREADS 512  // threads per float32 row (16-bit: half): 128 256 512 1024
#endif
#ifndef LOSSLAB_TRIPLET_MARGIN_LOSS_VECTORIZED_CACHE
#define LOSSLAB_TRIPLET_MARGIN_LOSS_VECTORIZED_CACHE 4  // 16-byte packs per tensor a thread holds: 1 2 4 8
#endif
// The forward alone holds nothing for a gradient, so it wants blocks in flight, not registers: 256
// threads (any dtype) and 2 packs, where the backward's 512 x 4 (16-bit: 256 x 4) forward took, on
// an H200 at 32768 x 8192, float32 0.869 ms against 0.731 (H100 1.047 against 1.043), bfloat16
// 0.424 against 0.395 (H100 0.534 against 0.533).
#ifndef LOSSLAB_TRIPLET_MARGIN_LOSS_VECTORIZED_FORWARD_THREADS
#define LOSSLAB_TRIPLET_MARGIN_LOSS_VECTORIZED_FORWARD_THREADS 256  // threads a row, forward alone: 128 256 512 1024
#endif
#ifndef LOSSLAB_TRIPLET_MARGIN_LOSS_VECTORIZED_FORWARD_CACHE
#define LOSSLAB_TRIPLET_MARGIN_LOSS_VECTORIZED_FORWARD_CACHE 2  // packs per tensor in flight, forward alone: 1 2 4
#endif
// and it takes a row a block up to this many waves of the blocks the GPU holds at once, past that
// rows in turn on those blocks (rows.cuh), where a block a row left the GPU part idle in its last
// wave and drew a ticket a row.
#ifndef LOSSLAB_TRIPLET_MARGIN_LOSS_VECTORIZED_FORWARD_WAVES
#define LOSSLAB_TRIPLET_MARGIN_LOSS_VECTORIZED_FORWARD_WAVES 8  // a row a block up to this many waves: 1 2 4 8
#endif
constexpr int THREADS = LOSSLAB_TRIPLET_MARGIN_LOSS_VECTORIZED_THREADS;
constexpr int CACHE = LOSSLAB_TRIPLET_MARGIN_LOSS_VECTORIZED_CACHE;
constexpr int FORWARD_THREADS = LOSSLAB_TRIPLET_MARGIN_LOSS_VECTORIZED_FORWARD_THREADS;
constexpr int FORWARD_CACHE = LOSSLAB_TRIPLET_MARGIN_LOSS_VECTORIZED_FORWARD_CACHE;
constexpr int FORWARD_WAVES = LOSSLAB_TRIPLET_MARGIN_LOSS_VECTORIZED_FORWARD_WAVES;
static_assert(THREADS >= 32 && THREADS <= 1024 && THREADS % 32 == 0,
              "LOSSLAB_TRIPLET_MARGIN_LOSS_VECTORIZED_THREADS: a multiple of 32 from 32 to 1024 (whole warps)");
static_assert(CACHE >= 1, "LOSSLAB_TRIPLET_MARGIN_LOSS_VECTORIZED_CACHE: at least 1");
static_assert(FORWARD_THREADS >= 32 && FORWARD_THREADS <= 1024 && FORWARD_THREADS % 32 == 0,
              "LOSSLAB_TRIPLET_MARGIN_LOSS_VECTORIZED_FORWARD_THREADS: a multiple of 32 from 32 to 1024 (whole warps)");
static_assert(FORWARD_CACHE >= 1, "LOSSLAB_TRIPLET_MARGIN_LOSS_VECTORIZED_FORWARD_CACHE: at least 1");
static_assert(FORWARD_WAVES >= 1, "LOSSLAB_TRIPLET_MARGIN_LOSS_VECTORIZED_FORWARD_WAVES: at least 1");

cudaError_t triplet_margin_loss_vectorized_forward(const void* anchor, const void* positive, const void* negative,
                                                   float* row_losses, void* loss, void* /*grad_anchor: not fused*/,
                                                   int64_t N, int64_t D, DType dtype, cudaStream_t stream) {
    return dispatch_dtype(dtype, [&](auto tag) {
        using T = decltype(tag);
        return triplet_rows<T, FORWARD_THREADS, FORWARD_CACHE, FORWARD_WAVES>(anchor, positive, negative, nullptr,
            nullptr, nullptr, row_losses, loss, nullptr, nullptr, 0, N, D, TRIPLET_DEFAULTS, stream);
    });
}

cudaError_t triplet_margin_loss_vectorized_backward(const void* anchor, const void* positive, const void* negative,
                                                    const void* grad_loss, void* grad_anchor, int64_t N, int64_t D,
                                                    DType dtype, cudaStream_t stream) {
    return dispatch_dtype(dtype, [&](auto tag) {
        using T = decltype(tag);
        return triplet_rows<T, row_block<T>(THREADS), CACHE>(anchor, positive, negative, grad_anchor, nullptr,
            nullptr, nullptr, nullptr, grad_loss, nullptr, 0, N, D, TRIPLET_DEFAULTS, stream);
    });
}

cudaError_t triplet_margin_loss_vectorized_options_forward(
        const void* anchor, const void* positive, const void* negative, float* row_losses, void* loss,
        void* grad_anchor, void* grad_positive, void* grad_negative, int64_t N, int64_t D, float margin, float eps,
        int swap, int reduction, DType dtype, cudaStream_t stream) {
    if (grad_anchor || grad_positive || grad_negative) return cudaErrorInvalidValue;  // fused's
    const TripletOptions opt{margin, eps, swap, reduction};
    return dispatch_dtype(dtype, [&](auto tag) {
        using T = decltype(tag);
        return triplet_rows<T, FORWARD_THREADS, FORWARD_CACHE, FORWARD_WAVES>(anchor, positive, negative, nullptr,
            nullptr, nullptr, row_losses, reduction == TRIPLET_NONE ? nullptr : loss, nullptr, nullptr, 0, N, D, opt,
            stream);
    });
}

cudaError_t triplet_margin_loss_vectorized_options_backward(
        const void* anchor, const void* positive, const void* negative, const float* grad_loss, void* grad_anchor,
        void* grad_positive, void* grad_negative, int64_t N, int64_t D, float margin, float eps, int swap,
        int reduction, DType dtype, cudaStream_t stream) {
    const TripletOptions opt{margin, eps, swap, reduction};
    return dispatch_dtype(dtype, [&](auto tag) {
        using T = decltype(tag);
        return triplet_rows<T, row_block<T>(THREADS), CACHE>(anchor, positive, negative, grad_anchor, grad_positive,
            grad_negative, nullptr, nullptr, nullptr, grad_loss, reduction == TRIPLET_NONE, N, D, opt, stream);
    });
}
