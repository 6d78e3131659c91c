// The smooth L1 (Huber) formulas every smooth_l1_loss kernel shares (launchers.h declares
// the launchers each rung defines), after ATen's smooth_l1_loss and huber_loss:
//
//   smooth_l1(d) = |d| < beta ? 0.5 d^2 / beta : |d| - 0.5 beta        d = p - t
//   slope(d)     = d < -beta ? -1 : d > beta ? 1 : d / beta           (dsmooth_l1/dd)
//   huber(d; delta) = delta * smooth_l1(d) with beta = delta
//
// beta = 0 is the L1 loss (slope 0 at d = 0, and at a NaN d, as ATen's l1_loss backward). NaN
// propagates otherwise: every comparison with it is false, so the middle branch's d / beta carries it.
// The ladder's problem is KernelBench's: beta = 1, reduction mean, loss = sum smooth_l1 / (B D).
#pragma once

// inv_beta = 1 / beta, or 0 for beta = 0 (whose quadratic branch is never taken).
__device__ __forceinline__ float smooth_l1(float d, float beta, float inv_beta) {
    const float z = fabsf(d);
    return z < beta ? 0.5f * z * z * inv_beta : z - 0.5f * beta;
}

__device__ __forceinline__ float smooth_l1_slope(float d, float beta, float inv_beta) {
    return d < -beta ? -1.0f : d > beta ? 1.0f : beta > 0.0f ? d * inv_beta : 0.0f;
}

// The teaching ladder's two (beta = 1).
__device__ __forceinline__ float smooth_l1_term(float p, float t) {
    return smooth_l1(p - t, 1.0f, 1.0f);
}

// scaled_grad = grad_loss / (B D), computed once per thread.
__device__ __forceinline__ float smooth_l1_grad(float p, float t, float scaled_grad) {
    return smooth_l1_slope(p - t, 1.0f, 1.0f) * scaled_grad;
}
