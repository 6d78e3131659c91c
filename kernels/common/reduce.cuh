// Warp- and block-level reductions shared by every rung: one template each,
// instantiated for float sums and maxima and for int64 counts.
// All of them combine values in a fixed order, so a reduction is bitwise
// reproducible from run to run (no atomics).
#pragma once
#include <cstdint>
#include <cuda_runtime.h>
#include <math.h>

constexpr unsigned FULL_WARP = 0xffffffffu;

// The combining operations and their identities (the value an empty slot holds).
struct Sum {
    template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
    template <typename T> static __device__ __forceinline__ T identity() { return T(0); }
};

// fmaxf drops NaN, so a caller that must propagate NaN gets it from the values
// it then combines with the max.
struct Max {
    __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
    template <typename T> static __device__ __forceinline__ T identity() { return -INFINITY; }
};

// Butterfly reduction across the 32 lanes of a warp: after it, every lane
// holds the warp's result (5 shuffle steps, no shared memory, no barrier).
template <typename T, typename Op>
__device__ __forceinline__ T warp_reduce(T value, Op op) {
    for (int offset = 16; offset > 0; offset >>= 1)
        value = op(value, __shfl_xor_sync(FULL_WARP, value, offset));
    return value;
}

// Over the whole block: shuffles inside each warp, one shared slot per warp,
// then every warp reduces the slots. Every thread gets the result. Each
// instantiation has its own slots. Requires blockDim.x to be a multiple of 32
// (at most 1024).
template <typename T, typename Op>
__device__ __forceinline__ T block_reduce(T value, Op op) {
    __shared__ T slots[32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    value = warp_reduce(value, op);
    __syncthreads();  // the slots may still be read by a previous call
    if (lane == 0) slots[warp] = value;
    __syncthreads();
    value = lane < blockDim.x / 32 ? slots[lane] : Op::template identity<T>();
    return warp_reduce(value, op);
}

// The names the rungs use. The int64 sums count rows: exact at any size, where
// a float count stops being exact past 2^24.
__device__ __forceinline__ float warp_reduce_sum(float value) { return warp_reduce(value, Sum{}); }
__device__ __forceinline__ float warp_reduce_max(float value) { return warp_reduce(value, Max{}); }
__device__ __forceinline__ float block_reduce_sum(float value) { return block_reduce(value, Sum{}); }
__device__ __forceinline__ float block_reduce_max(float value) { return block_reduce(value, Max{}); }
__device__ __forceinline__ int64_t block_reduce_sum(int64_t value) { return block_reduce(value, Sum{}); }
