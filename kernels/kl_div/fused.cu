// fused: one pass for training. The forward reads p and t once and writes both
// the loss partials and dL/dp for grad_loss = 1, so the backward has nothing
// left to read but a scale by grad_loss, skipped when it is 1 (loss.backward()).
// It removes the second read of p and t that a separate backward pays: three
// passes over B x D instead of five.
#include "common/dispatch.cuh"
#include "common/last_block.cuh"
#include "common/reduce.cuh"
#include "common/row_split.cuh"
#include "common/stream_workspace.cuh"
#include "common/scale.cuh"
#include "kl_div/kl_div.cuh"
#include "kl_div/launchers.h"
#include "kl_div/options.cuh"

// Launch knobs (losslab/build/knobs.py): -DLOSSLAB_KL_DIV_FUSED_<KNOB>=<value> builds another one.
#ifndef LOSSLAB_KL_DIV_FUSED_THREADS
#define LOSSLAB_KL_DIV_FUSED_THREADS 256  // threads per block: 32 64 128 256 512 1024
#endif
#ifndef LOSSLAB_KL_DIV_FUSED_UNROLL
#define LOSSLAB_KL_DIV_FUSED_UNROLL 4  // 16-byte loads in flight per tensor: 1 2 4 8 16
#endif
constexpr int THREADS = LOSSLAB_KL_DIV_FUSED_THREADS;
constexpr int UNROLL = LOSSLAB_KL_DIV_FUSED_UNROLL;
static_assert(THREADS >= 32 && THREADS <= 1024 && THREADS % 32 == 0,
              "LOSSLAB_KL_DIV_FUSED_THREADS: a multiple of 32 from 32 to 1024 (whole warps)");
static_assert(UNROLL >= 1, "LOSSLAB_KL_DIV_FUSED_UNROLL: at least 1");

template <typename T>
__global__ void __launch_bounds__(THREADS)
kl_div_fused_forward_kernel(const T* __restrict__ predictions,  // (B, D)
                            const T* __restrict__ targets,      // (B, D)
                            float* __restrict__ row_partials,   // (B,)
                            unsigned int* __restrict__ ticket,  // () zero before the launch and after
                            T* __restrict__ loss,               // ()
                            T* __restrict__ grad_predictions,   // (B, D), for grad_loss = 1
                            int64_t D, float inv_B) {
    constexpr int V = Pack<T>::size;
    const T* p = predictions + blockIdx.x * D;
    const T* t = targets + blockIdx.x * D;
    T* g = grad_predictions + blockIdx.x * D;
    // Packs need all three rows at the same offset from a 16-byte boundary.
    const RowSplit split = split_row(D, p, t, g);
    const int64_t head = split.head, packs = split.packs;
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < head; j += THREADS) {
        const float pj = to_float(p[j]), tj = to_float(t[j]);
        sum += kl_div_term(pj, tj);
        g[j] = from_float<T>(kl_div_grad(pj, tj, inv_B));
    }
    const T* pv = p + head;
    const T* tv = t + head;
    T* gv = g + head;
    float sum_log2 = 0.0f;  // the packs' terms in log2 units: times LN2 once, below
    auto pack = [&](const Pack<T>& pb, const Pack<T>& tb, T* out) {
        float gb[V];
#pragma unroll
        for (int k = 0; k < V; ++k) {
            sum_log2 += kl_div_term_log2(pb[k], tb[k]);
            gb[k] = kl_div_grad(pb[k], tb[k], inv_B);
        }
        store_pack(out, pack_of<T>(gb));
    };
    int64_t i = threadIdx.x;
    for (; i + (UNROLL - 1) * THREADS < packs; i += UNROLL * THREADS) {
        Pack<T> pb[UNROLL], tb[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            pb[u] = load_pack(pv + V * (i + u * THREADS));
            tb[u] = load_pack(tv + V * (i + u * THREADS));
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) pack(pb[u], tb[u], gv + V * (i + u * THREADS));
    }
    for (; i < packs; i += THREADS) pack(load_pack(pv + V * i), load_pack(tv + V * i), gv + V * i);
    sum = fmaf(sum_log2, LN2, sum);
    for (int64_t j = head + V * packs + threadIdx.x; j < D; j += THREADS) {
        const float pj = to_float(p[j]), tj = to_float(t[j]);
        sum += kl_div_term(pj, tj);
        g[j] = from_float<T>(kl_div_grad(pj, tj, inv_B));
    }
    finish_sum(block_reduce_sum(sum), row_partials, ticket, float(gridDim.x), loss);  // the last block: the loss
}

// Needs a gradient buffer: inference runs the vectorized forward instead (the rung table says so).
// One kernel, its ticket the stream's, as vectorized's forward.
cudaError_t kl_div_fused_forward(const void* predictions, const void* targets, float* row_partials,
                                 void* loss, void* grad_predictions, int64_t B, int64_t D,
                                 DType dtype, cudaStream_t stream) {
    if (grad_predictions == nullptr) return cudaErrorInvalidValue;
    unsigned int* ticket;
    const cudaError_t err = stream_workspace(stream, row_partials + B, sizeof(unsigned int),
                                             reinterpret_cast<void**>(&ticket));
    if (err != cudaSuccess) return err;
    return dispatch_dtype(dtype, [&](auto tag) {
        using T = decltype(tag);
        kl_div_fused_forward_kernel<T><<<B, THREADS, 0, stream>>>(
            static_cast<const T*>(predictions), static_cast<const T*>(targets), row_partials, ticket,
            static_cast<T*>(loss), static_cast<T*>(grad_predictions), D, 1.0f / float(B));
        return cudaGetLastError();
    });
}

// The forward wrote dL/dp for grad_loss = 1: scale it in place (no work when grad_loss is 1).
cudaError_t kl_div_fused_backward(const void* /*predictions: unread*/, const void* /*targets: unread*/,
                                  const void* grad_loss, void* grad_predictions, int64_t B, int64_t D,
                                  DType dtype, cudaStream_t stream) {
    return scale_in_place(grad_predictions, grad_loss, B * D, dtype, stream);
}

// PyTorch's options (options.h), reductions sum, mean and batchmean: the terms' sums
// and dL/dinput = -t / divisor (-exp(t) / divisor with log_target; divided by the input
// without log_input) in the same pass;
// the backward is fused's above (scale in place). Reduction none needs each element's
// upstream gradient: vectorized's backward.
cudaError_t kl_div_fused_options_forward(const void* input, const void* target, float* partials, void* loss,
                                         void* elementwise, void* grad_input, int64_t n, int log_target,
                                         int log_input, float divisor, DType dtype, cudaStream_t stream) {
    if (grad_input == nullptr || elementwise != nullptr) return cudaErrorInvalidValue;
    return kl_div_options_launch(input, target, partials, loss, nullptr, grad_input, n, log_target, log_input,
                                 divisor, dtype, stream);
}
