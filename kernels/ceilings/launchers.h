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

// Blocks the streaming kernels launch for n4 float4s (one per 64 KiB chunk of each half).
int stream_blocks(int64_t n4);

// Read n4 (even) float4s of `in` (16-byte aligned) as two streams, its two
// halves, `unroll` (4 or 8) loads of each in flight per thread; per-thread sums go to `out`
// (stream_blocks(n4) * CEILING_THREADS,)
cudaError_t stream_read(const float* in, int64_t n4, float* out, int unroll, cudaStream_t stream);
