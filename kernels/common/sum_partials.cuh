// The second stage of the teaching rungs' forwards: one block adds the per-row
// partial sums in a fixed order and divides by `divisor` (common/last_block.cuh's
// sum_in_order: the order the one-kernel rungs' last block uses). Deterministic by
// design: the same partials always give bitwise the same result (no float atomicAdd).
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

cudaError_t launch_sum_partials(const float* partials,  // (n,)
                                int64_t n, float divisor,
                                void* result,           // () float32 (the teaching rungs' one dtype): the loss
                                cudaStream_t stream);
