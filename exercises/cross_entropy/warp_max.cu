// Exercise 7 -- the warp's max in every lane, through shuffles (cross_entropy's
// warp_shuffle rung).
//
// shared_memory merged a block's (max, sum) states with a tree in shared
// memory: 8 steps, each behind a __syncthreads(), most threads idle. The 32
// lanes of a warp can instead exchange registers with shuffles, no shared
// memory and no barrier. Here each lane rescales its own sum to its warp's max
// before the warp adds the sums, so unlike a sum, which only lane 0 needs
// (warp_sum below may shift down), the max must reach every lane: a butterfly,
// __shfl_xor_sync(mask, v, offset), returns v from the lane whose index
// differs from this one's in the bits of `offset`; after offsets 16, 8, 4, 2, 1
// every lane holds the result.
//
// Contract of warp_max: called by all 32 lanes of a warp (FULL_WARP), it
// returns the largest `m` of the 32 lanes, in every lane, with no shared
// memory and no barrier. block_logsumexp's other steps are written for you.
//
// Grade it from the shell: python -m losslab grade exercises/cross_entropy/warp_max.cu
// (in Python: losslab.teach.exercises.grade("warp_max")). Done when it is green and its machine code
// shows a butterfly shuffle (SHFL.BFLY).
#include "cross_entropy/cross_entropy.cuh"
#include "cross_entropy/launchers.h"

constexpr int THREADS = 256;

// The largest `m` of the 32 lanes of the calling warp, in every lane.
__device__ __forceinline__ float warp_max(float m) {
    // FILL ME IN (roughly 2 lines): the warp's max in every lane (contract above).
    return m;
}

// The sum of `s` over the warp's lanes, in lane 0 (the other lanes hold partial sums).
__device__ __forceinline__ float warp_sum(float s) {
    for (int offset = 16; offset > 0; offset /= 2) s += __shfl_down_sync(FULL_WARP, s, offset);
    return s;
}

// The block's state in every thread: each warp's (max, sum) in a shared slot, then every thread merges them.
__device__ __forceinline__ LogSumExp block_logsumexp(LogSumExp lse) {
    __shared__ float maxes[THREADS / 32], sums[THREADS / 32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const float m = warp_max(lse.max);                      // every lane: its warp's max
    const float s = warp_sum(lse.sum * expf(lse.max - m));  // each lane's sum rescaled to it, by the lane itself
    if (lane == 0) {
        maxes[warp] = m;
        sums[warp] = s;
    }
    __syncthreads();
    LogSumExp block;
    for (int w = 0; w < THREADS / 32; ++w) block.max = fmaxf(block.max, maxes[w]);
    for (int w = 0; w < THREADS / 32; ++w) block.sum += sums[w] * expf(maxes[w] - block.max);
    return block;
}

__global__ void __launch_bounds__(THREADS)
shuffle_forward_kernel(const float* __restrict__ logits,     // (N, C)
                       const int64_t* __restrict__ targets,  // (N,)
                       float* __restrict__ row_losses,       // (N,)
                       float* __restrict__ row_max,          // (N,)
                       float* __restrict__ row_log_sum,      // (N,)
                       int64_t C) {
    const int64_t row = blockIdx.x;  // one block per row
    const float* x = logits + row * C;
    LogSumExp lse;
    for (int64_t j = threadIdx.x; j < C; j += THREADS) lse_add(lse, x[j]);
    lse = block_logsumexp(lse);
    if (threadIdx.x == 0) store_row(x, targets[row], C, lse, row, row_losses, row_max, row_log_sum);
}

cudaError_t cross_entropy_custom_forward(const void* logits, const int64_t* targets, int64_t* counts,
                                         float* row_losses, float* row_max, float* row_log_sum, void* loss,
                                         void* /*grad_logits: not fused*/, int64_t N, int64_t C, DType dtype,
                                         cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // float32 only
    shuffle_forward_kernel<<<N, THREADS, 0, stream>>>(static_cast<const float*>(logits), targets, row_losses,
                                                      row_max, row_log_sum, C);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    return cross_entropy_valid_mean(targets, row_losses, counts, loss, N, C, stream);
}
