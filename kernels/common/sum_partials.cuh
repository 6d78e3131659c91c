// The second stage of every forward pass: one block adds the per-row partial
// sums in a fixed order and divides by `divisor`. Deterministic by design: the
// same partials always give bitwise the same result (no float atomicAdd).
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

cudaError_t launch_sum_partials(const float* partials,  // (n,)
                                int64_t n, float divisor,
                                float* result,          // () the 0-d loss
                                cudaStream_t stream);
