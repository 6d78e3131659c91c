// fused: one pass for training. A block holds its row of logits in registers
// and writes the loss and dL/dx = (softmax - onehot) / n_valid (for grad_loss = 1)
// from them, where vectorized's backward read the logits from DRAM a second time:
// two passes over (N, C) instead of three. The backward only scales by grad_loss,
// and not at all when it is 1 (loss.backward()).
#include "common/dispatch.cuh"
#include "common/scale.cuh"
#include "cross_entropy/cross_entropy.cuh"
#include "cross_entropy/launchers.h"
#include "cross_entropy/options.cuh"
#include "cross_entropy/row_packs.cuh"
#include "cross_entropy/valid_mean.cuh"

// Launch knobs (losslab/build/knobs.py): -DLOSSLAB_CROSS_ENTROPY_FUSED_<KNOB>=<value> builds another one.
#ifndef LOSSLAB_CROSS_ENTROPY_FUSED_THREADS
#define LOSSLAB_CROSS_ENTROPY_FUSED_THREADS 128  // threads per block, one block per row: 32 64 128 256 512 1024
#endif
constexpr int THREADS = LOSSLAB_CROSS_ENTROPY_FUSED_THREADS;
static_assert(THREADS >= 32 && THREADS <= 1024 && THREADS % 32 == 0,
              "LOSSLAB_CROSS_ENTROPY_FUSED_THREADS: a multiple of 32 from 32 to 1024 (whole warps)");
constexpr int WARPS = THREADS / 32;
// Packs per thread held in registers: a tile of THREADS * TILE packs, 4096
// floats or 8192 16-bit values, is a whole row at the seed size. Longer rows
// go tile by tile and re-read all but their last tile for the gradient (from
// L2 while the row is recent, else from DRAM).
#ifndef LOSSLAB_CROSS_ENTROPY_FUSED_TILE
#define LOSSLAB_CROSS_ENTROPY_FUSED_TILE 8  // 16-byte packs per thread held in registers: 1 2 4 8 16
#endif
constexpr int TILE = LOSSLAB_CROSS_ENTROPY_FUSED_TILE;
static_assert(TILE >= 1, "LOSSLAB_CROSS_ENTROPY_FUSED_TILE: at least 1");
constexpr int64_t TILE_PACKS = int64_t(THREADS) * TILE;

// This thread's packs of the tile whose first pack (for thread 0) is `start`:
// how many lie before the row's end (0 to TILE); the others are not loaded.
// Every tile but a row's last is full, and TILE, a constant, compiles to no test per pack.
__device__ __forceinline__ int tile_count(int64_t start, int64_t packs) {
    const int64_t left = packs - start - threadIdx.x;
    return left <= 0 ? 0 : int(min(int64_t(TILE), (left + THREADS - 1) / THREADS));
}

template <typename T>
__device__ __forceinline__ void load_tile(Pack<T> (&tile)[TILE], const T* xv, int64_t start, int count) {
    load_packs(tile, xv + Pack<T>::size * (start + threadIdx.x), int64_t(Pack<T>::size) * THREADS, count);
}

// Combine the threads' (max, sum) into the row's: shuffles within each warp,
// then one shared slot per warp and a single barrier. Called once per block,
// so the slots are never overwritten while another warp still reads them.
__device__ __forceinline__ LogSumExp block_reduce_logsumexp_once(LogSumExp acc) {
    __shared__ float warp_max[WARPS], warp_sum[WARPS];
    acc = warp_reduce_logsumexp(acc);
    if (threadIdx.x % 32 == 0) {
        warp_max[threadIdx.x / 32] = acc.max;
        warp_sum[threadIdx.x / 32] = acc.sum;
    }
    __syncthreads();
    LogSumExp row;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) row.max = fmaxf(row.max, warp_max[w]);
#pragma unroll
    for (int w = 0; w < WARPS; ++w) row.sum += warp_sum[w] * expf(warp_max[w] - row.max);
    return row;
}

// At most 64 registers a thread, so 8 rows (8 x 16 KiB) are in flight per SM.
template <typename T>
__global__ void __launch_bounds__(THREADS, 8)
cross_entropy_fused_forward_kernel(const T* __restrict__ logits,         // (N, C)
                                   const int64_t* __restrict__ targets,  // (N,)
                                   int64_t* counters,                    // (4,) from the count stage
                                   int64_t* counts,                      // (4,) written: n_valid, out of range
                                   float* __restrict__ row_losses,       // (N,)
                                   T* __restrict__ loss,                 // ()
                                   T* __restrict__ grad_logits,          // (N, C), for grad_loss = 1
                                   int64_t C) {
    constexpr int V = Pack<T>::size;
    const int64_t row = blockIdx.x;
    const T* x = logits + row * C;
    T* g = grad_logits + row * C;
    const RowSplit split = split_row(C, x, g);
    const T* xv = x + split.head;
    T* gv = g + split.head;
    const int64_t tail = split.head + V * split.packs;
    const int64_t last_tile = (split.packs + TILE_PACKS - 1) / TILE_PACKS - 1;
    const int64_t target = targets[row];  // read early: the loads overlap pass 1
    const float scale = row_grad_scale(target, C, 1.0f / float(counters[0]));

    // Pass 1: the row's log-sum-exp, one tile at a time; the scalar head and tail first.
    LogSumExp lse;
    for (int64_t j = threadIdx.x; j < split.head; j += THREADS) lse_add(lse, to_float(x[j]));
    for (int64_t j = tail + threadIdx.x; j < C; j += THREADS) lse_add(lse, to_float(x[j]));
    Pack<T> tile[TILE];
    for (int64_t t = 0; t <= last_tile; ++t) {
        const int count = tile_count(t * TILE_PACKS, split.packs);
        if (count == TILE) {
            load_tile(tile, xv, t * TILE_PACKS, TILE);
            lse_add_packs(lse, tile, TILE);
        } else if (count > 0) {
            load_tile(tile, xv, t * TILE_PACKS, count);
            lse_add_packs(lse, tile, count);
        }
    }
    lse = block_reduce_logsumexp_once(lse);
    const float log_sum = logf(lse.sum);
    const float partial = threadIdx.x == 0 ? row_loss(x, target, C, lse.max, log_sum) : 0.0f;

    // Pass 2: the gradient, tiles in reverse order, so the tile still in
    // registers (the last) is used first and the others are re-read newest first.
    const GradRow r = grad_row(lse.max, log_sum, scale);
    auto write_tile = [&](int64_t t, int count) {
#pragma unroll
        for (int u = 0; u < TILE; ++u) {
            const int64_t k = t * TILE_PACKS + threadIdx.x + u * THREADS;
            if (u < count) store_pack(gv + V * k, grad_pack(tile[u], split.head + V * k, target, r));
        }
    };
    for (int64_t t = last_tile; t >= 0; --t) {
        const int count = tile_count(t * TILE_PACKS, split.packs);
        if (count == TILE) {
            if (t != last_tile) load_tile(tile, xv, t * TILE_PACKS, TILE);
            write_tile(t, TILE);
        } else {
            if (t != last_tile) load_tile(tile, xv, t * TILE_PACKS, count);
            write_tile(t, count);
        }
    }
    for (int64_t j = threadIdx.x; j < split.head; j += THREADS)
        g[j] = from_float<T>(cross_entropy_grad(to_float(x[j]), j, target, lse.max, log_sum, scale));
    for (int64_t j = tail + threadIdx.x; j < C; j += THREADS)
        g[j] = from_float<T>(cross_entropy_grad(to_float(x[j]), j, target, lse.max, log_sum, scale));
    finish_mean(partial, row_losses, counters, counts, loss);  // the last block: the mean
}

// Needs a gradient buffer: inference runs the vectorized forward instead (the rung table says so).
// Two stages: the counts (each row's gradient needs n_valid), then one kernel whose last block writes the mean.
cudaError_t cross_entropy_fused_forward(const void* logits, const int64_t* targets, int64_t* counts,
                                        float* row_losses, float* /*row_max*/, float* /*row_log_sum*/, void* loss,
                                        void* grad_logits, int64_t N, int64_t C, DType dtype, cudaStream_t stream) {
    if (grad_logits == nullptr) return cudaErrorInvalidValue;
    int64_t* counters;
    const cudaError_t err = cross_entropy_count_targets(targets, counts, N, C, stream, &counters);
    if (err != cudaSuccess) return err;
    return dispatch_dtype(dtype, [&](auto tag) {
        using T = decltype(tag);
        cross_entropy_fused_forward_kernel<T><<<N, THREADS, 0, stream>>>(
            static_cast<const T*>(logits), targets, counters, counts, row_losses, static_cast<T*>(loss),
            static_cast<T*>(grad_logits), C);
        return cudaGetLastError();
    });
}

// The forward wrote dL/dx for grad_loss = 1: scale it in place (no work when grad_loss is 1).
cudaError_t cross_entropy_fused_backward(const void* /*logits*/, const int64_t* /*targets*/,
                                         const float* /*row_max*/, const float* /*row_log_sum*/,
                                         const int64_t* /*counts*/, const void* grad_loss, void* grad_logits,
                                         int64_t N, int64_t C, DType dtype, cudaStream_t stream) {
    return scale_in_place(grad_logits, grad_loss, N * C, dtype, stream);
}

// --- PyTorch's options (options.h), reductions sum and mean: one block per row
// computes the row's statistics, then writes its gradient for grad_loss = 1,
// re-reading the row (16 KiB at C = 4096 fp32: from L1/L2, not DRAM, while it is
// recent) rather than holding it in registers as the kernel above does. The
// gradient's scale needs the mean's denominator first: a prepare stage runs before.
template <typename T>
__global__ void __launch_bounds__(THREADS)
cross_entropy_fused_options_forward_kernel(const T* __restrict__ logits, const int64_t* __restrict__ targets,
                                           const T* __restrict__ probs, RowOptions o,
                                           const float* __restrict__ denominators,  // (2,)
                                           float* __restrict__ partials,            // (N,) each row's loss
                                           unsigned int* __restrict__ ticket,       // () zero before and after
                                           T* __restrict__ loss,                    // ()
                                           T* __restrict__ grad_logits,             // (N, C)
                                           int reduction) {
    const int64_t row = blockIdx.x, C = o.C;
    const T* x = logits + row * C;
    const T* q = probs ? probs + row * C : nullptr;
    const int64_t target = targets ? targets[row] : 0;
    const float x0 = to_float(x[0]);
    RowSums acc;
    visit_row(x, q, C, threadIdx.x, THREADS, [&](int64_t j, float xj, float qj) { row_add(acc, o, j, xj, qj, x0); });
    acc.lse = block_reduce_logsumexp(acc.lse);
    acc.a = block_reduce_sum(acc.a);
    acc.ax = block_reduce_sum(acc.ax);
    const float log_sum = logf(acc.lse.sum);
    const RowResult r = row_result(x, target, o, acc, log_sum, denominators[1]);
    const float mean = reduction == CE_MEAN ? denominators[0] : 1.0f;  // 0 when every row is ignored: NaN
    const float scale = options_row_scale(target, o, 1.0f / mean);
    write_row_grad(x, q, grad_logits + row * C, target, o, acc.lse.max, log_sum, r.coef, scale,
                   int(threadIdx.x), THREADS);
    finish_sum(r.loss, partials, ticket, mean, loss);
}

cudaError_t cross_entropy_fused_options_forward(const void* logits, const int64_t* targets, const void* probs,
                                                const float* weight, float* denominators, float* /*row_losses*/,
                                                float* /*row_max*/, float* /*row_log_sum*/, float* /*row_coef*/,
                                                float* workspace, void* loss, void* grad_logits, int64_t N,
                                                int64_t C, int64_t ignore_index, float label_smoothing,
                                                int reduction, DType dtype, cudaStream_t stream) {
    // the gradient of reduction none needs the upstream gradient of each row: vectorized's backward
    if (grad_logits == nullptr || loss == nullptr || reduction == CE_NONE || (targets == nullptr) == (probs == nullptr))
        return cudaErrorInvalidValue;
    const RowOptions o = row_options(weight, probs, C, ignore_index, label_smoothing);
    unsigned int* ticket;
    float* partials;
    cudaError_t err = options_workspace(stream, workspace, &ticket, &partials);
    if (err == cudaSuccess) err = cross_entropy_options_prepare(targets, weight, denominators, N, C, ignore_index,
                                                                stream);
    if (err != cudaSuccess) return err;
    return dispatch_dtype(dtype, [&](auto tag) {
        using T = decltype(tag);
        cross_entropy_fused_options_forward_kernel<T><<<N, THREADS, 0, stream>>>(
            static_cast<const T*>(logits), targets, static_cast<const T*>(probs), o, denominators, partials, ticket,
            static_cast<T*>(loss), static_cast<T*>(grad_logits), reduction);
        return cudaGetLastError();
    });
}
