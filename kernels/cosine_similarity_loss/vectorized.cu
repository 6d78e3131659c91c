// vectorized: one block per row, 16-byte loads of p and t (4 floats, 8 bf16/fp16),
// TILE of them per tensor in flight before any is used, fp32 math; a scalar head and
// tail where a row does not start on a 16-byte boundary. The forward is one kernel:
// it keeps each row's dots for the backward and its last block writes the loss. The
// backward reads p, t and the dots again and writes dL/dp (and dL/dt where asked).
// Also F.cosine_similarity itself (rows_forward, rows_backward): each row's cos.
#include <algorithm>
#include "common/dispatch.cuh"
#include "common/stream_workspace.cuh"
#include "cosine_similarity_loss/launchers.h"
#include "cosine_similarity_loss/similarity.h"
#include "cosine_similarity_loss/rows.cuh"

// Launch knobs (losslab/build/knobs.py): -DLOSSLAB_COSINE_SIMILARITY_LOSS_VECTORIZED_<KNOB>=<value> builds another one.
#ifndef LOSSLAB_COSINE_SIMILARITY_LOSS_VECTORIZED_THREADS
#define LOSSLAB_COSINE_SIMILARITY_LOSS_VECTORIZED_THREADS 256  // threads per block: 64 128 256 512 1024
#endif
#ifndef LOSSLAB_COSINE_SIMILARITY_LOSS_VECTORIZED_TILE
#define LOSSLAB_COSINE_SIMILARITY_LOSS_VECTORIZED_TILE 4  // 16-byte loads in flight per tensor: 1 2 4 8
#endif
#ifndef LOSSLAB_COSINE_SIMILARITY_LOSS_VECTORIZED_BLOCKS
#define LOSSLAB_COSINE_SIMILARITY_LOSS_VECTORIZED_BLOCKS 2048  // blocks at most (rows take turns): 1024 2048 4096 65536
#endif
constexpr int THREADS = LOSSLAB_COSINE_SIMILARITY_LOSS_VECTORIZED_THREADS;
constexpr int TILE = LOSSLAB_COSINE_SIMILARITY_LOSS_VECTORIZED_TILE;
constexpr int BLOCKS = LOSSLAB_COSINE_SIMILARITY_LOSS_VECTORIZED_BLOCKS;
static_assert(THREADS >= 64 && THREADS <= 1024 && THREADS % 32 == 0,
              "LOSSLAB_COSINE_SIMILARITY_LOSS_VECTORIZED_THREADS: a multiple of 32 from 64 to 1024 (whole warps)");
static_assert(TILE >= 1 && TILE <= 8, "LOSSLAB_COSINE_SIMILARITY_LOSS_VECTORIZED_TILE: 1 to 8");
static_assert(BLOCKS >= 1, "LOSSLAB_COSINE_SIMILARITY_LOSS_VECTORIZED_BLOCKS: at least 1");

// One kernel (the last block writes the loss), at most BLOCKS blocks: each publishes one partial,
// so a long batch pays a fence and a ticket per block, not per row. Its ticket is the stream's
// (stream_workspace.cuh).
cudaError_t cosine_similarity_loss_vectorized_forward(const void* predictions, const void* targets, float* row_dots,
                                                      float* row_partials, void* loss,
                                                      void* /*grad_predictions: not fused*/,
                                                      void* /*grad_targets: not fused*/, int64_t B, int64_t D,
                                                      float eps, DType dtype, cudaStream_t stream) {
    unsigned int* ticket;
    const cudaError_t err = stream_workspace(stream, row_partials + B, sizeof(unsigned int),
                                             reinterpret_cast<void**>(&ticket));
    if (err != cudaSuccess) return err;
    return dispatch_dtype(dtype, [&](auto tag) {
        using T = decltype(tag);
        forward_rows<T, THREADS, TILE, false><<<std::min<int64_t>(B, BLOCKS), THREADS, 0, stream>>>(
            static_cast<const T*>(predictions), static_cast<const T*>(targets), row_dots, nullptr, row_partials,
            ticket, static_cast<T*>(loss), nullptr, nullptr, B, D, eps);
        return cudaGetLastError();
    });
}

cudaError_t cosine_similarity_loss_vectorized_backward(const void* predictions, const void* targets,
                                                       const float* row_dots, const void* grad_loss,
                                                       void* grad_predictions, void* grad_targets, int64_t B,
                                                       int64_t D, float eps, DType dtype, cudaStream_t stream) {
    if (grad_predictions == nullptr) return cudaErrorInvalidValue;
    return dispatch_dtype(dtype, [&](auto tag) {
        using T = decltype(tag);
        backward_rows<T, THREADS><<<B, THREADS, 0, stream>>>(
            static_cast<const T*>(predictions), static_cast<const T*>(targets), row_dots,
            static_cast<const T*>(grad_loss), nullptr, static_cast<T*>(grad_predictions),
            static_cast<T*>(grad_targets), B, D, eps);
        return cudaGetLastError();
    });
}

cudaError_t cosine_similarity_loss_rows_forward(const void* x1, const void* x2, float* row_dots, void* cos,
                                                int64_t B, int64_t D, float eps, DType dtype, cudaStream_t stream) {
    return dispatch_dtype(dtype, [&](auto tag) {
        using T = decltype(tag);
        forward_rows<T, THREADS, TILE, false><<<B, THREADS, 0, stream>>>(
            static_cast<const T*>(x1), static_cast<const T*>(x2), row_dots, static_cast<T*>(cos), nullptr, nullptr,
            nullptr, nullptr, nullptr, B, D, eps);
        return cudaGetLastError();
    });
}

cudaError_t cosine_similarity_loss_rows_backward(const void* x1, const void* x2, const float* row_dots,
                                                 const float* grad_cos, void* grad_x1, void* grad_x2, int64_t B,
                                                 int64_t D, float eps, DType dtype, cudaStream_t stream) {
    if (grad_x1 == nullptr && grad_x2 == nullptr) return cudaErrorInvalidValue;
    return dispatch_dtype(dtype, [&](auto tag) {
        using T = decltype(tag);
        backward_rows<T, THREADS><<<B, THREADS, 0, stream>>>(
            static_cast<const T*>(x1), static_cast<const T*>(x2), row_dots, nullptr, grad_cos,
            static_cast<T*>(grad_x1), static_cast<T*>(grad_x2), B, D, eps);
        return cudaGetLastError();
    });
}
