// vectorized: the operator's forward and backward over the flat tensors, 16-byte packs
// (4 floats, 8 bf16/fp16) with UNROLL of them in flight per tensor, fp32 math, one wave of
// blocks, and the loss written by the last block to finish (one kernel, no second stage):
// options.cuh. It fixes the teaching ladder's one-block-per-row grid (too few blocks for
// few rows, a second kernel for the partials) and its float32-only loads. The backward
// reads input and target again: 2 (input - target) * grad_loss / divisor.
#include "common/dispatch.cuh"
#include "mse_loss/launchers.h"
#include "mse_loss/options.h"

// Launch knobs (losslab/build/knobs.py): -DLOSSLAB_MSE_LOSS_VECTORIZED_<KNOB>=<value> builds another one.
#ifndef LOSSLAB_MSE_LOSS_VECTORIZED_THREADS
#define LOSSLAB_MSE_LOSS_VECTORIZED_THREADS 256  // threads per block: 64 128 256 512 1024
#endif
#ifndef LOSSLAB_MSE_LOSS_VECTORIZED_UNROLL
#define LOSSLAB_MSE_LOSS_VECTORIZED_UNROLL 4  // 16-byte loads in flight per tensor in the forward: 1 2 4 8
#endif
constexpr int THREADS = LOSSLAB_MSE_LOSS_VECTORIZED_THREADS;
constexpr int UNROLL = LOSSLAB_MSE_LOSS_VECTORIZED_UNROLL;
static_assert(THREADS >= 64 && THREADS <= 1024 && (THREADS & (THREADS - 1)) == 0,
              "LOSSLAB_MSE_LOSS_VECTORIZED_THREADS: a power of two from 64 to 1024 (whole warps)");
static_assert(UNROLL >= 1, "LOSSLAB_MSE_LOSS_VECTORIZED_UNROLL: at least 1");

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

// dL/dinput = 2 (input - target) * scale, scale = grad_loss / divisor, or each element's
// upstream gradient (reduction none).
template <typename T>
__global__ void __launch_bounds__(THREADS, BLOCKS_PER_SM)
mse_loss_backward_kernel(const T* __restrict__ input,       // (n,)
                         const T* __restrict__ target,      // (n,)
                         const T* __restrict__ grad_loss,   // () or null
                         const T* __restrict__ grad_terms,  // (n,) or null
                         T* __restrict__ grad,              // (n,)
                         int64_t n, float divisor) {
    constexpr int V = Pack<T>::size;
    const float scale = grad_terms ? 2.0f : 2.0f * to_float(*grad_loss) / divisor;
    const int64_t stride = int64_t(gridDim.x) * THREADS;
    const int64_t first = blockIdx.x * int64_t(THREADS) + threadIdx.x;
    const int64_t found = common_head(n, input, target, grad_terms, grad, sizeof(T));
    const int64_t head = found < 0 ? n : found, packs = found < 0 ? 0 : (n - head) / V;
    auto one = [&](int64_t i) {
        const float s = grad_terms ? scale * to_float(grad_terms[i]) : scale;
        grad[i] = from_float<T>((to_float(input[i]) - to_float(target[i])) * s);
    };
    for (int64_t i = first; i < head; i += stride) one(i);
    for (int64_t k = first; k < packs; k += stride) {
        const int64_t i0 = head + V * k;
        const Pack<T> xp = load_pack(input + i0), tp = load_pack(target + i0);
        Pack<T> up;
        up.raw = make_uint4(0, 0, 0, 0);
        if (grad_terms) up = load_pack(grad_terms + i0);
        float g[V];
#pragma unroll
        for (int e = 0; e < V; ++e) g[e] = (xp[e] - tp[e]) * (grad_terms ? scale * up[e] : scale);
        store_pack(grad + i0, pack_of<T>(g));
    }
    for (int64_t i = head + V * packs + first; i < n; i += stride) one(i);
}

cudaError_t mse_loss_vectorized_options_forward(const void* input, const void* target, float* partials, void* loss,
                                                void* elementwise, void* /*grad_input: not fused*/, int64_t n,
                                                float divisor, DType dtype, cudaStream_t stream) {
    return forward_any(input, target, partials, loss, elementwise, nullptr, n, divisor, dtype, stream);
}

cudaError_t mse_loss_vectorized_options_backward(const void* input, const void* target, const void* grad_loss,
                                                 const void* grad_terms, void* grad_input, int64_t n, float divisor,
                                                 DType dtype, cudaStream_t stream) {
    return dispatch_dtype(dtype, [&](auto tag) {
        using T = decltype(tag);
        const int64_t blocks = one_wave_blocks(int64_t(THREADS) * Pack<T>::size, n, BLOCKS_PER_SM,
                                                     MSE_LOSS_MAX_BLOCKS);
        mse_loss_backward_kernel<T><<<blocks, THREADS, 0, stream>>>(
            static_cast<const T*>(input), static_cast<const T*>(target), static_cast<const T*>(grad_loss),
            static_cast<const T*>(grad_terms), static_cast<T*>(grad_input), n, divisor);
        return cudaGetLastError();
    });
}

// The rung's launchers (launchers.h): KernelBench's problem, reduction mean over B x D.
cudaError_t mse_loss_vectorized_forward(const void* predictions, const void* targets, float* row_partials,
                                        void* loss, void* /*grad_predictions: not fused*/, int64_t B, int64_t D,
                                        DType dtype, cudaStream_t stream) {
    return forward_any(predictions, targets, row_partials, loss, nullptr, nullptr, B * D, float(B * D), dtype,
                       stream);
}

cudaError_t mse_loss_vectorized_backward(const void* predictions, const void* targets, const void* grad_loss,
                                         void* grad_predictions, int64_t B, int64_t D, DType dtype,
                                         cudaStream_t stream) {
    return mse_loss_vectorized_options_backward(predictions, targets, grad_loss, nullptr, grad_predictions, B * D,
                                                float(B * D), dtype, stream);
}
