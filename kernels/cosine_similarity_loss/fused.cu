// fused: one pass for training. The forward holds each row's first TILE * THREADS
// 16-byte packs of p and t in registers while the block adds its dots, then writes
// dL/dp (and dL/dt where asked) for grad_loss = 1 from those registers: a row that
// fits the tile (8192 floats, 16384 bf16/fp16 at the defaults) is read from DRAM once,
// and a longer one re-reads only what is beyond the tile. The backward scales the
// gradient in place by grad_loss, skipped when it is 1 (loss.backward()). It removes
// the backward's second read of p and t: training moves 2 reads and 1 or 2 writes of
// B x D, where vectorized moves 4 reads and 1.
#include "common/dispatch.cuh"
#include "common/scale.cuh"
#include "common/stream_workspace.cuh"
#include "cosine_similarity_loss/launchers.h"
#include "cosine_similarity_loss/rows.cuh"

// Launch knobs (losslab/build/knobs.py): -DLOSSLAB_COSINE_SIMILARITY_LOSS_FUSED_<KNOB>=<value> builds another one.
#ifndef LOSSLAB_COSINE_SIMILARITY_LOSS_FUSED_THREADS
#define LOSSLAB_COSINE_SIMILARITY_LOSS_FUSED_THREADS 512  // threads per block: 128 256 512 1024
#endif
#ifndef LOSSLAB_COSINE_SIMILARITY_LOSS_FUSED_TILE
#define LOSSLAB_COSINE_SIMILARITY_LOSS_FUSED_TILE 4  // 16-byte packs per tensor held in registers: 1 2 4 8
#endif
constexpr int THREADS = LOSSLAB_COSINE_SIMILARITY_LOSS_FUSED_THREADS;
constexpr int TILE = LOSSLAB_COSINE_SIMILARITY_LOSS_FUSED_TILE;
static_assert(THREADS >= 128 && THREADS <= 1024 && THREADS % 32 == 0,
              "LOSSLAB_COSINE_SIMILARITY_LOSS_FUSED_THREADS: a multiple of 32 from 128 to 1024 (whole warps)");
static_assert(TILE >= 1 && TILE <= 8 && TILE * THREADS <= 4096,
              "LOSSLAB_COSINE_SIMILARITY_LOSS_FUSED_TILE: 1 to 8, at most 4096 packs a block (registers)");

// Needs a gradient buffer: inference runs the vectorized forward instead (the rung table says so).
cudaError_t cosine_similarity_loss_fused_forward(const void* predictions, const void* targets,
                                                 float* /*row_dots: unwritten*/, float* row_partials, void* loss,
                                                 void* grad_predictions, void* grad_targets, int64_t B, int64_t D,
                                                 float eps, DType dtype, cudaStream_t stream) {
    if (grad_predictions == nullptr) return cudaErrorInvalidValue;
    unsigned int* ticket;
    const cudaError_t err = stream_workspace(stream, row_partials + B, sizeof(unsigned int),
                                             reinterpret_cast<void**>(&ticket));
    if (err != cudaSuccess) return err;
    return dispatch_dtype(dtype, [&](auto tag) {
        using T = decltype(tag);
        forward_rows<T, THREADS, TILE, true><<<B, THREADS, 0, stream>>>(
            static_cast<const T*>(predictions), static_cast<const T*>(targets), nullptr, nullptr, row_partials,
            ticket, static_cast<T*>(loss), static_cast<T*>(grad_predictions), static_cast<T*>(grad_targets), B, D,
            eps);
        return cudaGetLastError();
    });
}

// The forward wrote the gradients for grad_loss = 1: scale them in place (no work when grad_loss is 1).
cudaError_t cosine_similarity_loss_fused_backward(const void* /*predictions: unread*/, const void* /*targets*/,
                                                  const float* /*row_dots*/, const void* grad_loss,
                                                  void* grad_predictions, void* grad_targets, int64_t B, int64_t D,
                                                  float /*eps*/, DType dtype, cudaStream_t stream) {
    const cudaError_t err = scale_in_place(grad_predictions, grad_loss, B * D, dtype, stream);
    if (err != cudaSuccess || grad_targets == nullptr) return err;
    return scale_in_place(grad_targets, grad_loss, B * D, dtype, stream);
}
