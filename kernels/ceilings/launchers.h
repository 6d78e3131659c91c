// Host launchers of the device-ceiling kernels: plain C++, no torch headers.
// Each launcher enqueues one kernel on `stream` and returns the launch status.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

constexpr int CEILING_THREADS = 256;  // threads per block
constexpr int CEILING_CHAINS = 8;     // independent dependency chains per thread

// blocks * CEILING_THREADS * iterations * CEILING_CHAINS fused multiply-adds (2 FLOP each)
cudaError_t fma_throughput(float* out,  // (blocks * CEILING_THREADS,)
                           int blocks, int iterations, float a, float b, cudaStream_t stream);

// blocks * CEILING_THREADS * iterations * CEILING_CHAINS base-2 exponentials on the MUFU
cudaError_t mufu_ex2_throughput(float* out,  // (blocks * CEILING_THREADS,)
                                int blocks, int iterations, cudaStream_t stream);

// Read n4 float4s of `in` (16-byte aligned); per-thread sums go to `out` (blocks * CEILING_THREADS,)
cudaError_t stream_read(const float* in, int64_t n4, float* out, int blocks, cudaStream_t stream);

// Copy n4 float4s from `in` to `out` (both 16-byte aligned)
cudaError_t stream_copy(const float* in, float* out, int64_t n4, int blocks, cudaStream_t stream);
