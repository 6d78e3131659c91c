// The KL-divergence formulas every rung shares (launchers.h declares the
// launchers each rung defines).
//
//   loss    = sum_ij [ xlogy(t_ij, t_ij) - t_ij * log(p_ij) ] / B      (batchmean)
//   dL/dp   = -t_ij * (grad_loss / B) / p_ij
//
// The expressions and their order follow torch.kl_div(log(p), t), so t == 0
// contributes 0, p == 0 with t > 0 gives +inf, and NaN propagates.
#pragma once
#include "common/xlogy.cuh"

__device__ __forceinline__ float kl_div_term(float p, float t) {
    return xlogy(t, t) - t * fast_log(p);
}

// kl_div_term / ln 2, for packed loops that multiply their sum by LN2 once:
// two MUFU.LG2 and no FMUL by ln 2 per element. inf and NaN as kl_div_term's.
__device__ __forceinline__ float kl_div_term_log2(float p, float t) {
    return xlog2x(t) - t * fast_log2(p);
}

constexpr float LN2 = 0.693147180559945309f;

// scaled_grad = grad_loss / B, computed once per thread. __fdividef: a MUFU.RCP
// and a multiply (2 ulp), where `/` adds a range check and a called slow path
// whose saved registers spilled the fused loop. It differs from `/` only for
// |p| > 2^126 (0, where the quotient is below 1e-38) and for an infinite t (NaN).
__device__ __forceinline__ float kl_div_grad(float p, float t, float scaled_grad) {
    return __fdividef(-t * scaled_grad, p);
}
