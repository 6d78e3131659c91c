// A row read as 16-byte packs (four floats or eight bf16/fp16 values): the
// helpers the vectorized and fused rungs share. Math is fp32 whatever T is.
// Their per-element cost is what keeps a 16-bit row at memory speed: a max
// (HMNMX2, two 16-bit elements at once), a widening (one shift), an FFMA, a
// MUFU.EX2 and an FADD in the forward (cross_entropy.cuh: ExpShift).
#pragma once
#include "common/row_split.cuh"
#include "common/vector_load.cuh"
#include "cross_entropy/cross_entropy.cuh"

// `count` (<= N) packs from `first`, `stride` elements apart. A caller passing
// the constant N gets loads with no per-pack test.
template <typename T, int N>
__device__ __forceinline__ void load_packs(Pack<T> (&v)[N], const T* first, int64_t stride, int count) {
#pragma unroll
    for (int u = 0; u < N; ++u)
        if (u < count) v[u] = load_pack(first + u * stride);
}

// The largest element of v[0..count), count >= 1. 16-bit packs take the
// maximum of whole words first (exact), then widen the last two values.
template <typename T, int N>
__device__ __forceinline__ float packs_max(const Pack<T> (&v)[N], int count) {
    if constexpr (sizeof(T) == 4) {
        float m = v[0][0];
#pragma unroll
        for (int u = 0; u < N; ++u)
#pragma unroll
            for (int k = u == 0; k < 4; ++k)
                if (u < count) m = fmaxf(m, v[u][k]);
        return m;
    } else {
        uint32_t w[4] = {v[0].words[0], v[0].words[1], v[0].words[2], v[0].words[3]};
#pragma unroll
        for (int u = 1; u < N; ++u)
#pragma unroll
            for (int k = 0; k < 4; ++k)
                if (u < count) w[k] = max_bits<T>(w[k], v[u].words[k]);
        Pack<T> m;
        m.words[0] = max_bits<T>(max_bits<T>(w[0], w[1]), max_bits<T>(w[2], w[3]));
        return fmaxf(m[0], m[1]);
    }
}

// The caller has raised the running max to cover v, so no rescaling here.
template <typename T>
__device__ __forceinline__ float pack_sum_exp(const Pack<T>& v, float max) {
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < Pack<T>::size; ++k) sum += expf(v[k] - max);
    return sum;
}

// sum_k exp(v[k] - max) * 2^delta (ExpShift): one FFMA and one MUFU.EX2 each.
template <typename T>
__device__ __forceinline__ float pack_sum_exp2(const Pack<T>& v, float shift) {
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < Pack<T>::size; ++k) sum += fast_exp2(fmaf(v[k], LOG2E, shift));
    return sum;
}

// Add v[0..count) to the running log-sum-exp: the max raised once for all of
// them, then one exp per element. count >= 1; a constant count (the full
// rounds) compiles to no per-pack test.
template <typename T, int N>
__device__ __forceinline__ void lse_add_packs(LogSumExp& acc, const Pack<T> (&v)[N], int count) {
    lse_raise_max(acc, packs_max(v, count));
    const ExpShift e = exp_shift(acc.max);
    float sum = 0.0f;
    if (e.fast) {
#pragma unroll
        for (int u = 0; u < N; ++u)
            if (u < count) sum += pack_sum_exp2(v[u], e.shift);
        sum *= e.unshift;
    } else {
#pragma unroll
        for (int u = 0; u < N; ++u)
            if (u < count) sum += pack_sum_exp(v[u], acc.max);
    }
    acc.sum += sum;
}

// A row's constants for its gradient, (softmax_j - [j == target]) * scale with
// softmax_j = exp(x_j - max) * exp(-log_sum): 2^((x_j - max) * LOG2E) * prob, so
// an element off the target costs an FADD, an FMUL, a MUFU.EX2 and an FMUL by
// prob * scale. x_j - max, not ExpShift's FFMA: no max overflows it, so no row
// needs a second path (nor the registers one would hold). inf and NaN land
// where expf((x - max) - log_sum) puts them: an all -inf row (log_sum = -inf)
// gives 0 * inf = NaN.
struct GradRow {
    float max, prob, scale, prob_scale;  // scale: 0 on an ignored row, NaN for a bad target
};

__device__ __forceinline__ GradRow grad_row(float row_max, float log_sum, float scale) {
    const float prob = expf(-log_sum);
    return {row_max, prob, scale, prob * scale};
}

// cross_entropy_grad for the pack of columns j0, j0 + 1, ...: the target's
// pack, one a row, is found with one 64-bit test per pack, not one per element,
// and its target element is (p - 1) * scale in one rounding (fmaf).
template <typename T>
__device__ __forceinline__ Pack<T> grad_pack(const Pack<T>& x, int64_t j0, int64_t target, const GradRow& r) {
    constexpr int V = Pack<T>::size;
    const int64_t offset = target - j0;
    float g[V];
#pragma unroll
    for (int k = 0; k < V; ++k) g[k] = fast_exp2((x[k] - r.max) * LOG2E) * r.prob_scale;
    if (offset >= 0 && offset < V) {
#pragma unroll
        for (int k = 0; k < V; ++k)
            if (k == offset) g[k] = fmaf(fast_exp2((x[k] - r.max) * LOG2E) * r.prob, r.scale, -r.scale);
    }
    return pack_of<T>(g);
}
