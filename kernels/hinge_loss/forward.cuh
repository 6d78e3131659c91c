// The one forward kernel of the vectorized and fused operators (walk.cuh's walk), in three
// modes: the sum (the loss), the sum and the gradient for grad_loss = 1 (fused), and the terms
// (reduction none). Each rung's file instantiates it with its own launch knobs. The sum alone
// reads inputs that fit in a few L2s with evict-first loads (walk.cuh's evict_first_fits).
#pragma once
#include "common/dispatch.cuh"
#include "common/last_block.cuh"
#include "common/reduce.cuh"
#include "common/stream_workspace.cuh"
#include "hinge_loss/walk.cuh"

enum class Mode { sum, sum_and_grad, terms };

template <typename T, int THREADS, int UNROLL, Mode MODE, bool PACKED, bool EVICT_FIRST = false>
__global__ void __launch_bounds__(THREADS)
hinge_loss_forward_kernel(const T* __restrict__ predictions,  // (B, D)
                          const T* __restrict__ targets,      // (D,)
                          float* __restrict__ partials,       // (gridDim.x,)
                          unsigned int* __restrict__ ticket,  // () zero before the launch and after (not terms)
                          T* __restrict__ loss,               // ()
                          T* __restrict__ out,                // (B, D): the gradient or the terms, or null
                          int64_t B, int64_t D, int64_t columns, float divisor) {
    constexpr int V = Pack<T>::size;
    const float inv_divisor = 1.0f / divisor;
    float sum = 0.0f;
    walk<T, THREADS, UNROLL, PACKED, EVICT_FIRST>(predictions, targets, B, D, columns,
                                     [&](int64_t offset, const Pack<T>& p, const float (&t)[V], int n) {
        float f[V];
#pragma unroll
        for (int k = 0; k < V; ++k) {
            const float x = hinge_margin(p[k], t[k]);
            if (MODE == Mode::terms) {
                f[k] = hinge_term(x);
            } else {
                if (k < n) sum += hinge_term(x);
                if (MODE == Mode::sum_and_grad) f[k] = hinge_grad(x, t[k], inv_divisor);
            }
        }
        if (MODE != Mode::sum) store_some<T, PACKED>(out + offset, f, n);
    });
    if (MODE == Mode::terms) return;  // the whole grid takes this branch
    finish_sum(block_reduce_sum(sum), partials, ticket, divisor, loss);  // the last block: the loss
}

// One kernel; the ticket is the stream's (stream_workspace.cuh), none for the terms.
template <int THREADS, int UNROLL, Mode MODE>
cudaError_t hinge_loss_forward_launch(const void* predictions, const void* targets, float* partials, void* loss,
                                      void* out, int64_t B, int64_t D, float divisor, DType dtype,
                                      cudaStream_t stream) {
    unsigned int* ticket = nullptr;
    if (MODE != Mode::terms) {
        const cudaError_t err = stream_workspace(stream, partials + HINGE_LOSS_MAX_PARTIALS, sizeof(unsigned int),
                                                 reinterpret_cast<void**>(&ticket));
        if (err != cudaSuccess) return err;
    }
    return dispatch_dtype(dtype, [&](auto tag) {
        using T = decltype(tag);
        const Grid grid = walk_grid<T>(B, D, THREADS, UNROLL);
        const auto args = [&](auto kernel) {
            kernel<<<grid.blocks, THREADS, 0, stream>>>(static_cast<const T*>(predictions),
                                                        static_cast<const T*>(targets), partials, ticket,
                                                        static_cast<T*>(loss), static_cast<T*>(out), B, D,
                                                        grid.columns, divisor);
        };
        if (!rows_packed<T>(D, {predictions, targets, out}))
            args(hinge_loss_forward_kernel<T, THREADS, UNROLL, MODE, false>);
        else if (MODE == Mode::sum && evict_first_fits((B + 1) * D * int64_t(sizeof(T))))
            args(hinge_loss_forward_kernel<T, THREADS, UNROLL, MODE, true, MODE == Mode::sum>);
        else
            args(hinge_loss_forward_kernel<T, THREADS, UNROLL, MODE, true>);
        return cudaGetLastError();
    });
}
