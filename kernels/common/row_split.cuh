// A row read as 16-byte packs: a scalar head up to the first 16-byte boundary,
// `packs` whole packs, and a scalar tail. Shared by the vectorized and fused
// rungs of every problem.
#pragma once
#include <cstdint>
#include "common/vector_load.cuh"

struct RowSplit {
    int64_t head, packs;
};

// The split of rows of `length` elements that start at `first`, `others...`:
// pack loads and stores need every row at the same offset from a 16-byte
// boundary; if they are not, there is no head and no pack: the tail takes the
// whole row (scalar loads only).
template <typename T, typename... Others>
__device__ __forceinline__ RowSplit split_row(int64_t length, const T* first, const Others*... others) {
    const uintptr_t offset = reinterpret_cast<uintptr_t>(first) % 16;
    if (((reinterpret_cast<uintptr_t>(others) % 16 != offset) || ...)) return {0, 0};
    const int64_t head = min(length, int64_t(elements_to_alignment(first)));
    return {head, (length - head) / Pack<T>::size};
}
