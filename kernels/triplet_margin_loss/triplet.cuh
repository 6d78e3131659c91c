// The triplet margin loss at PyTorch's defaults (margin 1, eps 1e-6, p = 2), written once for the
// teaching ladder (ladder/): the terms of a row's two squared distances, its loss, and the two
// coefficients of its gradient. The operators' own, with the options, swap and the three
// gradients, are rows.cuh's.
#pragma once
#include <cuda_runtime.h>
#include <math.h>

constexpr float TRIPLET_MARGIN = 1.0f, TRIPLET_EPS = 1e-6f;

// A row's |a - p + eps|^2 and |a - n + eps|^2 (F.pairwise_distance adds eps to each difference).
struct Squares {
    float ap = 0.0f, an = 0.0f;
};

__device__ __forceinline__ void add_squares(Squares& s, float a, float p, float n) {
    const float u = a - p + TRIPLET_EPS, v = a - n + TRIPLET_EPS;
    s.ap = fmaf(u, u, s.ap);
    s.an = fmaf(v, v, s.an);
}

// max(margin + d(a, p) - d(a, n), 0); a NaN stays NaN, as clamp_min keeps it.
__device__ __forceinline__ float triplet_row_loss(Squares s) {
    const float x = TRIPLET_MARGIN + sqrtf(s.ap) - sqrtf(s.an);
    return x < 0.0f ? 0.0f : x;
}

// dL/da_j = ap * (a_j - p_j + eps) + an * (a_j - n_j + eps), for `scale` = grad_loss / N. As PyTorch's
// autograd: zero unless the row's term is > 0 (clamp_min's backward), zero for a zero distance (norm's).
struct Coefficients {
    float ap, an;
};

__device__ __forceinline__ Coefficients triplet_coefficients(Squares s, float scale) {
    const float d_ap = sqrtf(s.ap), d_an = sqrtf(s.an);
    const float g = TRIPLET_MARGIN + d_ap - d_an > 0.0f ? scale : 0.0f;
    return {d_ap == 0.0f ? 0.0f : g / d_ap, d_an == 0.0f ? 0.0f : -g / d_an};
}

__device__ __forceinline__ float triplet_grad(float a, float p, float n, Coefficients c) {
    return fmaf(c.ap, a - p + TRIPLET_EPS, c.an * (a - n + TRIPLET_EPS));
}
