// The cross-entropy formulas every rung shares (launchers.h declares the
// launchers each rung defines). For one row of logits x with target class t:
//
//   loss_row = logsumexp(x) - x[t]       mean over the rows with t != ignore_index
//   dL/dx_j  = (softmax(x)_j - [j == t]) * grad_loss / n_valid     (0 on ignored rows)
//
// logsumexp(x) is carried as (max, sum_j exp(x_j - max)): subtracting the max
// keeps exp from overflowing at x = 1e4. The forward stores the two parts, max
// and log(sum), so the backward forms x_j - logsumexp as (x_j - max) - log(sum):
// x_j - max is exact for logits near the max, where x_j - (max + log(sum))
// would round log(sum) away against a large max.
#pragma once
#include <cstdint>
#include <float.h>
#include <math.h>
#include "common/reduce.cuh"
#include "common/vector_load.cuh"  // to_float: the typed rungs read 16-bit logits

constexpr int64_t IGNORE_INDEX = -100;

// Running log-sum-exp of the values seen so far (the "online softmax"): one
// pass over the row, one exp per value. The max starts at -FLT_MAX, not -inf,
// so a row of -inf logits never computes exp(-inf - -inf) = NaN.
struct LogSumExp {
    float max = -FLT_MAX;
    float sum = 0.0f;  // sum of exp(x - max)
};

// Raise the running max to m if m is larger, rescaling the sum to match.
__device__ __forceinline__ void lse_raise_max(LogSumExp& acc, float m) {
    if (m > acc.max) {
        acc.sum *= expf(acc.max - m);
        acc.max = m;
    }
}

// NaN never raises the max (m > max is false) but still enters the sum, so it propagates.
__device__ __forceinline__ void lse_add(LogSumExp& acc, float x) {
    lse_raise_max(acc, x);
    acc.sum += expf(x - acc.max);
}

// Combine the 32 lanes' (max, sum) into the warp's: the max first, then each
// sum rescaled to it. Every lane gets the result; no shared memory, no barrier.
__device__ __forceinline__ LogSumExp warp_reduce_logsumexp(LogSumExp acc) {
    LogSumExp warp;
    warp.max = warp_reduce_max(acc.max);
    warp.sum = warp_reduce_sum(acc.sum * expf(acc.max - warp.max));
    return warp;
}

// The same over the whole block, with warp shuffles and one shared slot per
// warp. Every thread gets the result.
__device__ __forceinline__ LogSumExp block_reduce_logsumexp(LogSumExp acc) {
    LogSumExp row;
    row.max = block_reduce_max(acc.max);
    row.sum = block_reduce_sum(acc.sum * expf(acc.max - row.max));
    return row;
}

// The packed loops' exp: exp(x - max) = 2^((x - max) * log2(e)) as one FFMA and
// one MUFU.EX2 (ex2.approx.ftz: relative error about 2^-22, results below 2^-126
// flushed to 0), where expf is about eight instructions of range reduction
// around the same MUFU.EX2. At two bytes an element that difference decides
// whether a 16-bit row is read at memory speed or waits on instruction issue.
constexpr float LOG2E = 1.44269504088896341f;

__device__ __forceinline__ float fast_exp2(float x) {
#ifdef __CUDA_ARCH__
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
#else
    return exp2f(x);  // a host compiler: the CPU simulator (losslab.teach.simulator)
#endif
}

// 2^fmaf(x, LOG2E, shift) with shift = -max * LOG2E (rounded) is exp(x - max)
// times 2^delta, delta = max * LOG2E + shift, the rounding of the shift (exact by
// fmaf): `unshift` = 2^-delta takes it back out once per round or row (at
// max = 1e4, 2^delta is a 3e-4 relative error). Past |max| = 2e38, and for an
// infinite max, the product overflows: `fast` is false and the caller takes expf.
struct ExpShift {
    float shift, unshift;
    bool fast;
};

__device__ __forceinline__ ExpShift exp_shift(float max) {
    const float shift = -max * LOG2E;
    return {shift, fast_exp2(-fmaf(max, LOG2E, shift)), fabsf(max) <= 2e38f};
}

__device__ __forceinline__ bool target_in_range(int64_t target, int64_t C) {
    return target >= 0 && target < C;
}

// One row's loss, logsumexp(x) - x[target] with logsumexp = max + log_sum, given
// the target's logit (any value where the target is ignored or out of range).
// An ignored row's loss is 0 (the mean leaves it out of the count too). A
// target outside [0, C) gives NaN: the loss says so without the host ever
// waiting for a range check.
__device__ __forceinline__ float row_loss_of(float target_logit, int64_t target, int64_t C, float max,
                                             float log_sum) {
    if (target == IGNORE_INDEX) return 0.0f;
    if (!target_in_range(target, C)) return NAN;
    return (max - target_logit) + log_sum;
}

// The same, reading the target's logit from the row; an out-of-range target is
// never used as an index, so nothing is read out of bounds.
template <typename T>
__device__ __forceinline__ float row_loss(const T* x,  // (C,) this row's logits
                                          int64_t target, int64_t C, float max, float log_sum) {
    return row_loss_of(target_in_range(target, C) ? to_float(x[target]) : 0.0f, target, C, max, log_sum);
}

// The forward's per-row results: the loss, and the two parts of the row's
// log-sum-exp that the backward needs.
template <typename T>
__device__ __forceinline__ void store_row(const T* x,          // (C,) this row's logits
                                          int64_t target, int64_t C, LogSumExp lse, int64_t row,
                                          float* row_losses,   // (N,)
                                          float* row_max,      // (N,)
                                          float* row_log_sum) {  // (N,)
    const float log_sum = logf(lse.sum);
    row_losses[row] = row_loss(x, target, C, lse.max, log_sum);
    row_max[row] = lse.max;
    row_log_sum[row] = log_sum;
}

// grad_loss / n_valid on a valid row. 0 on an ignored row, so that an all-ignored
// batch (n_valid = 0) gets a zero gradient as in PyTorch, never 0 * inf. NaN on
// an out-of-range target.
__device__ __forceinline__ float row_grad_scale(int64_t target, int64_t C, float grad_per_valid_row) {
    if (target == IGNORE_INDEX) return 0.0f;
    return target_in_range(target, C) ? grad_per_valid_row : NAN;
}

__device__ __forceinline__ float cross_entropy_grad(float x, int64_t j, int64_t target, float row_max,
                                                    float log_sum, float scale) {
    return (expf((x - row_max) - log_sum) - (j == target ? 1.0f : 0.0f)) * scale;
}
