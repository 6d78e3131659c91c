// cluster: fused re-reads each row for its gradient, from L1/L2 while rows are short,
// but a row too long to stay cached (1 MiB at C = 262144) comes from DRAM twice. Here
// a thread-block cluster of CLUSTER CTAs (sm_90) shares a row: each CTA copies its
// slice into shared memory once, the CTAs combine their (max, sum) through distributed
// shared memory (cluster.map_shared_rank between two cluster.sync()), and each writes
// its slice's gradient from shared memory: one DRAM read of the row, at any length.
// Where clusters are unavailable (before sm_90) or a slice outgrows a CTA's shared
// memory (rows over about 1.8 MB), the launcher runs fused's instead.
// not faster: forward, forward_backward (at the seed, 2 KiB a CTA, the cluster's
//   barriers cost more than they save; it is for long rows, e.g. 2048 x 262144)
// diff bound: 60 lines (the cluster's launch, the slice in shared memory, the exchange)
#include <cooperative_groups.h>
#include "common/row_split.cuh"
#include "common/scale.cuh"
#include "cross_entropy/cross_entropy.cuh"
#include "cross_entropy/ladder/ladder.h"

namespace {

constexpr int THREADS = 512;  // long rows leave one CTA an SM: more threads, more loads in flight
constexpr int CLUSTER = 8;  // CTAs per row (the largest portable cluster)

// Two running log-sum-exps as one: the larger max, each sum rescaled to it.
__device__ __forceinline__ LogSumExp lse_merge(LogSumExp a, LogSumExp b) {
    const float m = fmaxf(a.max, b.max);
    return {m, a.sum * expf(a.max - m) + b.sum * expf(b.max - m)};
}

// The block's (max, sum), every thread getting it: five butterfly exchanges
// combine a warp's 32 lanes (every lane ends with the warp's), then each warp's
// lane 0 writes one shared slot, and after one barrier every thread adds the slots.
__device__ __forceinline__ LogSumExp block_logsumexp(LogSumExp lse) {
    __shared__ float warp_max[THREADS / 32], warp_sum[THREADS / 32];
    for (int lanes = 16; lanes > 0; lanes /= 2)  // the partner: this lane's index xor 16, 8, 4, 2, 1
        lse = lse_merge(lse, {__shfl_xor_sync(FULL_WARP, lse.max, lanes), __shfl_xor_sync(FULL_WARP, lse.sum, lanes)});
    if (threadIdx.x % 32 == 0) {
        warp_max[threadIdx.x / 32] = lse.max;
        warp_sum[threadIdx.x / 32] = lse.sum;
    }
    __syncthreads();
    LogSumExp block;
    for (int w = 0; w < THREADS / 32; ++w) block = lse_merge(block, {warp_max[w], warp_sum[w]});
    return block;
}

// Four logits at once: the running max raised once for all four, then four exps.
__device__ __forceinline__ void lse_add4(LogSumExp& lse, float4 v) {
    lse_raise_max(lse, fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w)));
    lse.sum += (expf(v.x - lse.max) + expf(v.y - lse.max)) + (expf(v.z - lse.max) + expf(v.w - lse.max));
}

// --- forward: n_valid; then each row's loss, max, log-sum and gradient; then cross_entropy_valid_mean ---

__global__ void __launch_bounds__(1024)  // one block of 1024 threads: N targets, 64 KiB of loads in flight
count_kernel(const int64_t* __restrict__ targets,  // (N,)
             int64_t* __restrict__ counts,         // (4,) written: counts[0] = n_valid
             int64_t N, int64_t C) {
    int64_t valid = 0;
#pragma unroll 8
    for (int64_t i = threadIdx.x; i < N; i += 1024) valid += target_in_range(targets[i], C);
    valid = block_reduce_sum(valid);  // common/reduce.cuh
    if (threadIdx.x == 0) counts[0] = valid;
}

__global__ void __launch_bounds__(THREADS)
forward_kernel(const float* __restrict__ logits,     // (N, C)
               const int64_t* __restrict__ targets,  // (N,) class indices, ignore_index = -100
               const int64_t* __restrict__ counts,   // (4,) from count_kernel: n_valid first
               float* __restrict__ row_losses,       // (N,) written: each row's loss
               float* __restrict__ row_max,          // (N,) written: each row's max logit
               float* __restrict__ row_log_sum,      // (N,) written: log sum_j exp(x_j - max)
               float* __restrict__ grad_logits,      // (N, C) written: dL/dx for grad_loss = 1
               int64_t N, int64_t C, int slice_packs) {
#if __CUDA_ARCH__ >= 900  // clusters: sm_90 and newer (elsewhere the launcher runs fused's)
    extern __shared__ float4 slice[];  // (slice_packs,) this CTA's part of the row
    __shared__ LogSumExp part;         // this CTA's (max, sum), read by every CTA of the cluster
    const auto cluster = cooperative_groups::this_cluster();
    const int rank = int(cluster.block_rank());  // 0 to CLUSTER - 1: which slice
    const int64_t row = blockIdx.x / CLUSTER;    // one cluster per row
    const int64_t target = targets[row];
    const float scale = row_grad_scale(target, C, 1.0f / float(counts[0]));
    const float* x = logits + row * C;
    float* g = grad_logits + row * C;
    const RowSplit s = split_row(C, x, g);  // no packs unless x and g are equally aligned
    const int64_t first = int64_t(rank) * slice_packs;  // this CTA's packs: [first, first + count)
    const int count = int(max(int64_t(0), min(int64_t(slice_packs), s.packs - first)));
    const float4* xv = reinterpret_cast<const float4*>(x + s.head) + first;
    float4* gv = reinterpret_cast<float4*>(g + s.head) + first;
    // Each thread reads back only the packs it copied: no barrier between the loops.
#pragma unroll 8
    for (int64_t k = threadIdx.x; k < count; k += THREADS) slice[k] = xv[k];  // the row's one read from DRAM
    LogSumExp lse;
    for (int64_t k = threadIdx.x; k < count; k += THREADS) lse_add4(lse, slice[k]);
    if (rank == 0) for (int64_t j = threadIdx.x; j < s.head; j += THREADS) lse_add(lse, x[j]);
    if (rank == 0) for (int64_t j = s.head + 4 * s.packs + threadIdx.x; j < C; j += THREADS) lse_add(lse, x[j]);
    lse = block_logsumexp(lse);
    if (threadIdx.x == 0) part = lse;
    cluster.sync();  // every CTA has written its part (and every CTA of the cluster is running)
    lse = LogSumExp();  // the row's: CTA r's part read from its shared memory, in rank order in every CTA
    for (int r = 0; r < CLUSTER; ++r) lse = lse_merge(lse, *cluster.map_shared_rank(&part, r));
    cluster.sync();  // every CTA has read the parts: none exits while another still reads its part
    if (rank == 0 && threadIdx.x == 0) store_row(x, target, C, lse, row, row_losses, row_max, row_log_sum);

    // The gradient, from the slice in shared memory.
    const float m = lse.max, log_sum = logf(lse.sum);
    auto grad = [&](float v, int64_t j) { return cross_entropy_grad(v, j, target, m, log_sum, scale); };
#pragma unroll 4
    for (int64_t k = threadIdx.x; k < count; k += THREADS) {
        const float4 v = slice[k];
        const int64_t j = s.head + 4 * (first + k);
        gv[k] = make_float4(grad(v.x, j), grad(v.y, j + 1), grad(v.z, j + 2), grad(v.w, j + 3));
    }
    if (rank == 0) for (int64_t j = threadIdx.x; j < s.head; j += THREADS) g[j] = grad(x[j], j);
    if (rank == 0) for (int64_t j = s.head + 4 * s.packs + threadIdx.x; j < C; j += THREADS) g[j] = grad(x[j], j);
#endif
}

}  // namespace

// --- the launchers (launchers.h) ---

cudaError_t cross_entropy_cluster_forward(
    const void* logits, const int64_t* targets, int64_t* counts, float* row_losses, float* row_max,
    float* row_log_sum, void* loss, void* grad_logits, int64_t N, int64_t C, DType dtype, cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // float32 only
    if (grad_logits == nullptr) return cudaErrorInvalidValue;   // training only
    const int slice_packs = int((C / 4 + CLUSTER - 1) / CLUSTER), bytes = int(sizeof(float4)) * slice_packs;
    int device = 0, clusters = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&clusters, cudaDevAttrClusterLaunch, device);  // 1 from sm_90
    if (!clusters || cudaFuncSetAttribute(forward_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes)) {
        cudaGetLastError();  // clear the refusal (too much shared memory): fused reports its own
        return cross_entropy_fused_forward(logits, targets, counts, row_losses, row_max, row_log_sum, loss,
                                           grad_logits, N, C, dtype, stream);
    }
    count_kernel<<<1, 1024, 0, stream>>>(targets, counts, N, C);
    cudaLaunchAttribute cluster_dims = {cudaLaunchAttributeClusterDimension};  // CTAs CLUSTER * row + rank
    cluster_dims.val.clusterDim = {CLUSTER, 1, 1};
    const cudaLaunchConfig_t config = {dim3(N * CLUSTER), dim3(THREADS), size_t(bytes), stream, &cluster_dims, 1};
    cudaLaunchKernelEx(&config, forward_kernel, static_cast<const float*>(logits), targets, counts, row_losses,
                       row_max, row_log_sum, static_cast<float*>(grad_logits), N, C, slice_packs);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    return cross_entropy_valid_mean(targets, row_losses, counts, loss, N, C, stream);  // counts, then the mean
}

cudaError_t cross_entropy_cluster_backward(
    const void* logits, const int64_t* targets, const float* row_max, const float* row_log_sum,
    const int64_t* counts, const void* grad_loss, void* grad_logits, int64_t N, int64_t C, DType dtype,
    cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // float32 only
    return scale_in_place(grad_logits, grad_loss, N * C, dtype, stream);  // common/scale.cu: the forward's, in place
}
