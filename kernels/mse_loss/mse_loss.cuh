// The mean-squared-error formulas every mse_loss kernel shares (launchers.h declares
// the launchers each rung defines).
//
//   loss  = sum_ij (p_ij - t_ij)^2 / (B D)                  (reduction mean)
//   dL/dp = 2 (p_ij - t_ij) * grad_loss / (B D)
//
// As torch.mse_loss: the difference first, so inf - inf and NaN give NaN and an
// infinite difference gives +inf.
#pragma once

__device__ __forceinline__ float mse_loss_term(float p, float t) {
    const float d = p - t;
    return d * d;
}

// scaled_grad = 2 grad_loss / (B D), computed once per thread.
__device__ __forceinline__ float mse_loss_grad(float p, float t, float scaled_grad) {
    return (p - t) * scaled_grad;
}
