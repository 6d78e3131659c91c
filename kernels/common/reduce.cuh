// Block- and warp-level reductions shared by every rung.
// All of them combine values in a fixed order, so a reduction is bitwise
// reproducible from run to run (no atomics).
#pragma once
#include <cstdint>
#include <cuda_runtime.h>
#include <math.h>

constexpr unsigned FULL_WARP = 0xffffffffu;

// Butterfly reduction across the 32 lanes of a warp: after it, every lane
// holds the warp's sum (5 shuffle steps, no shared memory, no barrier).
__device__ __forceinline__ float warp_reduce_sum(float value) {
    for (int offset = 16; offset > 0; offset >>= 1)
        value += __shfl_xor_sync(FULL_WARP, value, offset);
    return value;
}

__device__ __forceinline__ float warp_reduce_max(float value) {
    for (int offset = 16; offset > 0; offset >>= 1)
        value = fmaxf(value, __shfl_xor_sync(FULL_WARP, value, offset));
    return value;
}

// Sum over the whole block: shuffles inside each warp, one shared slot per
// warp, then the first warp reduces the slots. Every thread gets the result.
// Requires blockDim.x to be a multiple of 32 (at most 1024).
__device__ __forceinline__ float block_reduce_sum(float value) {
    __shared__ float warp_sums[32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    value = warp_reduce_sum(value);
    __syncthreads();  // warp_sums may still be read by a previous call
    if (lane == 0) warp_sums[warp] = value;
    __syncthreads();
    value = lane < blockDim.x / 32 ? warp_sums[lane] : 0.0f;
    return warp_reduce_sum(value);
}

// Same as block_reduce_sum with max. fmaxf drops NaN, so a caller that must
// propagate NaN gets it from the values it then combines with the max.
__device__ __forceinline__ float block_reduce_max(float value) {
    __shared__ float warp_maxes[32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    value = warp_reduce_max(value);
    __syncthreads();
    if (lane == 0) warp_maxes[warp] = value;
    __syncthreads();
    value = lane < blockDim.x / 32 ? warp_maxes[lane] : -INFINITY;
    return warp_reduce_max(value);
}

// Integer sums, for counting rows: exact at any size, where a float count
// stops being exact past 2^24.
__device__ __forceinline__ int64_t warp_reduce_sum(int64_t value) {
    for (int offset = 16; offset > 0; offset >>= 1)
        value += __shfl_xor_sync(FULL_WARP, value, offset);
    return value;
}

__device__ __forceinline__ int64_t block_reduce_sum(int64_t value) {
    __shared__ int64_t warp_counts[32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    value = warp_reduce_sum(value);
    __syncthreads();
    if (lane == 0) warp_counts[warp] = value;
    __syncthreads();
    value = lane < blockDim.x / 32 ? warp_counts[lane] : 0;
    return warp_reduce_sum(value);
}
