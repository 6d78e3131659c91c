// The walk of the vectorized and fused operators over (B, D) predictions and (D,) targets.
// Each thread owns one 16-byte pack of columns (4 floats, 8 bf16/fp16): it loads the pack's
// targets once and keeps them in registers for every row of its block, and issues UNROLL
// packs of predictions (one per row) before using any. A 1-D grid walks in 2-D: `columns`
// blocks across a row (each THREADS packs wide, striding on where D is wider), rows in
// `groups`. At most HINGE_LOSS_MAX_PARTIALS blocks, one partial sum each, which the last
// block adds in a fixed order (common/last_block.cuh). PACKED (every row 16-byte aligned:
// D a multiple of the pack and every pointer aligned) is chosen on the host; otherwise the
// same walk loads each pack's elements one by one.
#pragma once
#include <algorithm>
#include <cstdint>
#include "common/vector_load.cuh"
#include "hinge_loss/hinge_loss.cuh"
#include "hinge_loss/launchers.h"

struct Grid {
    int64_t columns, blocks;  // blocks across a row; blocks in all (columns x groups of rows)
};

// At most as many groups of rows as fill each thread's `unroll` rows in flight: at 128 rows, one a
// block left 3 of the forward's 4 slots empty and needed twice the blocks the GPU holds at once.
template <typename T>
Grid walk_grid(int64_t B, int64_t D, int threads, int unroll = 1) {
    const int64_t width = int64_t(threads) * Pack<T>::size;
    const int64_t columns = std::min<int64_t>((D + width - 1) / width, HINGE_LOSS_MAX_PARTIALS);
    const int64_t groups = std::min<int64_t>((B + unroll - 1) / unroll, HINGE_LOSS_MAX_PARTIALS / columns);
    return {columns, columns * std::max<int64_t>(1, groups)};
}

// Whether every row of every non-null pointer is 16-byte aligned.
template <typename T>
bool rows_packed(int64_t D, std::initializer_list<const void*> pointers) {
    if (D % Pack<T>::size != 0) return false;
    for (const void* p : pointers)
        if (p != nullptr && !is_aligned_16(p)) return false;
    return true;
}

// A forward alone reads inputs of at most EVICT_FIRST_L2S times the current device's L2 with
// evict-first loads. After earlier kernels' writes (in a timing, the L2 flush's) the L2 holds dirty
// lines; a plain load evicts them, and their write-back shares the DRAM with the reads, where an
// evict-first load evicts its own lines first. On an H100, forward ms, plain -> evict-first (inputs
// in L2s): 1024 x 32768 bfloat16 (1.3) 0.038 -> 0.032, float32 (2.6) 0.059 -> 0.055; 4096 x 32768
// bfloat16 (5.1) 0.103 -> 0.105, 32768 x 32768 (41) 0.702 -> 0.744: past a few L2s it costs more
// than the write-back it saves.
constexpr int EVICT_FIRST_L2S = 4;

inline bool evict_first_fits(int64_t bytes) {
    int device = 0, l2 = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device);
    return bytes <= int64_t(EVICT_FIRST_L2S) * l2;
}

// The first n elements of a pack at ptr (all of it, one 16-byte load, when PACKED).
// (16-bit elements are put together in 32-bit words: writing one half of a word of the
// union would go through local memory.)
// EVICT_FIRST: an evict-first load (ld.global.cs), for what is read once (evict_first_fits).
template <typename T, bool PACKED, bool EVICT_FIRST = false>
__device__ __forceinline__ Pack<T> load_some(const T* ptr, int n) {
    if constexpr (PACKED && EVICT_FIRST) {
        Pack<T> pack;
        pack.raw = __ldcs(reinterpret_cast<const uint4*>(ptr));
        return pack;
    } else if constexpr (PACKED) {
        return load_pack(ptr);
    } else {
        Pack<T> pack;
        pack.raw = make_uint4(0, 0, 0, 0);
        if constexpr (sizeof(T) == 4) {
#pragma unroll
            for (int k = 0; k < 4; ++k)
                if (k < n) pack.words[k] = reinterpret_cast<const uint32_t*>(ptr)[k];
        } else {
            const uint16_t* bits = reinterpret_cast<const uint16_t*>(ptr);
#pragma unroll
            for (int k = 0; k < Pack<T>::size; ++k)
                if (k < n) pack.words[k / 2] |= uint32_t(bits[k]) << (16 * (k % 2));
        }
        return pack;
    }
}

// The first n of f[] at ptr, rounded to T (one 16-byte store when PACKED: __stwb, a plain
// write-back store, because nvcc 13 split the plain 16-byte store of this walk into four
// 4-byte ones (it keeps the load whole)).
template <typename T, bool PACKED>
__device__ __forceinline__ void store_some(T* ptr, const float (&f)[Pack<T>::size], int n) {
    if constexpr (PACKED) {
        const Pack<T> pack = pack_of<T>(f);
        __stwb(reinterpret_cast<uint4*>(ptr), pack.raw);
    } else {
#pragma unroll
        for (int k = 0; k < Pack<T>::size; ++k)
            if (k < n) ptr[k] = from_float<T>(f[k]);
    }
}

// visit(offset, pack of predictions, targets as floats, n) for every pack of the block's
// part of (B, D): offset = row * D + j, n = the pack's elements below D. EVICT_FIRST: the
// predictions' packed loads are evict-first.
template <typename T, int THREADS, int UNROLL, bool PACKED, bool EVICT_FIRST = false, typename Visit>
__device__ __forceinline__ void walk(const T* __restrict__ predictions, const T* __restrict__ targets, int64_t B,
                                     int64_t D, int64_t columns, Visit&& visit) {
    constexpr int V = Pack<T>::size;
    // 32-bit division: both are at most HINGE_LOSS_MAX_PARTIALS (a 64-bit one is a called routine)
    const unsigned int across = static_cast<unsigned int>(columns);
    const int64_t groups = gridDim.x / across, group = blockIdx.x / across;
    const int64_t stride = int64_t(V) * THREADS * columns;  // a row's packs, `columns` blocks at a time
    for (int64_t j = V * (int64_t(blockIdx.x % across) * THREADS + threadIdx.x); j < D; j += stride) {
        const int n = PACKED ? V : (D - j < V ? int(D - j) : V);
        const Pack<T> tp = load_some<T, PACKED>(targets + j, n);  // once, for all the block's rows
        float t[V];
#pragma unroll
        for (int k = 0; k < V; ++k) t[k] = tp[k];
        for (int64_t row = group; row < B; row += UNROLL * groups) {
            Pack<T> pb[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u)  // all in flight
                if (row + u * groups < B) pb[u] = load_some<T, PACKED, EVICT_FIRST>(predictions + (row + u * groups) * D + j, n);
#pragma unroll
            for (int u = 0; u < UNROLL; ++u)
                if (row + u * groups < B) visit((row + u * groups) * D + j, pb[u], t, n);
        }
    }
}
