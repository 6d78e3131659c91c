// vectorized: one warp per row and 16-byte loads (four floats or eight bf16/fp16
// values), UNROLL of them in flight per lane, where warp_shuffle's 256-thread
// blocks needed barriers for every row's reductions; a warp's reduction is ten
// shuffles and no barrier. (Its forward gain comes from both changes at once.)
//
// A scalar head and tail handle rows that do not start or end on a 16-byte
// boundary (C not a multiple of the pack, or a sliced input). One warp per row
// suits rows up to some tens of thousands of classes: at C = 4096 fp32 a lane
// reads 128 floats in four rounds of UNROLL packs; a few much longer rows would
// leave most of the GPU idle.
#include "common/dispatch.cuh"
#include "common/stream_workspace.cuh"
#include "cross_entropy/cross_entropy.cuh"
#include "cross_entropy/launchers.h"
#include "cross_entropy/options.cuh"
#include "cross_entropy/row_packs.cuh"
#include "cross_entropy/valid_mean.cuh"

// Launch knobs (losslab/build/knobs.py): -DLOSSLAB_CROSS_ENTROPY_VECTORIZED_<KNOB>=<value> builds another one.
#ifndef LOSSLAB_CROSS_ENTROPY_VECTORIZED_FORWARD_WARPS
#define LOSSLAB_CROSS_ENTROPY_VECTORIZED_FORWARD_WARPS 8  // rows per forward block, one warp each: 1 2 4 8 16 32
#endif
#ifndef LOSSLAB_CROSS_ENTROPY_VECTORIZED_BACKWARD_WARPS
#define LOSSLAB_CROSS_ENTROPY_VECTORIZED_BACKWARD_WARPS 4  // rows per backward block, one warp each: 1 2 4 8 16 32
#endif
#ifndef LOSSLAB_CROSS_ENTROPY_VECTORIZED_UNROLL
#define LOSSLAB_CROSS_ENTROPY_VECTORIZED_UNROLL 8  // 16-byte loads in flight per lane: 1 2 4 8 16
#endif
// The forward's blocks are larger than the backward's: half as many blocks, each finishing
// with one barrier and one partial for twice the rows.
constexpr int FORWARD_WARPS = LOSSLAB_CROSS_ENTROPY_VECTORIZED_FORWARD_WARPS;
constexpr int BACKWARD_WARPS = LOSSLAB_CROSS_ENTROPY_VECTORIZED_BACKWARD_WARPS;
constexpr int FORWARD_THREADS = 32 * FORWARD_WARPS, BACKWARD_THREADS = 32 * BACKWARD_WARPS;
constexpr int UNROLL = LOSSLAB_CROSS_ENTROPY_VECTORIZED_UNROLL;
static_assert(FORWARD_WARPS >= 1 && FORWARD_WARPS <= 32,
              "LOSSLAB_CROSS_ENTROPY_VECTORIZED_FORWARD_WARPS: 1 to 32 (at most 1024 threads)");
static_assert(BACKWARD_WARPS >= 1 && BACKWARD_WARPS <= 32,
              "LOSSLAB_CROSS_ENTROPY_VECTORIZED_BACKWARD_WARPS: 1 to 32 (at most 1024 threads)");
static_assert(UNROLL >= 1, "LOSSLAB_CROSS_ENTROPY_VECTORIZED_UNROLL: at least 1");
// 28 backward warps an SM (see the backward kernel), whatever its block size
constexpr int BACKWARD_MIN_BLOCKS = BACKWARD_WARPS < 28 ? 28 / BACKWARD_WARPS : 1;

// One warp's row: its log-sum-exp, every lane getting it.
template <typename T>
__device__ __forceinline__ LogSumExp warp_row_logsumexp(const T* x, int64_t C, int lane) {
    constexpr int V = Pack<T>::size;
    const RowSplit split = split_row(C, x);
    LogSumExp lse;
    for (int64_t j = lane; j < split.head; j += 32) lse_add(lse, to_float(x[j]));

    // UNROLL packs per lane, 32 * UNROLL per warp, loaded before any is used.
    // One rescale of the running sum per round: raise the max over all the
    // packs, then add. Full rounds have no test per pack; the row's last round
    // skips its missing packs, not loading them.
    const T* xv = x + split.head;
    auto round = [&](int64_t first, int count) {
        Pack<T> v[UNROLL];
        load_packs(v, xv + V * first, 32 * V, count);
        lse_add_packs(lse, v, count);
    };
    int64_t first = lane;
    for (; first + 32 * (UNROLL - 1) < split.packs; first += 32 * UNROLL) round(first, UNROLL);
    if (first < split.packs) round(first, int((split.packs - first + 31) / 32));

    for (int64_t j = split.head + V * split.packs + lane; j < C; j += 32) lse_add(lse, to_float(x[j]));
    return warp_reduce_logsumexp(lse);
}

// The whole forward in one kernel: each warp its row, each block the sum of its
// rows' losses and their counts, and the block that finishes last the mean
// (valid_mean.cuh's finish_mean): no count stage before, no mean stage after.
template <typename T>
__global__ void __launch_bounds__(FORWARD_THREADS)
cross_entropy_vectorized_forward_kernel(const T* __restrict__ logits,         // (N, C)
                                        const int64_t* __restrict__ targets,  // (N,)
                                        int64_t* counters,                    // (4,) the stream's: zero before, after
                                        int64_t* counts,                      // (4,) written: n_valid, out of range
                                        float* __restrict__ block_losses,     // (gridDim.x,)
                                        float* __restrict__ row_max,          // (N,)
                                        float* __restrict__ row_log_sum,      // (N,)
                                        T* __restrict__ loss,                 // ()
                                        int64_t N, int64_t C) {
    __shared__ float warp_loss[FORWARD_WARPS];
    __shared__ int64_t warp_target[FORWARD_WARPS];  // ignore_index past the last row: counted as neither
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int64_t row = blockIdx.x * int64_t(FORWARD_WARPS) + warp;
    if (row < N) {  // the whole warp is in or out together, so its shuffles stay full
        const T* x = logits + row * C;
        const LogSumExp lse = warp_row_logsumexp(x, C, lane);
        if (lane == 0) {
            const int64_t target = targets[row];
            const float log_sum = logf(lse.sum);
            warp_loss[warp] = row_loss(x, target, C, lse.max, log_sum);
            warp_target[warp] = target;
            row_max[row] = lse.max;
            row_log_sum[row] = log_sum;
        }
    } else if (lane == 0) {
        warp_loss[warp] = 0.0f;
        warp_target[warp] = IGNORE_INDEX;
    }
    __syncthreads();
    float block_loss = 0.0f;
    if (threadIdx.x == 0) {  // the block's rows in order; integer counts add exactly in any order
        int64_t valid = 0, out_of_range = 0;
#pragma unroll
        for (int w = 0; w < FORWARD_WARPS; ++w) {
            block_loss += warp_loss[w];
            count_target(warp_target[w], C, valid, out_of_range);
        }
        if (valid) atomicAdd(reinterpret_cast<unsigned long long*>(counters), static_cast<unsigned long long>(valid));
        if (out_of_range)
            atomicAdd(reinterpret_cast<unsigned long long*>(counters + 1),
                      static_cast<unsigned long long>(out_of_range));
    }
    finish_mean(block_loss, block_losses, counters, counts, loss);
}

// One warp per row, as the forward: UNROLL pack loads in flight per lane, then
// UNROLL pack stores. The gradient is freshly allocated (aligned), so a
// misaligned input takes the scalar path for every row. At most 72 registers
// a thread (7 blocks, 28 warps an SM): left alone the compiler takes 80-96,
// and fewer warps keep fewer loads in flight; 64 would spill for 16-bit types.
template <typename T>
__global__ void __launch_bounds__(BACKWARD_THREADS, BACKWARD_MIN_BLOCKS)
cross_entropy_vectorized_backward_kernel(const T* __restrict__ logits,           // (N, C)
                                         const int64_t* __restrict__ targets,    // (N,)
                                         const float* __restrict__ row_max,      // (N,)
                                         const float* __restrict__ row_log_sum,  // (N,)
                                         const int64_t* __restrict__ counts,     // (4,)
                                         const T* __restrict__ grad_loss,        // ()
                                         T* __restrict__ grad_logits,            // (N, C)
                                         int64_t N, int64_t C) {
    constexpr int V = Pack<T>::size;
    const int lane = threadIdx.x % 32;
    const int64_t row = blockIdx.x * int64_t(BACKWARD_WARPS) + threadIdx.x / 32;
    if (row >= N) return;
    const int64_t target = targets[row];
    const float scale = row_grad_scale(target, C, to_float(*grad_loss) / float(counts[0]));
    const float m = row_max[row], log_sum = row_log_sum[row];
    const T* x = logits + row * C;
    T* g = grad_logits + row * C;
    const RowSplit split = split_row(C, x, g);
    for (int64_t j = lane; j < split.head; j += 32)
        g[j] = from_float<T>(cross_entropy_grad(to_float(x[j]), j, target, m, log_sum, scale));

    const GradRow r = grad_row(m, log_sum, scale);
    const T* xv = x + split.head;
    T* gv = g + split.head;
    // Full rounds, with no test per pack; then the row's last, partial round.
    auto round = [&](int64_t first, int count) {
        Pack<T> v[UNROLL];
        load_packs(v, xv + V * first, 32 * V, count);
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int64_t k = first + 32 * u;
            if (u < count) store_pack(gv + V * k, grad_pack(v[u], split.head + V * k, target, r));
        }
    };
    int64_t first = lane;
    for (; first + 32 * (UNROLL - 1) < split.packs; first += 32 * UNROLL) round(first, UNROLL);
    if (first < split.packs) round(first, int((split.packs - first + 31) / 32));

    for (int64_t j = split.head + V * split.packs + lane; j < C; j += 32)
        g[j] = from_float<T>(cross_entropy_grad(to_float(x[j]), j, target, m, log_sum, scale));
}

// One kernel, counting in the stream's workspace (common/stream_workspace.cuh): no memset per call.
cudaError_t cross_entropy_vectorized_forward(const void* logits, const int64_t* targets, int64_t* counts,
                                             float* row_losses, float* row_max, float* row_log_sum, void* loss,
                                             void* /*grad_logits: not fused*/, int64_t N, int64_t C, DType dtype,
                                             cudaStream_t stream) {
    int64_t* counters;
    const cudaError_t err = stream_workspace(stream, counts, 4 * sizeof(int64_t), reinterpret_cast<void**>(&counters));
    if (err != cudaSuccess) return err;
    const int64_t blocks = (N + FORWARD_WARPS - 1) / FORWARD_WARPS;
    return dispatch_dtype(dtype, [&](auto tag) {
        using T = decltype(tag);
        cross_entropy_vectorized_forward_kernel<T><<<blocks, FORWARD_THREADS, 0, stream>>>(
            static_cast<const T*>(logits), targets, counters, counts, row_losses, row_max, row_log_sum,
            static_cast<T*>(loss), N, C);
        return cudaGetLastError();
    });
}

cudaError_t cross_entropy_vectorized_backward(const void* logits, const int64_t* targets,
                                              const float* row_max, const float* row_log_sum,
                                              const int64_t* counts, const void* grad_loss,
                                              void* grad_logits, int64_t N, int64_t C, DType dtype,
                                              cudaStream_t stream) {
    const int64_t blocks = (N + BACKWARD_WARPS - 1) / BACKWARD_WARPS;
    return dispatch_dtype(dtype, [&](auto tag) {
        using T = decltype(tag);
        cross_entropy_vectorized_backward_kernel<T><<<blocks, BACKWARD_THREADS, 0, stream>>>(
            static_cast<const T*>(logits), targets, row_max, row_log_sum, counts, static_cast<const T*>(grad_loss),
            static_cast<T*>(grad_logits), N, C);
        return cudaGetLastError();
    });
}

// --- PyTorch's options (options.h): weights, ignore_index, label smoothing, class
// probabilities, reductions. One warp per row as above, packs loaded one at a time;
// each block adds its rows' losses (and, without weights, counts the rows the mean
// divides by), and the last block writes the loss and the denominators.

// At most 64 registers a thread (1024 threads an SM): left to itself ptxas chose 40 for
// bf16 on sm_80 and spilled the row's offset.
template <typename T>
__global__ void __launch_bounds__(FORWARD_THREADS, 1024 / FORWARD_THREADS)
cross_entropy_options_forward_kernel(const T* __restrict__ logits,         // (N, C)
                                     const int64_t* __restrict__ targets,  // (N,) or null
                                     const T* __restrict__ probs,          // (N, C) or null
                                     RowOptions o,
                                     float* __restrict__ denominators,     // (2,): from prepare with weights
                                     float* __restrict__ row_losses,       // (N,) or null
                                     float* __restrict__ row_max,          // (N,) or null, as the next two
                                     float* __restrict__ row_log_sum, float* __restrict__ row_coef,
                                     float* __restrict__ partials,         // (2 * gridDim.x,)
                                     unsigned int* __restrict__ ticket,    // () zero before the launch and after
                                     T* __restrict__ loss,                 // () or null (reduction none)
                                     int64_t N, int reduction) {
    __shared__ float warp_loss[FORWARD_WARPS], warp_count[FORWARD_WARPS];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int64_t row = blockIdx.x * int64_t(FORWARD_WARPS) + warp;
    if (row < N) {  // the whole warp is in or out together, so its shuffles stay full
        const int64_t C = o.C;
        const T* x = logits + row * C;
        const T* q = probs ? probs + row * C : nullptr;
        const float x0 = to_float(x[0]);
        RowSums acc;
        visit_row(x, q, C, lane, 32, [&](int64_t j, float xj, float qj) { row_add(acc, o, j, xj, qj, x0); });
        acc.lse = warp_reduce_logsumexp(acc.lse);
        acc.a = warp_reduce_sum(acc.a);
        acc.ax = warp_reduce_sum(acc.ax);
        if (lane == 0) {
            const int64_t target = targets ? targets[row] : 0;
            const float log_sum = logf(acc.lse.sum);
            const RowResult r = row_result(x, target, o, acc, log_sum, o.weight ? denominators[1] : float(C));
            if (row_losses) row_losses[row] = r.loss;
            if (row_max) {
                row_max[row] = acc.lse.max;
                row_log_sum[row] = log_sum;
                row_coef[row] = r.coef;
            }
            warp_loss[warp] = r.loss;
            warp_count[warp] = !targets || (target != o.ignore_index && target_in_range(target, C)) ? 1.0f : 0.0f;
        }
    } else if (lane == 0) {
        warp_loss[warp] = warp_count[warp] = 0.0f;
    }
    __syncthreads();
    float block_loss = 0.0f, block_count = 0.0f;
    if (threadIdx.x == 0) {  // the block's rows in order
#pragma unroll
        for (int w = 0; w < FORWARD_WARPS; ++w) {
            block_loss += warp_loss[w];
            block_count += warp_count[w];
        }
        partials[gridDim.x + blockIdx.x] = block_count;  // published with the loss's partial, below
    }
    if (!publish_partial(block_loss, partials, ticket, blockIdx.x, gridDim.x)) return;
    const float sum = sum_in_order(partials, gridDim.x);
    const float count = o.weight ? 0.0f : sum_in_order(partials + gridDim.x, gridDim.x);
    if (threadIdx.x == 0) {
        if (!o.weight) {  // else prepare wrote them
            denominators[0] = count;
            denominators[1] = float(o.C);
        }
        // mean with every row ignored: 0 / 0 = NaN, as in PyTorch
        if (loss) *loss = from_float<T>(reduction == CE_MEAN ? sum / denominators[0] : sum);
    }
}

template <typename T>
__global__ void __launch_bounds__(BACKWARD_THREADS)
cross_entropy_options_backward_kernel(const T* __restrict__ logits, const int64_t* __restrict__ targets,
                                      const T* __restrict__ probs, RowOptions o,
                                      const float* __restrict__ denominators, const float* __restrict__ row_max,
                                      const float* __restrict__ row_log_sum, const float* __restrict__ row_coef,
                                      const float* __restrict__ grad_loss,  // () or (N,) for reduction none
                                      T* __restrict__ grad_logits, int64_t N, int reduction) {
    const int lane = threadIdx.x % 32;
    const int64_t row = blockIdx.x * int64_t(BACKWARD_WARPS) + threadIdx.x / 32;
    if (row >= N) return;
    const int64_t C = o.C;
    const int64_t target = targets ? targets[row] : 0;
    const float upstream = reduction == CE_NONE ? grad_loss[row]
                           : reduction == CE_MEAN ? *grad_loss / denominators[0] : *grad_loss;
    const float scale = options_row_scale(target, o, upstream);
    write_row_grad(logits + row * C, probs ? probs + row * C : nullptr, grad_logits + row * C, target, o,
                   row_max[row], row_log_sum[row], row_coef[row], scale, lane, 32);
}

cudaError_t cross_entropy_vectorized_options_forward(const void* logits, const int64_t* targets, const void* probs,
                                                     const float* weight, float* denominators,
                                                     float* row_losses, float* row_max, float* row_log_sum,
                                                     float* row_coef, float* workspace, void* loss,
                                                     void* /*grad_logits*/, int64_t N, int64_t C,
                                                     int64_t ignore_index, float label_smoothing, int reduction,
                                                     DType dtype, cudaStream_t stream) {
    if ((targets == nullptr) == (probs == nullptr) || (reduction == CE_NONE) != (loss == nullptr))
        return cudaErrorInvalidValue;
    const RowOptions o = row_options(weight, probs, C, ignore_index, label_smoothing);
    unsigned int* ticket;
    float* partials;
    cudaError_t err = options_workspace(stream, workspace, &ticket, &partials);
    if (err == cudaSuccess && weight) err = cross_entropy_options_prepare(targets, weight, denominators, N, C,
                                                                          ignore_index, stream);
    if (err != cudaSuccess) return err;
    const int64_t blocks = (N + FORWARD_WARPS - 1) / FORWARD_WARPS;
    return dispatch_dtype(dtype, [&](auto tag) {
        using T = decltype(tag);
        cross_entropy_options_forward_kernel<T><<<blocks, FORWARD_THREADS, 0, stream>>>(
            static_cast<const T*>(logits), targets, static_cast<const T*>(probs), o, denominators, row_losses,
            row_max, row_log_sum, row_coef, partials, ticket, static_cast<T*>(loss), N, reduction);
        return cudaGetLastError();
    });
}

cudaError_t cross_entropy_vectorized_options_backward(const void* logits, const int64_t* targets, const void* probs,
                                                      const float* weight, const float* denominators,
                                                      const float* row_max, const float* row_log_sum,
                                                      const float* row_coef, const float* grad_loss,
                                                      void* grad_logits, int64_t N, int64_t C, int64_t ignore_index,
                                                      float label_smoothing, int reduction, DType dtype,
                                                      cudaStream_t stream) {
    if ((targets == nullptr) == (probs == nullptr)) return cudaErrorInvalidValue;
    const RowOptions o = row_options(weight, probs, C, ignore_index, label_smoothing);
    const int64_t blocks = (N + BACKWARD_WARPS - 1) / BACKWARD_WARPS;
    return dispatch_dtype(dtype, [&](auto tag) {
        using T = decltype(tag);
        cross_entropy_options_backward_kernel<T><<<blocks, BACKWARD_THREADS, 0, stream>>>(
            static_cast<const T*>(logits), targets, static_cast<const T*>(probs), o, denominators, row_max,
            row_log_sum, row_coef, grad_loss, static_cast<T*>(grad_logits), N, reduction);
        return cudaGetLastError();
    });
}
