// A row read as 16-byte packs (four floats or eight bf16/fp16 values): the
// helpers the vectorized and fused rungs share. Math is fp32 whatever T is.
#pragma once
#include "common/row_split.cuh"
#include "common/vector_load.cuh"
#include "cross_entropy/cross_entropy.cuh"

template <typename T>
__device__ __forceinline__ float pack_max(const Pack<T>& v) {
    float m = v[0];
#pragma unroll
    for (int k = 1; k < Pack<T>::size; ++k) m = fmaxf(m, v[k]);
    return m;
}

// The caller has raised the running max to cover v, so no rescaling here.
template <typename T>
__device__ __forceinline__ float pack_sum_exp(const Pack<T>& v, float max) {
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < Pack<T>::size; ++k) sum += expf(v[k] - max);
    return sum;
}

// cross_entropy_grad for the pack of columns j0, j0 + 1, ...: the target's
// position in the pack is found with one 64-bit test per pack, not one per element.
template <typename T>
__device__ __forceinline__ Pack<T> grad_pack(const Pack<T>& x, int64_t j0, int64_t target, float row_max,
                                             float log_sum, float scale) {
    const int64_t offset = target - j0;
    const int hit = offset >= 0 && offset < Pack<T>::size ? int(offset) : -1;
    Pack<T> g;
#pragma unroll
    for (int k = 0; k < Pack<T>::size; ++k)
        g.set(k, (expf((x[k] - row_max) - log_sum) - (k == hit ? 1.0f : 0.0f)) * scale);
    return g;
}
