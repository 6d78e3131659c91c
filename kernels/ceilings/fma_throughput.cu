// Device ceilings: the peak rate of FP32 fused multiply-adds (the compute roof
// of the roofline) and of the special-function unit (MUFU: exp2, log2, ...),
// each measured by a kernel that does nothing else.
//
// Every thread runs CEILING_CHAINS independent chains x = x * a + b. Inside a
// chain each FMA waits for the previous one (a few cycles of latency); across
// the chains of a thread and the many warps of an SM the scheduler always finds
// an independent FMA to issue, so the FMA pipes stay full. The loop is unrolled
// so that loop bookkeeping takes almost no issue slots. `a` and `b` are kernel
// arguments and every chain's result is stored, so the compiler can neither
// fold the chains nor drop them: the SASS is a long run of FFMA.
#include "launchers.h"

constexpr int UNROLL = 16;  // iterations per trip of the loop

__global__ void __launch_bounds__(CEILING_THREADS)
fma_throughput_kernel(float* __restrict__ out,  // (gridDim.x * blockDim.x,)
                      int iterations, float a, float b) {
    float x[CEILING_CHAINS];
#pragma unroll
    for (int c = 0; c < CEILING_CHAINS; ++c) x[c] = float(threadIdx.x + c);
#pragma unroll UNROLL
    for (int i = 0; i < iterations; ++i) {
#pragma unroll
        for (int c = 0; c < CEILING_CHAINS; ++c) x[c] = fmaf(x[c], a, b);
    }
    float sum = 0.0f;
#pragma unroll
    for (int c = 0; c < CEILING_CHAINS; ++c) sum += x[c];
    out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
}

// The same pattern with x = 2^(-x) (one MUFU.EX2 each; the chain settles near
// 0.64, so it never overflows).
__device__ __forceinline__ float ex2_negated(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(-x));
    return y;
}

__global__ void __launch_bounds__(CEILING_THREADS)
mufu_ex2_throughput_kernel(float* __restrict__ out,  // (gridDim.x * blockDim.x,)
                           int iterations) {
    float x[CEILING_CHAINS];
#pragma unroll
    for (int c = 0; c < CEILING_CHAINS; ++c) x[c] = float(threadIdx.x + c) * 1e-3f;
#pragma unroll UNROLL
    for (int i = 0; i < iterations; ++i) {
#pragma unroll
        for (int c = 0; c < CEILING_CHAINS; ++c) x[c] = ex2_negated(x[c]);
    }
    float sum = 0.0f;
#pragma unroll
    for (int c = 0; c < CEILING_CHAINS; ++c) sum += x[c];
    out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
}

cudaError_t fma_throughput(float* out, int blocks, int iterations, float a, float b,
                           cudaStream_t stream) {
    fma_throughput_kernel<<<blocks, CEILING_THREADS, 0, stream>>>(out, iterations, a, b);
    return cudaGetLastError();
}

cudaError_t mufu_ex2_throughput(float* out, int blocks, int iterations, cudaStream_t stream) {
    mufu_ex2_throughput_kernel<<<blocks, CEILING_THREADS, 0, stream>>>(out, iterations);
    return cudaGetLastError();
}
