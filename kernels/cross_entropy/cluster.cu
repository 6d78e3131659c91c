// cluster: a row too long for one SM is split over a thread-block cluster (sm_90).
// Each CTA bulk-copies (TMA) its slice of the row into its shared memory, the CTAs
// combine their slices' (max, sum) through distributed shared memory, and each writes
// its slice's gradient from shared memory. fused holds 16 KiB of a row on chip and
// re-reads the rest for the gradient (from DRAM at 131072 classes): here a row is read once.
//
// Where the cluster does not apply, the launcher runs fused's kernels; the rule is
// cross_entropy_cluster_plan's (bound to Python as cluster_plan, which says why):
//   - the device is not sm_90 or newer (no clusters);
//   - the gradient is not at the logits' offset from a 16-byte boundary (no pack copies);
//   - a row is at most 16 KiB: fused keeps it in registers and reads it once already;
//   - a row is more than max_cluster x MAX_SLICE_BYTES (2 MiB with clusters of 8);
//   - the device cannot schedule such a cluster (cudaOccupancyMaxActiveClusters is 0).
#include <cooperative_groups.h>
#include <algorithm>
#include <climits>
#include <mutex>
#include "common/dispatch.cuh"
#include "common/scale.cuh"
#include "cross_entropy/cluster.h"
#include "cross_entropy/cross_entropy.cuh"
#include "cross_entropy/launchers.h"
#include "cross_entropy/row_packs.cuh"
#include "cross_entropy/valid_mean.cuh"

namespace cg = cooperative_groups;

// This file's names, in a namespace: an exported solution links fused.cu (with its own
// THREADS) into the same translation unit.
namespace cluster_rung {

// Launch knobs (losslab/build/knobs.py): -DLOSSLAB_CROSS_ENTROPY_CLUSTER_<KNOB>=<value> builds another one.
#ifndef LOSSLAB_CROSS_ENTROPY_CLUSTER_THREADS
#define LOSSLAB_CROSS_ENTROPY_CLUSTER_THREADS 256  // threads per CTA, one slice each: 128 256 512 1024
#endif
constexpr int THREADS = LOSSLAB_CROSS_ENTROPY_CLUSTER_THREADS;
static_assert(THREADS >= 32 && THREADS <= 1024 && THREADS % 32 == 0,
              "LOSSLAB_CROSS_ENTROPY_CLUSTER_THREADS: a multiple of 32 from 32 to 1024 (whole warps)");
constexpr int SLICE_COPIES = 4;          // bulk copies per slice, one barrier each: pass 1 starts on the first
constexpr int MAX_CLUSTER = 16;          // the hardware's largest (non-portable) cluster
constexpr int PORTABLE_CLUSTER = 8;
constexpr int64_t FUSED_ROW_BYTES = 16384;       // fused's register tile (its THREADS * TILE packs)
constexpr int64_t MAX_SLICE_BYTES = 200 * 1024;  // of the 227 KiB a CTA may have on sm_90

// Tuning (cross_entropy_cluster_tune): the largest cluster tried, and the slice a CTA aims
// for: 64 KiB leaves room for 3 CTAs per SM, so one CTA's loads overlap another's stores.
constexpr int64_t DEFAULT_SLICE_BYTES = 64 * 1024;
static int max_cluster_size = PORTABLE_CLUSTER;
static int64_t target_slice_bytes = DEFAULT_SLICE_BYTES;

// --- the bulk copy engine (TMA) and its barriers, in PTX -----------------------------------------

__device__ __forceinline__ uint32_t shared_address(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void barrier_init(uint64_t* bar) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(shared_address(bar)));
}

// Arm `bar` for `bytes` and copy them from global to this CTA's shared memory; the
// barrier's phase completes when they have landed.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(bar)), "r"(bytes)
                 : "memory");
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
            shared_address(dst)),
        "l"(src), "r"(bytes), "r"(shared_address(bar))
        : "memory");
}

// A 16-byte store, spelled out: given store_pack, nvcc split this kernel's into four
// 4-byte stores (it lost the alignment of a row with a scalar head).
__device__ __forceinline__ void store_16(void* dst, uint4 v) {
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(dst), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
}

__device__ __forceinline__ void barrier_wait(uint64_t* bar) {  // the first phase (parity 0)
    asm volatile(
        "{\n .reg .pred done;\n WAIT:\n mbarrier.try_wait.parity.shared::cta.b64 done, [%0], 0;\n"
        " @!done bra WAIT;\n}" ::"r"(shared_address(bar))
        : "memory");
}

// The first half of a cluster barrier, without ordering memory (cooperative_groups'
// barrier_arrive releases, a MEMBAR.ALL.GPU): it only says this CTA runs.
__device__ __forceinline__ void cluster_arrive_relaxed() {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}

// Store v into CTA `rank`'s copy of this CTA's shared variable `slot` (distributed shared memory).
__device__ __forceinline__ void store_to_rank(float2* slot, unsigned rank, float2 v) {
    uint32_t remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(shared_address(slot)), "r"(rank));
    asm volatile("st.shared::cluster.v2.f32 [%0], {%1, %2};" ::"r"(remote), "f"(v.x), "f"(v.y) : "memory");
}

// --- the kernel --------------------------------------------------------------------------------

// The packs [begin, end) of this CTA's slice in shared memory, copy c of SLICE_COPIES.
struct SliceCopy {
    int begin, end;
};
__device__ __forceinline__ SliceCopy slice_copy(int c, int count) {
    const int per = (count + SLICE_COPIES - 1) / SLICE_COPIES;
    return {min(c * per, count), min((c + 1) * per, count)};
}

// One cluster of K CTAs per row (grid N * K, cluster K): CTA `rank` holds packs
// [rank * slice_packs, ...) of the row's aligned middle, rank 0 the scalar head and
// rank K - 1 the scalar tail (read from global memory in both passes).
template <typename T>
__global__ void __launch_bounds__(THREADS)
cross_entropy_cluster_forward_kernel(const T* __restrict__ logits,         // (N, C)
                                     const int64_t* __restrict__ targets,  // (N,)
                                     int64_t* counters,                    // (4,) from the count stage
                                     int64_t* counts,                      // (4,) written: n_valid, out of range
                                     float* __restrict__ row_losses,       // (N,)
                                     T* __restrict__ loss,                 // ()
                                     T* __restrict__ grad_logits,          // (N, C), for grad_loss = 1
                                     int64_t C, int slice_packs) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    constexpr int V = Pack<T>::size;
    constexpr int WARPS = THREADS / 32;
    constexpr int UNROLL = 4;  // packs per thread per round of pass 1
    extern __shared__ __align__(16) uint4 slice[];  // this CTA's packs
    __shared__ uint64_t landed[SLICE_COPIES];
    __shared__ float2 warp_lse[WARPS];
    __shared__ float2 cta_lse[MAX_CLUSTER];  // written by every CTA of the cluster
    const cg::cluster_group cluster = cg::this_cluster();
    const int K = int(cluster.num_blocks()), rank = int(cluster.block_rank());
    const int64_t row = blockIdx.x / K;
    const T* x = logits + row * C;
    T* g = grad_logits + row * C;
    const RowSplit split = split_row(C, x, g);
    const T* xv = x + split.head;
    T* gv = g + split.head;
    const int64_t first = int64_t(rank) * slice_packs;
    const int count = int(max(int64_t(0), min(int64_t(slice_packs), split.packs - first)));  // packs in its slice

    if (threadIdx.x == 0) {
        for (int c = 0; c < SLICE_COPIES; ++c) barrier_init(&landed[c]);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");  // visible to the copy engine
        for (int c = 0; c < SLICE_COPIES; ++c) {
            const SliceCopy p = slice_copy(c, count);
            if (p.end > p.begin)
                bulk_copy(slice + p.begin, xv + V * (first + p.begin), 16u * (p.end - p.begin), &landed[c]);
        }
    }
    // Arrive now, wait before writing into another CTA: by then every CTA of the
    // cluster is running (its shared memory exists), and the wait costs nothing.
    cluster_arrive_relaxed();
    __syncthreads();  // the barriers are initialised before anyone waits on them
    const int64_t target = targets[row];  // read while the copies are in flight
    const float scale = row_grad_scale(target, C, 1.0f / float(counters[0]));
    const int64_t tail = split.head + V * split.packs;

    // Pass 1: the slice's (max, sum), copy by copy as each lands; the scalar ends from global.
    LogSumExp lse;
    if (rank == 0)
        for (int64_t j = threadIdx.x; j < split.head; j += THREADS) lse_add(lse, to_float(x[j]));
    if (rank == K - 1)
        for (int64_t j = tail + threadIdx.x; j < C; j += THREADS) lse_add(lse, to_float(x[j]));
    for (int c = 0; c < SLICE_COPIES; ++c) {
        const SliceCopy p = slice_copy(c, count);
        if (p.end == p.begin) continue;
        barrier_wait(&landed[c]);
        for (int k0 = p.begin + threadIdx.x; k0 < p.end; k0 += THREADS * UNROLL) {
            const int packs = min(UNROLL, (p.end - k0 + THREADS - 1) / THREADS);  // >= 1
            Pack<T> v[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u)
                if (u < packs) v[u].raw = slice[k0 + u * THREADS];
            lse_add_packs(lse, v, packs);
        }
    }

    // The CTA's (max, sum): shuffles, one slot per warp; every thread combines the slots.
    lse = warp_reduce_logsumexp(lse);
    if (threadIdx.x % 32 == 0) warp_lse[threadIdx.x / 32] = make_float2(lse.max, lse.sum);
    __syncthreads();
    LogSumExp part;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) part.max = fmaxf(part.max, warp_lse[w].x);
#pragma unroll
    for (int w = 0; w < WARPS; ++w) part.sum += warp_lse[w].y * expf(warp_lse[w].x - part.max);

    // The row's: thread r puts this CTA's part into CTA r's slot `rank` (distributed
    // shared memory); after the cluster barrier every CTA combines the K parts in rank
    // order (the same numbers in every CTA, bitwise), and none touches another's memory again.
    cluster.barrier_wait();
    if (threadIdx.x < K) store_to_rank(&cta_lse[rank], threadIdx.x, make_float2(part.max, part.sum));
    cluster.sync();
    LogSumExp row_lse;
    for (int r = 0; r < K; ++r) row_lse.max = fmaxf(row_lse.max, cta_lse[r].x);
    for (int r = 0; r < K; ++r) row_lse.sum += cta_lse[r].y * expf(cta_lse[r].x - row_lse.max);
    const float log_sum = logf(row_lse.sum);
    const float partial = rank == 0 && threadIdx.x == 0 ? row_loss(x, target, C, row_lse.max, log_sum) : 0.0f;

    // Pass 2: the gradient from shared memory, 16-byte stores.
    const GradRow r = grad_row(row_lse.max, log_sum, scale);
#pragma unroll 4
    for (int k = threadIdx.x; k < count; k += THREADS) {
        Pack<T> v;
        v.raw = slice[k];
        const int64_t pack = first + k;
        store_16(gv + V * pack, grad_pack(v, split.head + V * pack, target, r).raw);
    }
    if (rank == 0)
        for (int64_t j = threadIdx.x; j < split.head; j += THREADS)
            g[j] = from_float<T>(cross_entropy_grad(to_float(x[j]), j, target, row_lse.max, log_sum, scale));
    if (rank == K - 1)
        for (int64_t j = tail + threadIdx.x; j < C; j += THREADS)
            g[j] = from_float<T>(cross_entropy_grad(to_float(x[j]), j, target, row_lse.max, log_sum, scale));
    // the last cluster's rank 0: the mean over the rows, one partial per cluster
    if (rank == 0) finish_mean(partial, row_losses, counters, counts, loss, unsigned(row), gridDim.x / K);
#endif
}

// --- the host: which cluster, or why fused runs instead -------------------------------------------

static cudaLaunchConfig_t cluster_config(int64_t N, const ClusterPlan& plan, cudaStream_t stream,
                                         cudaLaunchAttribute* attribute) {
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(unsigned(N * plan.cluster_size));
    config.blockDim = dim3(THREADS);
    config.dynamicSmemBytes = size_t(plan.slice_packs) * 16;
    config.stream = stream;
    attribute->id = cudaLaunchAttributeClusterDimension;
    attribute->val.clusterDim.x = unsigned(plan.cluster_size);
    attribute->val.clusterDim.y = attribute->val.clusterDim.z = 1;
    config.attrs = attribute;
    config.numAttrs = 1;
    return config;
}

// Whether the current device can run clusters of plan's shape at all. Function attributes
// are per device, so they are set here, for each new plan: the kernel may take the largest
// slice and a non-portable cluster size.
template <typename T>
static bool schedulable(const ClusterPlan& plan) {
    auto kernel = cross_entropy_cluster_forward_kernel<T>;
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(MAX_SLICE_BYTES));
    if (err == cudaSuccess) err = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    if (err == cudaSuccess)
        err = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                   int(cudaSharedmemCarveoutMaxShared));
    cudaLaunchAttribute attribute;
    const cudaLaunchConfig_t config = cluster_config(1, plan, nullptr, &attribute);
    int clusters = 0;
    if (err == cudaSuccess) err = cudaOccupancyMaxActiveClusters(&clusters, kernel, &config);
    if (err == cudaSuccess) return clusters > 0;
    cudaGetLastError();  // not sticky: clear it, so that fused's launch reports its own
    return false;
}

static ClusterPlan make_plan(int device, bool aligned, int64_t N, int64_t C, DType dtype) {
    int major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess || major < 9)
        return {0, 0, "no thread-block clusters before sm_90"};
    if (!aligned) return {0, 0, "the gradient is not at the logits' offset from a 16-byte boundary"};
    const int64_t bytes = C * (dtype == DType::float32 ? 4 : 2);
    if (bytes <= FUSED_ROW_BYTES) return {0, 0, "a row fits fused's registers (16 KiB): read once already"};
    const int64_t packs = bytes / 16;  // at least any row's: the rest is its scalar head and tail
    const int64_t k = std::min<int64_t>((bytes + target_slice_bytes - 1) / target_slice_bytes, max_cluster_size);
    const int64_t slice = (packs + k - 1) / k;
    if (slice * 16 > MAX_SLICE_BYTES) return {0, 0, "a row is larger than the cluster's shared memory"};
    const ClusterPlan plan = {int((packs + slice - 1) / slice), int(slice), nullptr};  // no empty CTA
    if (N * plan.cluster_size > INT32_MAX) return {0, 0, "more CTAs than a grid holds"};
    const bool ok = dispatch_dtype(dtype, [&](auto tag) {
        return schedulable<decltype(tag)>(plan) ? cudaSuccess : cudaErrorInvalidConfiguration;
    }) == cudaSuccess;
    return ok ? plan : ClusterPlan{0, 0, "the device cannot schedule a cluster of this size"};
}

}  // namespace cluster_rung

ClusterPlan cross_entropy_cluster_plan(const void* logits, const void* grad_logits, int64_t N, int64_t C,
                                       DType dtype) {
    using namespace cluster_rung;
    // The last plan, for the last arguments (a training loop asks for the same one each step).
    struct Key {
        int device, max_cluster;
        bool aligned;
        int64_t N, C, slice_bytes;
        DType dtype;
        bool operator==(const Key& o) const {
            return device == o.device && max_cluster == o.max_cluster && aligned == o.aligned && N == o.N &&
                   C == o.C && slice_bytes == o.slice_bytes && dtype == o.dtype;
        }
    };
    static std::mutex mutex;
    static Key last_key = {-1};
    static ClusterPlan last_plan;
    Key key = {0, max_cluster_size,
               reinterpret_cast<uintptr_t>(logits) % 16 == reinterpret_cast<uintptr_t>(grad_logits) % 16, N, C,
               target_slice_bytes, dtype};
    if (cudaGetDevice(&key.device) != cudaSuccess) return {0, 0, "no current CUDA device"};
    std::lock_guard<std::mutex> lock(mutex);
    if (!(key == last_key)) {
        last_plan = make_plan(key.device, key.aligned, N, C, dtype);
        last_key = key;
    }
    return last_plan;
}

cudaError_t cross_entropy_cluster_tune(int max_cluster, int64_t slice_bytes) {
    using namespace cluster_rung;
    if (max_cluster == 0 && slice_bytes == 0) {
        max_cluster = PORTABLE_CLUSTER;
        slice_bytes = DEFAULT_SLICE_BYTES;
    }
    if (max_cluster < 1 || max_cluster > MAX_CLUSTER || slice_bytes < 16 || slice_bytes > MAX_SLICE_BYTES)
        return cudaErrorInvalidValue;
    max_cluster_size = max_cluster;
    target_slice_bytes = slice_bytes;
    return cudaSuccess;
}

// Needs a gradient buffer: inference runs the vectorized forward instead (the rung table says so).
cudaError_t cross_entropy_cluster_forward(const void* logits, const int64_t* targets, int64_t* counts,
                                          float* row_losses, float* row_max, float* row_log_sum, void* loss,
                                          void* grad_logits, int64_t N, int64_t C, DType dtype,
                                          cudaStream_t stream) {
    using namespace cluster_rung;
    if (grad_logits == nullptr) return cudaErrorInvalidValue;
    const ClusterPlan plan = cross_entropy_cluster_plan(logits, grad_logits, N, C, dtype);
    if (plan.fallback)
        return cross_entropy_fused_forward(logits, targets, counts, row_losses, row_max, row_log_sum, loss,
                                           grad_logits, N, C, dtype, stream);
    int64_t* counters;
    const cudaError_t err = cross_entropy_count_targets(targets, counts, N, C, stream, &counters);
    if (err != cudaSuccess) return err;
    return dispatch_dtype(dtype, [&](auto tag) {
        using T = decltype(tag);
        cudaLaunchAttribute attribute;
        const cudaLaunchConfig_t config = cluster_config(N, plan, stream, &attribute);
        return cudaLaunchKernelEx(&config, cross_entropy_cluster_forward_kernel<T>, static_cast<const T*>(logits),
                                  targets, counters, counts, row_losses, static_cast<T*>(loss),
                                  static_cast<T*>(grad_logits),
                                  C, plan.slice_packs);
    });
}

// The forward wrote dL/dx for grad_loss = 1: scale it in place (no work when grad_loss is 1).
cudaError_t cross_entropy_cluster_backward(const void* /*logits*/, const int64_t* /*targets*/,
                                           const float* /*row_max*/, const float* /*row_log_sum*/,
                                           const int64_t* /*counts*/, const void* grad_loss, void* grad_logits,
                                           int64_t N, int64_t C, DType dtype, cudaStream_t stream) {
    return scale_in_place(grad_logits, grad_loss, N * C, dtype, stream);
}
