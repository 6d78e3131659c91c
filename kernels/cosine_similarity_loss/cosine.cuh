// The cosine-similarity loss's formulas every rung shares (launchers.h declares
// the launchers each rung defines). Per row, from three dot products:
//
//   a = max(|p|, eps), b = max(|t|, eps)           (each norm clamped apart, as
//   cos = (p.t / a) / b                             F.cosine_similarity does)
//   loss = sum_rows (1 - cos) / B
//   dcos/dp = alpha t - beta_p p, dcos/dt = alpha p - beta_t t,
//   alpha = 1 / (a b), beta_p = cos / (a |p|) (0 where |p| = 0), beta_t likewise.
//
// The clamp is outside autograd in PyTorch (aten's cosine_similarity clamps the
// norms in place under NoGradGuard), so the norm's own derivative p / |p| is kept
// even where |p| < eps, and linalg_vector_norm's backward gives 0 where |p| = 0.
// Dividing by a, then b, never forms a * b (no overflow for norms near 1e19).
// NaN propagates: the clamp keeps a NaN norm (a comparison, not fmaxf).
#pragma once
#include <math.h>

// The clamp of a norm: NaN stays NaN (NaN < eps is false).
__device__ __forceinline__ float clamp_norm(float norm, float eps) { return norm < eps ? eps : norm; }

// One row's cos and its gradient's coefficients, times `scale` (dL/dcos of the row).
struct RowCosine {
    float cos;      // the row's cosine similarity
    float k_other;  // scale * alpha:   dL/dp = k_other * t + k_p * p
    float k_p;      // -scale * beta_p
    float k_t;      // -scale * beta_t: dL/dt = k_other * p + k_t * t
};

__device__ __forceinline__ RowCosine row_cosine(float pt, float pp, float tt, float eps, float scale) {
    const float np = sqrtf(pp), nt = sqrtf(tt);
    const float a = clamp_norm(np, eps), b = clamp_norm(nt, eps);
    const float cos = pt / a / b;
    const float beta_p = np == 0.0f ? 0.0f : cos / a / np;
    const float beta_t = nt == 0.0f ? 0.0f : cos / b / nt;
    return {cos, scale / a / b, -scale * beta_p, -scale * beta_t};
}
