// fused: the forward also writes dL/dp for grad_loss = 1; the backward only scales it.
// flaw of vectorized: training reads p and t twice, in the forward and again in the backward.
// idea: the forward holds p and t already: it writes -(x > 0) * t / (B D) beside the loss,
//     2 passes over B x D for training where vectorized makes 3 (the forward's read of p,
//     the backward's read of p and write of dL/dp), and the backward scales that gradient
//     in place by grad_loss, not at all when grad_loss is 1 (loss.backward()).
// not faster: forward (it also writes the gradient: inference runs vectorized's forward)
#include <algorithm>
#include "common/sum_partials.cuh"
#include "common/vector_load.cuh"
#include "hinge_loss/hinge_loss.cuh"
#include "hinge_loss/ladder/ladder.h"

namespace {

constexpr int THREADS = 256;
constexpr int UNROLL = 4;  // rows whose float4 of p is in flight per thread

// A warp's 32 values summed by butterfly exchanges between registers: after 5 steps of
// __shfl_xor_sync (offsets 16, 8, 4, 2, 1) every lane holds the sum. No shared memory.
__device__ __forceinline__ float warp_sum(float value) {
    for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
    return value;
}

// The block's sum, in thread 0: each warp sums its lanes, lane 0 of each warp writes one
// shared slot, and after one barrier warp 0 sums the THREADS / 32 slots.
__device__ __forceinline__ float block_sum(float value) {
    __shared__ float partial[THREADS / 32];
    value = warp_sum(value);
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = value;
    __syncthreads();
    return threadIdx.x < 32 ? warp_sum(threadIdx.x < THREADS / 32 ? partial[threadIdx.x] : 0.0f) : 0.0f;
}

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

// The gradient of the first n of four elements, stored at g[j ...].
__device__ __forceinline__ void store_grad4(float* g, int64_t j, int n, bool packed, float4 p, float4 t, float s) {
    const float v[4] = {hinge_grad(hinge_margin(p.x, t.x), t.x, s), hinge_grad(hinge_margin(p.y, t.y), t.y, s),
                        hinge_grad(hinge_margin(p.z, t.z), t.z, s), hinge_grad(hinge_margin(p.w, t.w), t.w, s)};
    if (packed) {
        // __stwb: a plain store, kept whole (nvcc 13 split `*(float4*)(g + j) = ...` here into 4-byte stores)
        __stwb(reinterpret_cast<float4*>(g + j), make_float4(v[0], v[1], v[2], v[3]));
        return;
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) if (k < n) g[j + k] = v[k];
}

__global__ void __launch_bounds__(THREADS) forward_kernel(
    const float* __restrict__ predictions,  // (B, D)
    const float* __restrict__ targets,      // (D,)
    float* __restrict__ partials,           // (gridDim.x,)
    float* __restrict__ grad_predictions,   // (B, D): dL/dp for grad_loss = 1
    int64_t B, int64_t D, int64_t columns) {
    const float inv_n = 1.0f / (float(B) * float(D));
    const int64_t groups = gridDim.x / columns, group = blockIdx.x / columns;  // rows group, group + groups, ...
    const bool packed = D % 4 == 0 && is_aligned_16(predictions) && is_aligned_16(targets) &&
                        is_aligned_16(grad_predictions);
    float sum = 0.0f;
    for (int64_t j = 4 * ((blockIdx.x % columns) * THREADS + threadIdx.x); j < D; j += 4 * THREADS * columns) {
        const int n = D - j < 4 ? int(D - j) : 4;
        const float4 t = load4(targets, j, n, packed);  // once, for all the block's rows
        for (int64_t row = group; row < B; row += UNROLL * groups) {
            float4 pb[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u)  // all in flight
                if (row + u * groups < B) pb[u] = load4(predictions + (row + u * groups) * D, j, n, packed);
#pragma unroll
            for (int u = 0; u < UNROLL; ++u)
                if (row + u * groups < B) {
                    sum += term4(pb[u], t, n);
                    store_grad4(grad_predictions + (row + u * groups) * D, j, n, packed, pb[u], t, inv_n);
                }
        }
    }
    sum = block_sum(sum);
    if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

__global__ void __launch_bounds__(THREADS) backward_kernel(
    const float* __restrict__ grad_loss,    // ()
    float* __restrict__ grad_predictions,   // (B, D): the forward's, for grad_loss = 1
    int64_t n) {
    const float scale = *grad_loss;
    if (scale == 1.0f) return;  // loss.backward(): the forward's gradient is final, no byte moves
    for (int64_t i = blockIdx.x * int64_t(THREADS) + threadIdx.x; i < n; i += int64_t(gridDim.x) * THREADS)
        grad_predictions[i] *= scale;
}

// The grid: `columns` blocks across a row (at most 1024, each 1024 columns at a time), and
// as many groups of rows as keep the blocks at most 1024 (one partial each).
int64_t column_blocks(int64_t D) {
    return std::min<int64_t>((D + 4 * THREADS - 1) / (4 * THREADS), HINGE_LOSS_MAX_PARTIALS);
}

int64_t grid_blocks(int64_t B, int64_t columns) {
    return columns * std::max<int64_t>(1, std::min<int64_t>(B, HINGE_LOSS_MAX_PARTIALS / columns));
}

}  // namespace

cudaError_t hinge_loss_fused_forward(
    const void* predictions,  // (B, D)
    const void* targets,      // (D,)
    float* partials,          // (max(B, 1024) + 4,): each block's sum in the first (at most 1024)
    void* loss,               // (): the sum of the blocks / (B * D)
    void* grad_predictions,   // (B, D): written, dL/dp for grad_loss = 1 (required)
    int64_t B, int64_t D, DType dtype, cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // a teaching rung: float32 only
    if (grad_predictions == nullptr) return cudaErrorInvalidValue;  // fused writes the gradient
    const int64_t columns = column_blocks(D), blocks = grid_blocks(B, columns);
    forward_kernel<<<blocks, THREADS, 0, stream>>>(static_cast<const float*>(predictions),
                                                   static_cast<const float*>(targets), partials,
                                                   static_cast<float*>(grad_predictions), B, D, columns);
    const cudaError_t err = cudaGetLastError();
    return err != cudaSuccess ? err : launch_sum_partials(partials, blocks, float(B) * float(D), loss, stream);
}

cudaError_t hinge_loss_fused_backward(
    const void* predictions,  // (B, D): unread (null), the forward wrote the gradient
    const void* targets,      // (D,): unread (null)
    const void* grad_loss,    // ()
    void* grad_predictions,   // (B, D): the forward's gradient, scaled in place
    int64_t B, int64_t D, DType dtype, cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // a teaching rung: float32 only
    const int64_t blocks = std::min<int64_t>((B * D + THREADS - 1) / THREADS, 1024);  // few to retire at 1
    backward_kernel<<<blocks, THREADS, 0, stream>>>(static_cast<const float*>(grad_loss),
                                                    static_cast<float*>(grad_predictions), B * D);
    return cudaGetLastError();
}
