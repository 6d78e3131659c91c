// The count stage of a forward that needs n_valid before its row kernel (fused
// scales each row's gradient by 1 / n_valid): many blocks, each counting
// COUNT_THREADS * COUNT_UNROLL targets and adding its counts with one integer
// atomicAdd each (exact, so the result never depends on the order). The host
// never waits for either count.
#include "common/reduce.cuh"
#include "common/stream_workspace.cuh"
#include "cross_entropy/launchers.h"
#include "cross_entropy/valid_mean.cuh"

constexpr int COUNT_THREADS = 256;
constexpr int COUNT_UNROLL = 8;  // targets per thread, all loaded before any is counted

__global__ void __launch_bounds__(COUNT_THREADS)
cross_entropy_count_targets_kernel(const int64_t* __restrict__ targets,  // (N,)
                                   int64_t* __restrict__ counts,         // (2,) zero before the launch
                                   int64_t N, int64_t C) {
    int64_t valid = 0, out_of_range = 0;
    const int64_t first = blockIdx.x * int64_t(COUNT_THREADS * COUNT_UNROLL) + threadIdx.x;
#pragma unroll
    for (int u = 0; u < COUNT_UNROLL; ++u) {
        const int64_t i = first + u * COUNT_THREADS;
        if (i < N) count_target(targets[i], C, valid, out_of_range);
    }
    valid = block_reduce_sum(valid);
    out_of_range = block_reduce_sum(out_of_range);
    if (threadIdx.x == 0) {
        if (valid) atomicAdd(reinterpret_cast<unsigned long long*>(counts), static_cast<unsigned long long>(valid));
        if (out_of_range)
            atomicAdd(reinterpret_cast<unsigned long long*>(counts + 1), static_cast<unsigned long long>(out_of_range));
    }
}

cudaError_t cross_entropy_count_targets(const int64_t* targets, int64_t* counts, int64_t N, int64_t C,
                                        cudaStream_t stream, int64_t** counters) {
    const cudaError_t err = stream_workspace(stream, counts, 4 * sizeof(int64_t), reinterpret_cast<void**>(counters));
    if (err != cudaSuccess) return err;
    const int64_t per_block = int64_t(COUNT_THREADS) * COUNT_UNROLL;
    cross_entropy_count_targets_kernel<<<(N + per_block - 1) / per_block, COUNT_THREADS, 0, stream>>>(
        targets, *counters, N, C);
    return cudaGetLastError();
}
