// vectorized: warp_shuffle's structure with 128-bit loads. Each thread issues
// UNROLL float4 loads before using any of them: four times the bytes per
// instruction and UNROLL times the loads in flight, where scalar loads left too
// few in flight to saturate HBM. A scalar head and tail handle rows that do not
// start or end on a 16-byte boundary (C not a multiple of 4, or a sliced input).
#include "cross_entropy.cuh"
#include "launchers.h"
#include "../common/vector_load.cuh"

constexpr int THREADS = 256;
constexpr int UNROLL = 4;

// A row as a scalar head up to the first 16-byte boundary, body4 float4s, and
// a scalar tail. Vector loads and stores need `a` and `b` at the same offset
// from a boundary; if they are not, the head takes the whole row.
struct RowSplit {
    int64_t head, body4;
};

__device__ __forceinline__ RowSplit split_row(const float* a, const float* b, int64_t C) {
    if (reinterpret_cast<uintptr_t>(a) % 16 != reinterpret_cast<uintptr_t>(b) % 16) return {C, 0};
    const int64_t head = min(C, int64_t(elements_to_alignment(a)));
    return {head, (C - head) / 4};
}

__device__ __forceinline__ float max4(float4 v) {
    return fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w));
}

// The caller has raised the running max to cover v, so no rescaling here.
__device__ __forceinline__ float sum_exp4(float4 v, float max) {
    return expf(v.x - max) + expf(v.y - max) + expf(v.z - max) + expf(v.w - max);
}

__global__ void __launch_bounds__(THREADS)
cross_entropy_vectorized_forward_kernel(const float* __restrict__ logits,     // (N, C)
                                        const int64_t* __restrict__ targets,  // (N,)
                                        float* __restrict__ row_losses,       // (N,)
                                        float* __restrict__ row_max,          // (N,)
                                        float* __restrict__ row_log_sum,      // (N,)
                                        int64_t C) {
    const int64_t row = blockIdx.x;
    const float* x = logits + row * C;
    const RowSplit split = split_row(x, x, C);
    LogSumExp lse;
    for (int64_t j = threadIdx.x; j < split.head; j += THREADS) lse_add(lse, x[j]);

    // One rescale per UNROLL float4s: raise the max over all of them, then add.
    const float* xv = x + split.head;
    int64_t i = threadIdx.x;
    for (; i + (UNROLL - 1) * THREADS < split.body4; i += UNROLL * THREADS) {
        float4 v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) v[u] = load_float4(xv + 4 * (i + u * THREADS));
        float m = max4(v[0]);
#pragma unroll
        for (int u = 1; u < UNROLL; ++u) m = fmaxf(m, max4(v[u]));
        lse_raise_max(lse, m);
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) lse.sum += sum_exp4(v[u], lse.max);
    }
    for (; i < split.body4; i += THREADS) {
        const float4 v = load_float4(xv + 4 * i);
        lse_raise_max(lse, max4(v));
        lse.sum += sum_exp4(v, lse.max);
    }

    for (int64_t j = split.head + 4 * split.body4 + threadIdx.x; j < C; j += THREADS) lse_add(lse, x[j]);

    lse = block_reduce_logsumexp(lse);
    if (threadIdx.x == 0) store_row(x, targets[row], C, lse, row, row_losses, row_max, row_log_sum);
}

// The gradient of the four columns j .. j + 3 held in v.
__device__ __forceinline__ float4 cross_entropy_grad4(float4 v, int64_t j, int64_t target, float m,
                                                      float log_sum, float scale) {
    return make_float4(cross_entropy_grad(v.x, j, target, m, log_sum, scale),
                       cross_entropy_grad(v.y, j + 1, target, m, log_sum, scale),
                       cross_entropy_grad(v.z, j + 2, target, m, log_sum, scale),
                       cross_entropy_grad(v.w, j + 3, target, m, log_sum, scale));
}

// One block per row, as the forward: UNROLL float4 loads in flight per thread,
// then UNROLL float4 stores. The gradient is freshly allocated (aligned), so a
// misaligned input takes the scalar path for every row.
__global__ void __launch_bounds__(THREADS)
cross_entropy_vectorized_backward_kernel(const float* __restrict__ logits,       // (N, C)
                                         const int64_t* __restrict__ targets,    // (N,)
                                         const float* __restrict__ row_max,      // (N,)
                                         const float* __restrict__ row_log_sum,  // (N,)
                                         const int64_t* __restrict__ counts,     // (2,)
                                         const float* __restrict__ grad_loss,    // ()
                                         float* __restrict__ grad_logits,        // (N, C)
                                         int64_t C) {
    const int64_t row = blockIdx.x;
    const int64_t target = targets[row];
    const float scale = row_grad_scale(target, C, *grad_loss / float(counts[0]));
    const float m = row_max[row], log_sum = row_log_sum[row];
    const float* x = logits + row * C;
    float* g = grad_logits + row * C;
    const RowSplit split = split_row(x, g, C);
    for (int64_t j = threadIdx.x; j < split.head; j += THREADS)
        g[j] = cross_entropy_grad(x[j], j, target, m, log_sum, scale);

    const float* xv = x + split.head;
    float* gv = g + split.head;
    int64_t i = threadIdx.x;
    for (; i + (UNROLL - 1) * THREADS < split.body4; i += UNROLL * THREADS) {
        float4 v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) v[u] = load_float4(xv + 4 * (i + u * THREADS));
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int64_t k = i + u * THREADS;
            store_float4(gv + 4 * k,
                         cross_entropy_grad4(v[u], split.head + 4 * k, target, m, log_sum, scale));
        }
    }
    for (; i < split.body4; i += THREADS)
        store_float4(gv + 4 * i, cross_entropy_grad4(load_float4(xv + 4 * i), split.head + 4 * i,
                                                     target, m, log_sum, scale));

    for (int64_t j = split.head + 4 * split.body4 + threadIdx.x; j < C; j += THREADS)
        g[j] = cross_entropy_grad(x[j], j, target, m, log_sum, scale);
}

cudaError_t cross_entropy_vectorized_forward(const float* logits, const int64_t* targets,
                                             float* row_losses, float* row_max, float* row_log_sum,
                                             float* loss, int64_t* counts, int64_t N, int64_t C,
                                             cudaStream_t stream) {
    cross_entropy_vectorized_forward_kernel<<<N, THREADS, 0, stream>>>(
        logits, targets, row_losses, row_max, row_log_sum, C);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    return cross_entropy_valid_mean(row_losses, targets, loss, counts, N, C, stream);
}

cudaError_t cross_entropy_vectorized_backward(const float* logits, const int64_t* targets,
                                              const float* row_max, const float* row_log_sum,
                                              const int64_t* counts, const float* grad_loss,
                                              float* grad_logits, int64_t N, int64_t C,
                                              cudaStream_t stream) {
    cross_entropy_vectorized_backward_kernel<<<N, THREADS, 0, stream>>>(
        logits, targets, row_max, row_log_sum, counts, grad_loss, grad_logits, C);
    return cudaGetLastError();
}
