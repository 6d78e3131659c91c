// The last stage of every cross_entropy forward: one block adds the per-row
// losses in a fixed order (bitwise reproducible: no float atomicAdd) and divides
// by n_valid, counted before the row kernels (count_targets.cu), so ignored
// rows leave both the sum and the denominator; with every row ignored that is
// 0 / 0 = NaN, as in PyTorch.
#include "common/reduce.cuh"
#include "common/vector_load.cuh"
#include "cross_entropy/cross_entropy.cuh"
#include "cross_entropy/launchers.h"

constexpr int MEAN_THREADS = 1024;

__global__ void __launch_bounds__(MEAN_THREADS)
cross_entropy_valid_mean_kernel(const float* __restrict__ row_losses,  // (N,) 0 on ignored rows, 16-byte aligned
                                const int64_t* __restrict__ counts,    // (2,) valid, out of range
                                float* __restrict__ loss,              // ()
                                int64_t N) {
    // float4 loads, 4 in flight per thread: one block reads all N losses, so
    // each round trip to memory should bring as many as it can.
    float sum = 0.0f;
#pragma unroll 4
    for (int64_t i = threadIdx.x; i < N / 4; i += MEAN_THREADS) {
        const float4 v = load_float4(row_losses + 4 * i);
        sum += (v.x + v.y) + (v.z + v.w);  // NaN on an out-of-range row: never a wrong number
    }
    for (int64_t i = N / 4 * 4 + threadIdx.x; i < N; i += MEAN_THREADS) sum += row_losses[i];
    sum = block_reduce_sum(sum);
    if (threadIdx.x == 0) *loss = sum / float(counts[0]);
}

cudaError_t cross_entropy_valid_mean(const float* row_losses, const int64_t* counts, float* loss,
                                     int64_t N, cudaStream_t stream) {
    cross_entropy_valid_mean_kernel<<<1, MEAN_THREADS, 0, stream>>>(row_losses, counts, loss, N);
    return cudaGetLastError();
}
