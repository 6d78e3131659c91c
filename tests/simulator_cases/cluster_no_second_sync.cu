// A wrong answer to the cluster exercise, test data for tests/test_exercises.py (graded on a GPU):
// a CTA may exit while the other still reads its shared memory.
#include <cooperative_groups.h>
#include "cross_entropy/cross_entropy.cuh"
#include "cross_entropy/launchers.h"

constexpr int THREADS = 256, CLUSTER = 2;  // CTAs a row

// The state of the union of two parts: the larger max, each sum rescaled to it.
__device__ __forceinline__ LogSumExp lse_merge(LogSumExp a, LogSumExp b) {
    const float m = fmaxf(a.max, b.max);
    return {m, a.sum * expf(a.max - m) + b.sum * expf(b.max - m)};
}

__global__ void __launch_bounds__(THREADS)
cluster_forward_kernel(const float* __restrict__ logits,     // (N, C)
                       const int64_t* __restrict__ targets,  // (N,)
                       float* __restrict__ row_losses,       // (N,)
                       float* __restrict__ row_max,          // (N,)
                       float* __restrict__ row_log_sum,      // (N,)
                       int64_t C) {
#if __CUDA_ARCH__ >= 900  // clusters: sm_90 and newer
    __shared__ float2 part;  // this CTA's (max, sum), read by the other CTA of the cluster
    const auto cluster = cooperative_groups::this_cluster();
    const int rank = int(cluster.block_rank());  // which half of the row
    const int64_t row = blockIdx.x / CLUSTER, half = (C + 1) / 2;
    const float* x = logits + row * C;
    LogSumExp lse;
    for (int64_t j = rank * half + threadIdx.x; j < min(C, (rank + 1) * half); j += THREADS) lse_add(lse, x[j]);
    lse = block_reduce_logsumexp(lse);  // this CTA's half, in every thread
    if (threadIdx.x == 0) part = make_float2(lse.max, lse.sum);
    cluster.sync();  // both parts written before either is read
    const float2 other = *cluster.map_shared_rank(&part, rank ^ 1);  // the other CTA's, through DSMEM
    lse = lse_merge(lse, {other.x, other.y});
    if (rank == 0 && threadIdx.x == 0) store_row(x, targets[row], C, lse, row, row_losses, row_max, row_log_sum);
#endif
}

cudaError_t cross_entropy_custom_forward(const void* logits, const int64_t* targets, int64_t* counts,
                                         float* row_losses, float* row_max, float* row_log_sum, void* loss,
                                         void* /*grad_logits: not fused*/, int64_t N, int64_t C, DType dtype,
                                         cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // float32 only
    cudaLaunchAttribute cluster_dims = {cudaLaunchAttributeClusterDimension};  // CTAs CLUSTER * row + rank
    cluster_dims.val.clusterDim = {unsigned(CLUSTER), 1, 1};
    const cudaLaunchConfig_t config = {dim3(N * CLUSTER), dim3(THREADS), 0, stream, &cluster_dims, 1};
    cudaLaunchKernelEx(&config, cluster_forward_kernel, static_cast<const float*>(logits), targets, row_losses,
                       row_max, row_log_sum, C);  // before sm_90: an error, which the grade shows
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    return cross_entropy_valid_mean(targets, row_losses, counts, loss, N, C, stream);
}
