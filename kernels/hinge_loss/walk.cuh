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

// The first n elements of a pack at ptr (all of it, one 16-byte load, when PACKED).
// (16-bit elements are put together in 32-bit words: writing one half of a word of the
// union would go through local memory.)
template <typename T, bool PACKED>
__device__ __forceinline__ Pack<T> load_some(const T* ptr, int n) {
    if constexpr (PACKED) {
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
// part of (B, D): offset = row * D + j, n = the pack's elements below D.
template <typename T, int THREADS, int UNROLL, bool PACKED, typename Visit>
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
                if (row + u * groups < B) pb[u] = load_some<T, PACKED>(predictions + (row + u * groups) * D + j, n);
#pragma unroll
            for (int u = 0; u < UNROLL; ++u)
                if (row + u * groups < B) visit((row + u * groups) * D + j, pb[u], t, n);
        }
    }
}
