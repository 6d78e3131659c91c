// cluster: a row too long for one SM is split over a thread-block cluster (sm_90).
// Each CTA bulk-copies (TMA) its slice of the row into its shared memory, the CTAs
// combine their slices' (max, sum) through distributed shared memory, and each writes
// its slice's gradient from shared memory. fused holds 16 KiB of a row on chip and
// re-reads the rest for the gradient (from DRAM at 131072 classes): here a row is read once.
// Where a CTA's slice takes a whole SM, the clusters stay on the GPU and take row after row
// (one cluster per row would leave an SM idle between a CTA's end and the next one's start);
// smaller slices get a cluster per row, as the GPU then overlaps several CTAs per SM.
//
// Where the cluster does not apply, the launcher runs fused's kernels; the rule is
// cross_entropy_cluster_plan's (bound to Python as cluster_plan, which says why):
//   - the device is not sm_90 or newer (no clusters);
//   - the gradient is not at the logits' offset from a 16-byte boundary (no pack copies);
//   - a row is at most 16 KiB: fused keeps it in registers and reads it once already;
//   - a row is more than max_cluster x MAX_SLICE_BYTES (1.56 MiB with clusters of 8);
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

// Tuning (cross_entropy_cluster_tune): the largest cluster tried, the slice a CTA aims for
// (64 KiB: 3 CTAs per SM, so that one CTA's loads overlap another's writes), and the most
// clusters launched (0: the rule above).
constexpr int64_t DEFAULT_SLICE_BYTES = 64 * 1024;
static int max_cluster_size = PORTABLE_CLUSTER;
static int64_t target_slice_bytes = DEFAULT_SLICE_BYTES;
static int64_t grid_clusters = 0;

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

// Wait until `bar` completes the phase of this parity (0 for its first use, then alternating).
__device__ __forceinline__ void barrier_wait(uint64_t* bar, uint32_t parity) {
    asm volatile(
        "{\n .reg .pred done;\n WAIT:\n mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        " @!done bra WAIT;\n}" ::"r"(shared_address(bar)),
        "r"(parity)
        : "memory");
}

// The first half of a cluster barrier, without ordering memory (cooperative_groups'
// barrier_arrive releases, a MEMBAR.ALL.GPU): it only says this CTA runs.
__device__ __forceinline__ void cluster_arrive_relaxed() {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}

// Store v into CTA `rank`'s copy of this CTA's shared variable `slot` (distributed shared memory).
__device__ __forceinline__ void store_to_rank(float4* slot, unsigned rank, float4 v) {
    uint32_t remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(shared_address(slot)), "r"(rank));
    asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(remote), "f"(v.x), "f"(v.y), "f"(v.z),
                 "f"(v.w)
                 : "memory");
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

// CTA `rank`'s part of a row: packs [first, first + count) of the row's aligned
// middle; rank 0 also holds the scalar head and rank K - 1 the scalar tail (read
// from global memory in both passes).
template <typename T>
struct RowSlice {
    const T* x;
    T* g;
    RowSplit split;
    int64_t first;
    int count;
};
template <typename T>
__device__ __forceinline__ RowSlice<T> row_slice(const T* logits, T* grad_logits, int64_t row, int64_t C, int rank,
                                                 int slice_packs) {
    const T* x = logits + row * C;
    T* g = grad_logits + row * C;
    const RowSplit split = split_row(C, x, g);
    const int64_t first = int64_t(rank) * slice_packs;
    const int count = int(max(int64_t(0), min(int64_t(slice_packs), split.packs - first)));
    return {x, g, split, first, count};
}

// Thread 0: the slice's bulk copies into `buffer`, copy c completing barrier bars[c].
template <typename T>
__device__ __forceinline__ void copy_slice(const RowSlice<T>& s, uint4* buffer, uint64_t* bars) {
    const T* middle = s.x + s.split.head + Pack<T>::size * s.first;
    for (int c = 0; c < SLICE_COPIES; ++c) {
        const SliceCopy p = slice_copy(c, s.count);
        if (p.end > p.begin)
            bulk_copy(buffer + p.begin, middle + Pack<T>::size * p.begin, 16u * (p.end - p.begin), &bars[c]);
    }
}

// Clusters of K CTAs (grid: `clusters` * K, up to one cluster per row): cluster q takes rows
// q, q + clusters, ...; a CTA copies its next row's slice once it has written this row's gradient.
template <typename T>
__global__ void __launch_bounds__(THREADS)
cross_entropy_cluster_forward_kernel(const T* __restrict__ logits,         // (N, C)
                                     const int64_t* __restrict__ targets,  // (N,)
                                     int64_t* counters,                    // (4,) from the count stage
                                     int64_t* counts,                      // (4,) written: n_valid, out of range
                                     float* __restrict__ row_losses,       // (N,)
                                     T* __restrict__ loss,                 // ()
                                     T* __restrict__ grad_logits,          // (N, C), for grad_loss = 1
                                     int64_t N, int64_t C, int slice_packs) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    constexpr int V = Pack<T>::size;
    constexpr int WARPS = THREADS / 32;
    constexpr int UNROLL = 4;  // packs per thread per round of pass 1
    extern __shared__ __align__(16) uint4 slice[];  // this CTA's packs
    __shared__ uint64_t landed[SLICE_COPIES];
    __shared__ float2 warp_lse[WARPS];
    __shared__ float4 cta_parts[2][MAX_CLUSTER];  // (max, sum, target's logit or 0) of each CTA, by row parity
    const cg::cluster_group cluster = cg::this_cluster();
    const int K = int(cluster.num_blocks()), rank = int(cluster.block_rank());
    const int64_t clusters = gridDim.x / K, first_row = blockIdx.x / K;

    if (threadIdx.x == 0) {
        for (int c = 0; c < SLICE_COPIES; ++c) barrier_init(&landed[c]);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");  // visible to the copy engine
        copy_slice(row_slice(logits, grad_logits, first_row, C, rank, slice_packs), slice, landed);
    }
    // Arrive now, wait before writing into another CTA: by then every CTA of the
    // cluster is running (its shared memory exists), and the wait costs nothing.
    cluster_arrive_relaxed();
    __syncthreads();  // the barriers are initialised before anyone waits on them
    const float per_valid_row = 1.0f / float(counters[0]);
    int64_t target = targets[first_row];
    uint32_t phases = 0;  // bit c: the parity landed[c] completes next
    float last_loss = 0.0f;
    int i = 0;
    for (int64_t row = first_row; row < N; row += clusters, ++i) {
        const RowSlice<T> s = row_slice(logits, grad_logits, row, C, rank, slice_packs);
        const T* x = s.x;
        const int64_t head = s.split.head, tail = head + V * s.split.packs;
        const int64_t next_target = row + clusters < N ? targets[row + clusters] : 0;  // in flight meanwhile
        const float scale = row_grad_scale(target, C, per_valid_row);

        // Pass 1: the slice's (max, sum), copy by copy as each lands; the scalar ends from global.
        LogSumExp lse;
        if (rank == 0)
            for (int64_t j = threadIdx.x; j < head; j += THREADS) lse_add(lse, to_float(x[j]));
        if (rank == K - 1)
            for (int64_t j = tail + threadIdx.x; j < C; j += THREADS) lse_add(lse, to_float(x[j]));
        for (int c = 0; c < SLICE_COPIES; ++c) {
            const SliceCopy p = slice_copy(c, s.count);
            if (p.end == p.begin) continue;
            barrier_wait(&landed[c], (phases >> c) & 1u);
            phases ^= 1u << c;
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

        // The target's logit, from the CTA that holds it (shared memory, or a scalar end).
        float target_logit = 0.0f;
        if (threadIdx.x < K && target_in_range(target, C)) {
            const int64_t pack = (target - head) / V - s.first;
            if (target < head || target >= tail) {
                if ((target < head && rank == 0) || (target >= tail && rank == K - 1))
                    target_logit = to_float(x[target]);
            } else if (pack >= 0 && pack < s.count) {
                target_logit = to_float(reinterpret_cast<const T*>(slice + pack)[(target - head) % V]);
            }
        }

        // The row's: thread r puts this CTA's part into CTA r's slot `rank` (distributed
        // shared memory); after the cluster barrier every CTA combines the K parts in rank
        // order (the same numbers in every CTA, bitwise). Slots alternate by row: a CTA
        // writes a row's slots only after every CTA has passed the previous row's barrier,
        // so after it has read the slots of the row before that.
        if (i == 0) cluster.barrier_wait();
        if (threadIdx.x < K)
            store_to_rank(&cta_parts[i & 1][rank], threadIdx.x, make_float4(part.max, part.sum, target_logit, 0.0f));
        cluster.sync();
        const float4* parts = cta_parts[i & 1];
        LogSumExp row_lse;
        float logit = 0.0f;  // one CTA's is the target's, the rest 0: the sum is exact
        for (int r = 0; r < K; ++r) row_lse.max = fmaxf(row_lse.max, parts[r].x);
        for (int r = 0; r < K; ++r) {
            row_lse.sum += parts[r].y * expf(parts[r].x - row_lse.max);
            logit += parts[r].z;
        }
        const float log_sum = logf(row_lse.sum);
        if (rank == 0 && threadIdx.x == 0) {
            const float row_l = row_loss_of(logit, target, C, row_lse.max, log_sum);
            if (row + clusters < N) row_losses[row] = row_l;  // the last goes with the finish
            else last_loss = row_l;
        }

        // Pass 2: the gradient from shared memory, 16-byte stores.
        const GradRow r = grad_row(row_lse.max, log_sum, scale);
        T* gv = s.g + head;
#pragma unroll 4
        for (int k = threadIdx.x; k < s.count; k += THREADS) {
            Pack<T> v;
            v.raw = slice[k];
            const int64_t pack = s.first + k;
            store_16(gv + V * pack, grad_pack(v, head + V * pack, target, r).raw);
        }
        if (rank == 0)
            for (int64_t j = threadIdx.x; j < head; j += THREADS)
                s.g[j] = from_float<T>(cross_entropy_grad(to_float(x[j]), j, target, row_lse.max, log_sum, scale));
        if (rank == K - 1)
            for (int64_t j = tail + threadIdx.x; j < C; j += THREADS)
                s.g[j] = from_float<T>(cross_entropy_grad(to_float(x[j]), j, target, row_lse.max, log_sum, scale));

        // The slice is read: copy the cluster's next row into it.
        if (row + clusters < N) {
            __syncthreads();
            if (threadIdx.x == 0) {
                asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // our reads before the engine's writes
                copy_slice(row_slice(logits, grad_logits, row + clusters, C, rank, slice_packs), slice, landed);
            }
        }
        target = next_target;
    }
    // the last cluster's rank 0: the mean over the rows, the row losses in row order
    if (rank == 0) {
        const int64_t last_row = first_row + (N - 1 - first_row) / clusters * clusters;
        finish_mean(last_loss, row_losses, counters, counts, loss, unsigned(last_row), unsigned(clusters), N);
    }
#endif
}

// --- the host: which cluster, or why fused runs instead -------------------------------------------

static cudaLaunchConfig_t cluster_config(int64_t clusters, const ClusterPlan& plan, cudaStream_t stream,
                                         cudaLaunchAttribute* attribute) {
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(unsigned(clusters * plan.cluster_size));
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

// How many clusters of plan's shape the current device runs at once (0: none, or an error).
// Function attributes are per device, so they are set here, for each new plan: the kernel
// may take the largest slice and a non-portable cluster size.
template <typename T>
static int active_clusters(const ClusterPlan& plan) {
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
    if (err == cudaSuccess) return clusters;
    cudaGetLastError();  // not sticky: clear it, so that fused's launch reports its own
    return 0;
}

static ClusterPlan make_plan(int device, bool aligned, int64_t N, int64_t C, DType dtype) {
    int major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess || major < 9)
        return {0, 0, 0, "no thread-block clusters before sm_90"};
    if (!aligned) return {0, 0, 0, "the gradient is not at the logits' offset from a 16-byte boundary"};
    const int64_t bytes = C * (dtype == DType::float32 ? 4 : 2);
    if (bytes <= FUSED_ROW_BYTES) return {0, 0, 0, "a row fits fused's registers (16 KiB): read once already"};
    const int64_t packs = bytes / 16;  // at least any row's: the rest is its scalar head and tail
    const int64_t k = std::min<int64_t>((bytes + target_slice_bytes - 1) / target_slice_bytes, max_cluster_size);
    const int64_t slice = (packs + k - 1) / k;
    if (slice * 16 > MAX_SLICE_BYTES) return {0, 0, 0, "a row is larger than the cluster's shared memory"};
    ClusterPlan plan = {int((packs + slice - 1) / slice), int(slice), 0, nullptr};  // no empty CTA
    int active = 0;
    dispatch_dtype(dtype, [&](auto tag) {
        active = active_clusters<decltype(tag)>(plan);
        return cudaSuccess;
    });
    if (active == 0) return {0, 0, 0, "the device cannot schedule a cluster of this size"};
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    // a cluster per row, unless a CTA takes a whole SM (or the grid would be too large)
    const bool stay = int64_t(active) * plan.cluster_size <= sms || N * plan.cluster_size > INT32_MAX;
    plan.clusters = int(std::min<int64_t>(N, grid_clusters ? grid_clusters : stay ? active : N));
    return plan;
}

}  // namespace cluster_rung

ClusterPlan cross_entropy_cluster_plan(const void* logits, const void* grad_logits, int64_t N, int64_t C,
                                       DType dtype) {
    using namespace cluster_rung;
    // The last plan, for the last arguments (a training loop asks for the same one each step).
    struct Key {
        int device, max_cluster;
        bool aligned;
        int64_t N, C, slice_bytes, clusters;
        DType dtype;
        bool operator==(const Key& o) const {
            return device == o.device && max_cluster == o.max_cluster && aligned == o.aligned && N == o.N &&
                   C == o.C && slice_bytes == o.slice_bytes && clusters == o.clusters && dtype == o.dtype;
        }
    };
    static std::mutex mutex;
    static Key last_key = {-1};
    static ClusterPlan last_plan;
    Key key = {0, max_cluster_size,
               reinterpret_cast<uintptr_t>(logits) % 16 == reinterpret_cast<uintptr_t>(grad_logits) % 16, N, C,
               target_slice_bytes, grid_clusters, dtype};
    if (cudaGetDevice(&key.device) != cudaSuccess) return {0, 0, 0, "no current CUDA device"};
    std::lock_guard<std::mutex> lock(mutex);
    if (!(key == last_key)) {
        last_plan = make_plan(key.device, key.aligned, N, C, dtype);
        last_key = key;
    }
    return last_plan;
}

cudaError_t cross_entropy_cluster_tune(int max_cluster, int64_t slice_bytes, int64_t clusters) {
    using namespace cluster_rung;
    if (max_cluster == 0 && slice_bytes == 0 && clusters == 0) {
        max_cluster = PORTABLE_CLUSTER;
        slice_bytes = DEFAULT_SLICE_BYTES;
    }
    if (max_cluster < 1 || max_cluster > MAX_CLUSTER || slice_bytes < 16 || slice_bytes > MAX_SLICE_BYTES ||
        clusters < 0)
        return cudaErrorInvalidValue;
    max_cluster_size = max_cluster;
    target_slice_bytes = slice_bytes;
    grid_clusters = clusters;
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
        const cudaLaunchConfig_t config = cluster_config(plan.clusters, plan, stream, &attribute);
        return cudaLaunchKernelEx(&config, cross_entropy_cluster_forward_kernel<T>, static_cast<const T*>(logits),
                                  targets, counters, counts, row_losses, static_cast<T*>(loss),
                                  static_cast<T*>(grad_logits), N, C, plan.slice_packs);
    });
}

// The forward wrote dL/dx for grad_loss = 1: scale it in place (no work when grad_loss is 1).
cudaError_t cross_entropy_cluster_backward(const void* /*logits*/, const int64_t* /*targets*/,
                                           const float* /*row_max*/, const float* /*row_log_sum*/,
                                           const int64_t* /*counts*/, const void* grad_loss, void* grad_logits,
                                           int64_t N, int64_t C, DType dtype, cudaStream_t stream) {
    return scale_in_place(grad_logits, grad_loss, N * C, dtype, stream);
}
