// vectorized: 16-byte loads, UNROLL rows in flight per thread, and the targets read once per
// block (walk.cuh): each thread keeps its pack of targets in registers for all its rows, where
// warp_shuffle loads a 4-byte t[j] beside every 4-byte p. The forward is one kernel (the last
// block adds the partial sums: common/last_block.cuh); the backward walks the same way and
// writes the gradient. Rows that are not 16-byte aligned (D not a multiple of the pack, a
// storage offset) take the same walk with element-wise loads.
#include "hinge_loss/forward.cuh"
#include "hinge_loss/launchers.h"
#include "hinge_loss/options.h"

// Launch knobs (losslab/build/knobs.py): -DLOSSLAB_HINGE_LOSS_VECTORIZED_<KNOB>=<value> builds another one.
// 512 threads, chosen by measurement (32768 x 32768 forward, 256 -> 512 threads: H100 float32
// 1.445 -> 1.393 ms, bfloat16 0.729 -> 0.701; H200 float32 1.040 -> 0.971, bfloat16 0.528 -> 0.489).
#ifndef LOSSLAB_HINGE_LOSS_VECTORIZED_THREADS
#define LOSSLAB_HINGE_LOSS_VECTORIZED_THREADS 512  // threads per block: 32 64 128 256 512 1024
#endif
#ifndef LOSSLAB_HINGE_LOSS_VECTORIZED_UNROLL
#define LOSSLAB_HINGE_LOSS_VECTORIZED_UNROLL 4  // rows whose 16-byte pack is in flight per thread: 1 2 4 8 16
#endif
constexpr int THREADS = LOSSLAB_HINGE_LOSS_VECTORIZED_THREADS;
constexpr int UNROLL = LOSSLAB_HINGE_LOSS_VECTORIZED_UNROLL;
static_assert(THREADS >= 32 && THREADS <= 1024 && THREADS % 32 == 0,
              "LOSSLAB_HINGE_LOSS_VECTORIZED_THREADS: a multiple of 32 from 32 to 1024 (whole warps)");
static_assert(UNROLL >= 1, "LOSSLAB_HINGE_LOSS_VECTORIZED_UNROLL: at least 1");

// dL/dp = -(x > 0 ? s : 0) * t with s = grad_loss / divisor, or each element's upstream
// gradient (reduction none: TERMS).
template <typename T, bool TERMS, bool PACKED>
__global__ void __launch_bounds__(THREADS)
hinge_loss_vectorized_backward_kernel(const T* __restrict__ predictions,  // (B, D)
                                      const T* __restrict__ targets,      // (D,)
                                      const T* __restrict__ grad_loss,    // ()
                                      const T* __restrict__ grad_terms,   // (B, D) or null
                                      T* __restrict__ grad,               // (B, D)
                                      int64_t B, int64_t D, int64_t columns, float divisor) {
    constexpr int V = Pack<T>::size;
    const float scale = TERMS ? 0.0f : to_float(*grad_loss) / divisor;
    walk<T, THREADS, UNROLL, PACKED>(predictions, targets, B, D, columns,
                                     [&](int64_t offset, const Pack<T>& p, const float (&t)[V], int n) {
        Pack<T> upstream;
        if (TERMS) upstream = load_some<T, PACKED>(grad_terms + offset, n);
        float f[V];
#pragma unroll
        for (int k = 0; k < V; ++k) f[k] = hinge_grad(hinge_margin(p[k], t[k]), t[k], TERMS ? upstream[k] : scale);
        store_some<T, PACKED>(grad + offset, f, n);
    });
}

cudaError_t hinge_loss_vectorized_options_forward(const void* input, const void* target, float* partials, void* loss,
                                                  void* elementwise, void* /*grad_input: not fused*/, int64_t B,
                                                  int64_t D, float divisor, DType dtype, cudaStream_t stream) {
    if (elementwise != nullptr)
        return hinge_loss_forward_launch<THREADS, UNROLL, Mode::terms>(input, target, partials, loss, elementwise, B,
                                                                       D, divisor, dtype, stream);
    return hinge_loss_forward_launch<THREADS, UNROLL, Mode::sum>(input, target, partials, loss, nullptr, B, D,
                                                                 divisor, dtype, stream);
}

cudaError_t hinge_loss_vectorized_options_backward(const void* input, const void* target, const void* grad_loss,
                                                   const void* grad_terms, void* grad_input, int64_t B, int64_t D,
                                                   float divisor, DType dtype, cudaStream_t stream) {
    return dispatch_dtype(dtype, [&](auto tag) {
        using T = decltype(tag);
        const Grid grid = walk_grid<T>(B, D, THREADS);
        const auto args = [&](auto kernel) {
            kernel<<<grid.blocks, THREADS, 0, stream>>>(static_cast<const T*>(input), static_cast<const T*>(target),
                                                        static_cast<const T*>(grad_loss),
                                                        static_cast<const T*>(grad_terms),
                                                        static_cast<T*>(grad_input), B, D, grid.columns, divisor);
        };
        const bool packed = rows_packed<T>(D, {input, target, grad_terms, grad_input});
        if (grad_terms != nullptr && packed) args(hinge_loss_vectorized_backward_kernel<T, true, true>);
        else if (grad_terms != nullptr) args(hinge_loss_vectorized_backward_kernel<T, true, false>);
        else if (packed) args(hinge_loss_vectorized_backward_kernel<T, false, true>);
        else args(hinge_loss_vectorized_backward_kernel<T, false, false>);
        return cudaGetLastError();
    });
}

// The rung (launchers.h): PyTorch's reference, the mean over B * D.
cudaError_t hinge_loss_vectorized_forward(const void* predictions, const void* targets, float* partials, void* loss,
                                          void* /*grad_predictions: not fused*/, int64_t B, int64_t D, DType dtype,
                                          cudaStream_t stream) {
    return hinge_loss_vectorized_options_forward(predictions, targets, partials, loss, nullptr, nullptr, B, D,
                                                 float(B * D), dtype, stream);
}

cudaError_t hinge_loss_vectorized_backward(const void* predictions, const void* targets, const void* grad_loss,
                                           void* grad_predictions, int64_t B, int64_t D, DType dtype,
                                           cudaStream_t stream) {
    return hinge_loss_vectorized_options_backward(predictions, targets, grad_loss, nullptr, grad_predictions, B, D,
                                                  float(B * D), dtype, stream);
}
