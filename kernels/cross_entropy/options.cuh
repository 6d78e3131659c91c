// Device code of cross_entropy's options (options.h gives the formulas): one
// row's statistics, its loss and its gradient, for a group of threads (a warp
// in vectorized, a block in fused) that splits the row between its ranks.
// Logits (and class probabilities) are read as 16-byte packs where the rows
// allow it (common/row_split.cuh), with fp32 math whatever the storage type.
#pragma once
#include "common/last_block.cuh"
#include "common/row_split.cuh"
#include "common/stream_workspace.cuh"
#include "cross_entropy/cross_entropy.cuh"
#include "cross_entropy/options.h"

// The options as one row sees them.
struct RowOptions {
    const float* weight;  // (C,) or null
    int64_t C, ignore_index;
    float keep;           // 1 - label_smoothing
    float spread;         // label_smoothing / C
    bool probs;           // class-probability targets
    bool sums;            // the loss needs sum_j a_j x_j (smoothing or probabilities)
};

__host__ __device__ inline RowOptions row_options(const float* weight, const void* probs, int64_t C,
                                                  int64_t ignore_index, float smoothing) {
    return {weight, C, ignore_index, 1.0f - smoothing, smoothing / float(C), probs != nullptr,
            probs != nullptr || smoothing > 0.0f};
}

__device__ __forceinline__ float class_weight(const RowOptions o, int64_t j) {
    return o.weight ? __ldg(o.weight + j) : 1.0f;
}

// One thread's share of a row: the running log-sum-exp, sum_j a_j (class
// probabilities only) and sum_j a_j (x_j - x0) (for class indices with a_j = w_j:
// the smoothing part, scaled by spread at the end). x0, the row's first logit,
// keeps the sums near the logits' range, so that A * logsumexp - sum a_j x_j
// does not cancel when the logits are large.
struct RowSums {
    LogSumExp lse;
    float a = 0.0f, ax = 0.0f;
};

__device__ __forceinline__ void row_add(RowSums& acc, const RowOptions o, int64_t j, float x, float q, float x0) {
    lse_add(acc.lse, x);
    if (!o.sums) return;
    const float w = class_weight(o, j);
    const float a = o.probs ? w * (o.keep * q + o.spread) : w;
    acc.a += a;
    acc.ax += a * (x - x0);
}

// Visit this rank's elements of the row: f(j, x_j, q_j) (q_j = 0 without probabilities).
template <typename T, typename F>
__device__ __forceinline__ void visit_row(const T* x, const T* q, int64_t C, int rank, int group, F&& f) {
    constexpr int V = Pack<T>::size;
    const RowSplit s = q ? split_row(C, x, q) : split_row(C, x);
    for (int64_t j = rank; j < s.head; j += group) f(j, to_float(x[j]), q ? to_float(q[j]) : 0.0f);
    for (int64_t k = rank; k < s.packs; k += group) {
        const int64_t j0 = s.head + V * k;
        const Pack<T> xp = load_pack(x + j0);
        Pack<T> qp;
        qp.raw = make_uint4(0, 0, 0, 0);
        if (q) qp = load_pack(q + j0);
#pragma unroll
        for (int e = 0; e < V; ++e) f(j0 + e, xp[e], q ? qp[e] : 0.0f);
    }
    for (int64_t j = s.head + V * s.packs + rank; j < C; j += group) f(j, to_float(x[j]), q ? to_float(q[j]) : 0.0f);
}

// A row's loss and A = sum_j a_j from its reduced sums. An ignored row gives
// (0, 0); a class index outside [0, C) that is not ignore_index gives NaN and is
// never used as an index.
struct RowResult {
    float loss, coef;
};

template <typename T>
__device__ __forceinline__ RowResult row_result(const T* x, int64_t target, const RowOptions o, RowSums r,
                                                float log_sum, float weight_sum) {
    const float x0 = to_float(x[0]);
    const float lse_shifted = (r.lse.max - x0) + log_sum;  // logsumexp(x) - x0
    if (o.probs) return {r.a * lse_shifted - r.ax, r.a};
    if (target == o.ignore_index) return {0.0f, 0.0f};
    if (!target_in_range(target, o.C)) return {NAN, NAN};
    const float wt = o.keep * class_weight(o, target);
    float loss = wt * ((r.lse.max - to_float(x[target])) + log_sum);
    if (o.sums) loss += o.spread * (weight_sum * lse_shifted - r.ax);
    return {loss, wt + o.spread * weight_sum};
}

// The factor a row's gradient is multiplied by: 0 on an ignored row, NaN on an
// out-of-range class index, else `scale`.
__device__ __forceinline__ float options_row_scale(int64_t target, const RowOptions o, float scale) {
    if (o.probs) return scale;
    if (target == o.ignore_index) return 0.0f;
    return target_in_range(target, o.C) ? scale : NAN;
}

__device__ __forceinline__ float options_grad(const RowOptions o, int64_t j, float x, float q, int64_t target,
                                              float row_max, float log_sum, float coef, float scale) {
    float a;
    if (o.probs) {
        a = class_weight(o, j) * (o.keep * q + o.spread);
    } else {
        a = o.sums ? o.spread * class_weight(o, j) : 0.0f;
        if (j == target) a += o.keep * class_weight(o, target);
    }
    return (expf((x - row_max) - log_sum) * coef - a) * scale;
}

// Write this rank's part of the row's gradient, 16-byte packs where x, q and g allow.
template <typename T>
__device__ __forceinline__ void write_row_grad(const T* x, const T* q, T* g, int64_t target, const RowOptions o,
                                               float row_max, float log_sum, float coef, float scale, int rank,
                                               int group) {
    constexpr int V = Pack<T>::size;
    const int64_t C = o.C;
    const RowSplit s = q ? split_row(C, x, g, q) : split_row(C, x, g);
    auto one = [&](int64_t j) {
        g[j] = from_float<T>(options_grad(o, j, to_float(x[j]), q ? to_float(q[j]) : 0.0f, target, row_max,
                                          log_sum, coef, scale));
    };
    for (int64_t j = rank; j < s.head; j += group) one(j);
    for (int64_t k = rank; k < s.packs; k += group) {
        const int64_t j0 = s.head + V * k;
        const Pack<T> xp = load_pack(x + j0);
        Pack<T> qp;
        qp.raw = make_uint4(0, 0, 0, 0);  // whole registers: no partly written union in local memory
        if (q) qp = load_pack(q + j0);
        float gf[V];  // widened logits, then their gradients in place: ptxas spilled fused bf16 otherwise
#pragma unroll
        for (int e = 0; e < V; ++e) gf[e] = xp[e];
#pragma unroll
        for (int e = 0; e < V; ++e)
            gf[e] = options_grad(o, j0 + e, gf[e], q ? qp[e] : 0.0f, target, row_max, log_sum, coef, scale);
        store_pack(g + j0, pack_of<T>(gf));
    }
    for (int64_t j = s.head + V * s.packs + rank; j < C; j += group) one(j);
}

// An options launcher's ticket for the last block (the stream's, stream_workspace.cuh; while a
// graph is captured, the workspace's first word) and the blocks' partials after it.
inline cudaError_t options_workspace(cudaStream_t stream, float* workspace, unsigned int** ticket,
                                     float** partials) {
    *partials = workspace + 4;  // 16 bytes on: the partials stay 16-byte aligned
    return stream_workspace(stream, workspace, sizeof(unsigned int), reinterpret_cast<void**>(ticket));
}
