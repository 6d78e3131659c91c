// cluster: fused re-reads each row for its gradient, from L1/L2 while rows are short,
// but a row too long to stay cached (1 MiB at C = 262144) comes from DRAM twice. Here
// a thread-block cluster of K CTAs (sm_90) shares a row: each CTA copies its slice into
// shared memory once, the CTAs swap their (max, sum) through distributed shared memory,
// and each writes its slice's gradient from shared memory: one DRAM read of the row.
// K = the row's bytes / 64 KiB, rounded up, from 2 to 16 (over 8 a non-portable size):
// three 64 KiB slices an SM, one CTA's loads overlapping another's stores. The swap is
// st.async into every CTA's shared memory, counted on the receiver's mbarrier: no
// cluster.sync(), whose release is a MEMBAR.ALL.GPU (a wait on the whole GPU's memory).
// fused's launcher takes rows up to 32 KiB (its second read hits L2: 8 blocks an SM hold
// 33 MiB), rows off a 16-byte boundary, and where no such cluster fits (before sm_90).
// not faster: forward, forward_backward (at the seed, 16 KiB rows, it is fused's launcher)
// faster at: 2048 x 262144, 4096 x 131072 in forward, forward_backward (fused reads each
//   row twice, the second time from DRAM; here once)
// diff bound: 80 lines (the cluster's launch and fallback, the slice in shared memory, the swap)
#include <cooperative_groups.h>
#include <cuda/ptx>
#include "common/scale.cuh"
#include "cross_entropy/cross_entropy.cuh"
#include "cross_entropy/ladder/ladder.h"

namespace {

namespace ptx = cuda::ptx;
constexpr int THREADS = 256;
constexpr int MAX_CLUSTER = 16;                 // sm_90's largest cluster (8: the portable one)
constexpr int64_t SLICE_BYTES = 64 * 1024;      // a CTA's share of a row, at most while K < 16
constexpr int64_t FUSED_ROW_BYTES = 32 * 1024;  // rows up to this: fused's launcher

// The block's (max, sum), every thread getting it, in two rounds of five butterfly
// exchanges (a warp's 32 lanes combined in registers, every lane getting the warp's)
// and one shared slot per warp, a barrier, every thread adding the slots: the block's
// max first, then each thread's sum rescaled to it (one expf a thread) and summed.
__device__ __forceinline__ LogSumExp block_logsumexp(LogSumExp lse) {
    __shared__ float warp_max[THREADS / 32], warp_sum[THREADS / 32];
    float m = lse.max;
    for (int lanes = 16; lanes > 0; lanes /= 2)  // the partner: this lane's index xor 16, 8, 4, 2, 1
        m = fmaxf(m, __shfl_xor_sync(FULL_WARP, m, lanes));
    if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = m;
    __syncthreads();
    LogSumExp block;
    for (int w = 0; w < THREADS / 32; ++w) block.max = fmaxf(block.max, warp_max[w]);
    float s = lse.sum * expf(lse.max - block.max);  // NaN stays NaN: it never raised a max
    for (int lanes = 16; lanes > 0; lanes /= 2) s += __shfl_xor_sync(FULL_WARP, s, lanes);
    if (threadIdx.x % 32 == 0) warp_sum[threadIdx.x / 32] = s;
    __syncthreads();
    for (int w = 0; w < THREADS / 32; ++w) block.sum += warp_sum[w];
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
    extern __shared__ float4 slice[];      // (slice_packs,) this CTA's part of the row
    __shared__ float2 parts[MAX_CLUSTER];  // (max, sum) of each CTA of the cluster, by rank, sent by it
    __shared__ uint64_t landed;            // an mbarrier: its phase completes when the K parts have landed
    const auto cluster = cooperative_groups::this_cluster();
    const int rank = int(cluster.block_rank()), K = int(cluster.num_blocks());  // which slice, of K
    if (threadIdx.x == 0) {  // expect K parts of 8 bytes; the barrier made visible to the cluster
        ptx::mbarrier_init(&landed, 1);
        ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, &landed, 8 * K);
        ptx::fence_mbarrier_init(ptx::sem_release, ptx::scope_cluster);
    }
    ptx::barrier_cluster_arrive(ptx::sem_relaxed);  // this CTA runs, its barrier set (relaxed: no memory fence)
    const int64_t row = blockIdx.x / K, target = targets[row];  // one cluster per row
    const float scale = row_grad_scale(target, C, 1.0f / float(counts[0]));
    const float* x = logits + row * C;
    const int64_t first = int64_t(rank) * slice_packs;  // this CTA's packs: [first, first + count)
    const int count = int(max(int64_t(0), min(int64_t(slice_packs), C / 4 - first)));
    const float4* xv = reinterpret_cast<const float4*>(x) + first;  // rows 16-byte aligned (the launcher)
    float4* gv = reinterpret_cast<float4*>(grad_logits + row * C) + first;
    // Each thread reads back only the packs it copied: no barrier between the loops.
#pragma unroll 8
    for (int k = threadIdx.x; k < count; k += THREADS) slice[k] = xv[k];  // the row's one read from DRAM
    LogSumExp lse;
    for (int k = threadIdx.x; k < count; k += THREADS) lse_add4(lse, slice[k]);
    lse = block_logsumexp(lse);
    ptx::barrier_cluster_wait();  // every CTA of the cluster runs, its barrier set: it may be sent to
    if (threadIdx.x < K) ptx::st_async(cluster.map_shared_rank(&parts[rank], threadIdx.x), float2{lse.max, lse.sum},
                                       cluster.map_shared_rank(&landed, threadIdx.x));  // to CTA threadIdx.x, slot rank
    while (!ptx::mbarrier_try_wait_parity(ptx::sem_acquire, ptx::scope_cluster, &landed, 0)) {}  // the K parts
    lse = LogSumExp();  // the row's: the K parts in rank order, the same bits in every CTA
    for (int r = 0; r < K; ++r) lse.max = fmaxf(lse.max, parts[r].x);
    for (int r = 0; r < K; ++r) lse.sum += parts[r].y * expf(parts[r].x - lse.max);
    if (rank == 0 && threadIdx.x == 0) store_row(x, target, C, lse, row, row_losses, row_max, row_log_sum);

    // The gradient, from the slice in shared memory.
    const float m = lse.max, log_sum = logf(lse.sum);
    auto grad = [&](float v, int64_t j) { return cross_entropy_grad(v, j, target, m, log_sum, scale); };
    for (int k = threadIdx.x; k < count; k += THREADS) {
        const float4 v = slice[k];
        const int64_t j = 4 * (first + k);
        gv[k] = make_float4(grad(v.x, j), grad(v.y, j + 1), grad(v.z, j + 2), grad(v.w, j + 3));
    }
#endif
}

}  // namespace

// --- the launchers (launchers.h) ---

cudaError_t cross_entropy_cluster_forward(
    const void* logits, const int64_t* targets, int64_t* counts, float* row_losses, float* row_max,
    float* row_log_sum, void* loss, void* grad_logits, int64_t N, int64_t C, DType dtype, cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // float32 only
    if (grad_logits == nullptr) return cudaErrorInvalidValue;   // training only
    const int64_t row_bytes = C * int64_t(sizeof(float)), slices = (row_bytes + SLICE_BYTES - 1) / SLICE_BYTES;
    const int K = int(slices < 2 ? 2 : slices < MAX_CLUSTER ? slices : MAX_CLUSTER);  // CTAs a row (st.async: 2+)
    const int slice_packs = int((C / 4 + K - 1) / K), bytes = int(sizeof(float4)) * slice_packs;
    cudaLaunchAttribute cluster_dims = {cudaLaunchAttributeClusterDimension};  // CTAs K * row + rank
    cluster_dims.val.clusterDim = {unsigned(K), 1, 1};
    const cudaLaunchConfig_t config = {dim3(N * K), dim3(THREADS), size_t(bytes), stream, &cluster_dims, 1};
    int clusters = 0;  // how many such clusters the device runs at once: 0 before sm_90, or for too large a slice
    const bool aligned = (reinterpret_cast<uintptr_t>(logits) | reinterpret_cast<uintptr_t>(grad_logits)) % 16 == 0;
    if (row_bytes > FUSED_ROW_BYTES && aligned && C % 4 == 0 &&  // 16-byte packs only: no scalar head or tail
        !cudaFuncSetAttribute(forward_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) &&
        !cudaFuncSetAttribute(forward_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1))  // K over 8
        cudaOccupancyMaxActiveClusters(&clusters, forward_kernel, &config);
    if (clusters == 0) {
        cudaGetLastError();  // clear a refusal (no clusters, too much shared memory): fused reports its own
        return cross_entropy_fused_forward(logits, targets, counts, row_losses, row_max, row_log_sum, loss,
                                           grad_logits, N, C, dtype, stream);
    }
    count_kernel<<<1, 1024, 0, stream>>>(targets, counts, N, C);
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
