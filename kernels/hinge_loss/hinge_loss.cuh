// The hinge-loss formulas every rung shares (launchers.h declares the launchers
// each rung defines).
//
//   margin  x_ij = 1 - p_ij * t_j                     (one FMA: exact sign, see below)
//   loss    = sum_ij max(x_ij, 0) / (B * D)           (torch.mean(torch.clamp(x, min=0)))
//   dL/dp   = -(x_ij > 0 ? grad_loss / (B * D) : 0) * t_j
//
// The order follows autograd of the reference: clamp passes the gradient only where
// x > 0 (0 at the hinge x = 0 itself, and where x is NaN), then the product's rule
// multiplies by t, so a NaN or infinite target still gives NaN. A NaN margin stays
// NaN in the loss (clamp propagates it; fmaxf would drop it).
#pragma once

// fmaf rounds 1 - p * t once, so its sign is the exact product's (the float64
// reference's sign too): p * t rounded first could round a margin of 2^-25 to 0.
__device__ __forceinline__ float hinge_margin(float p, float t) { return fmaf(-p, t, 1.0f); }

__device__ __forceinline__ float hinge_term(float x) { return x < 0.0f ? 0.0f : x; }

__device__ __forceinline__ float hinge_grad(float x, float t, float scaled_grad) {
    return -(x > 0.0f ? scaled_grad : 0.0f) * t;
}
