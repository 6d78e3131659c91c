// A wrong answer to the hinge_vectorize exercise, test data for tests/test_exercises.py:
// the tile read one float at a time: right numbers, 4-byte loads.
//
// The warp_shuffle rung reads one float of p and one of t[j] per element and
// thread: too few bytes in flight to cover DRAM's latency, and half the loads
// for a (D,) vector every row shares. Here each thread owns 4 columns j .. j + 3
// of a row: it reads their targets once, as one float4, keeps them in
// registers for all its block's rows, and reads p's 4 columns of each row as
// one float4 (LDG.E.128), UNROLL rows in flight before it uses any.
//
// The grid is written for you: `columns` blocks across a row (thread k of
// block c owns columns 4 (c THREADS + k) ..., stepping 4 THREADS columns), and
// the blocks of one column tile take rows group, group + groups, ...
// load4(row, j, n, packed) reads columns j .. j + n - 1 (n <= 4) of a row: one
// 16-byte load when `packed` (every row 16-byte aligned), else n scalar ones;
// term4(p, t, n) is the sum of the first n of four elements' hinge terms.
//
// Contract of what you write in the column loop: over the grid every element
// of predictions is added exactly once to some thread's `sum` (any B, any D:
// n < 4 in a row's last tile), each thread reading its targets once per
// column tile, not once per row.
#include <algorithm>
#include "hinge_loss/hinge_loss.cuh"
#include "common/reduce.cuh"
#include "common/sum_partials.cuh"
#include "common/vector_load.cuh"
#include "hinge_loss/launchers.h"

constexpr int THREADS = 256;
constexpr int UNROLL = 4;  // rows whose float4 of p is in flight per thread

// Columns j .. j + n - 1 (n <= 4) of one row: one 16-byte load where rows are aligned.
__device__ __forceinline__ float4 load4(const float* row, int64_t j, int n, bool packed) {
    if (packed) return *reinterpret_cast<const float4*>(row + j);
    float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int k = 0; k < 4; ++k) if (k < n) v[k] = row[j + k];
    return make_float4(v[0], v[1], v[2], v[3]);
}

// The sum of the first n of four elements' terms.
__device__ __forceinline__ float term4(float4 p, float4 t, int n) {
    const float x[4] = {hinge_margin(p.x, t.x), hinge_margin(p.y, t.y), hinge_margin(p.z, t.z), hinge_margin(p.w, t.w)};
    return ((hinge_term(x[0]) + (n > 1 ? hinge_term(x[1]) : 0.0f)) + (n > 2 ? hinge_term(x[2]) : 0.0f)) +
           (n > 3 ? hinge_term(x[3]) : 0.0f);
}

__global__ void __launch_bounds__(THREADS)
tile_forward_kernel(const float* __restrict__ predictions,  // (B, D)
                    const float* __restrict__ targets,      // (D,)
                    float* __restrict__ partials,           // (gridDim.x,)
                    int64_t B, int64_t D, int64_t columns) {
    const int64_t groups = gridDim.x / columns, group = blockIdx.x / columns;  // rows group, group + groups, ...
    const bool packed = D % 4 == 0 && is_aligned_16(predictions) && is_aligned_16(targets);
    float sum = 0.0f;
    for (int64_t j = 4 * ((blockIdx.x % columns) * THREADS + threadIdx.x); j < D; j += 4 * THREADS * columns) {
        const int n = D - j < 4 ? int(D - j) : 4;  // this tile's columns: 4, or fewer at the row's end
        const float4 t = load4(targets, j, n, false);  // once, for all the block's rows
        for (int64_t row = group; row < B; row += UNROLL * groups) {
            float4 pb[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u)  // all in flight
                if (row + u * groups < B) pb[u] = load4(predictions + (row + u * groups) * D, j, n, false);
#pragma unroll
            for (int u = 0; u < UNROLL; ++u)
                if (row + u * groups < B) sum += term4(pb[u], t, n);
        }
    }
    sum = block_reduce_sum(sum);
    if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

cudaError_t hinge_loss_custom_forward(const void* predictions_, const void* targets_, float* partials,
                                      void* loss, void* /*grad_predictions: not fused*/, int64_t B, int64_t D,
                                      DType dtype, cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // float32 only
    const float* predictions = static_cast<const float*>(predictions_);
    const float* targets = static_cast<const float*>(targets_);
    // `columns` blocks across a row, and as many groups of rows as keep the blocks at most 1024 (one partial each)
    const int64_t columns = std::min<int64_t>((D + 4 * THREADS - 1) / (4 * THREADS), HINGE_LOSS_MAX_PARTIALS);
    const int64_t blocks = columns * std::max<int64_t>(1, std::min<int64_t>(B, HINGE_LOSS_MAX_PARTIALS / columns));
    tile_forward_kernel<<<blocks, THREADS, 0, stream>>>(predictions, targets, partials, B, D, columns);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    return launch_sum_partials(partials, blocks, float(B) * float(D), loss, stream);  // the mean over B D
}
