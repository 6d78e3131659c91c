// Device ceilings: the peak DRAM bandwidth of reading, and of copying, with
// nothing else in the way. torch.sum and Tensor.copy_ are library kernels
// tuned for many shapes; these only stream, in the pattern the loss kernels
// use (one block per contiguous 64 KiB chunk, 16-byte loads, UNROLL of them
// in flight per thread); the caller takes the best of several UNROLL, so that
// no loss kernel beats the ceiling they measure.
#include "launchers.h"

constexpr int64_t CHUNK4 = 4096;  // float4s per block: 64 KiB

template <int UNROLL>
__global__ void __launch_bounds__(CEILING_THREADS)
stream_read_kernel(const float4* __restrict__ in,  // (n4,)
                   int64_t n4, float* __restrict__ out) {  // (gridDim.x * blockDim.x,)
    const int64_t begin = blockIdx.x * CHUNK4;
    const int64_t end = min(begin + CHUNK4, n4);
    int64_t i = begin + threadIdx.x;
    float sum = 0.0f;
    for (; i + (UNROLL - 1) * CEILING_THREADS < end; i += UNROLL * CEILING_THREADS) {
        float4 v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) v[u] = in[i + u * CEILING_THREADS];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) sum += (v[u].x + v[u].y) + (v[u].z + v[u].w);
    }
    for (; i < end; i += CEILING_THREADS) sum += in[i].x + in[i].y + in[i].z + in[i].w;
    out[blockIdx.x * CEILING_THREADS + threadIdx.x] = sum;  // keeps the loads alive
}

template <int UNROLL>
__global__ void __launch_bounds__(CEILING_THREADS)
stream_copy_kernel(const float4* __restrict__ in,  // (n4,)
                   float4* __restrict__ out,       // (n4,)
                   int64_t n4) {
    const int64_t begin = blockIdx.x * CHUNK4;
    const int64_t end = min(begin + CHUNK4, n4);
    int64_t i = begin + threadIdx.x;
    for (; i + (UNROLL - 1) * CEILING_THREADS < end; i += UNROLL * CEILING_THREADS) {
        float4 v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) v[u] = in[i + u * CEILING_THREADS];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) out[i + u * CEILING_THREADS] = v[u];
    }
    for (; i < end; i += CEILING_THREADS) out[i] = in[i];
}

int stream_blocks(int64_t n4) { return int((n4 + CHUNK4 - 1) / CHUNK4); }

cudaError_t stream_read(const float* in, int64_t n4, float* out, int unroll, cudaStream_t stream) {
    const auto* in4 = reinterpret_cast<const float4*>(in);
    const int blocks = stream_blocks(n4);
    switch (unroll) {
        case 4: stream_read_kernel<4><<<blocks, CEILING_THREADS, 0, stream>>>(in4, n4, out); break;
        case 8: stream_read_kernel<8><<<blocks, CEILING_THREADS, 0, stream>>>(in4, n4, out); break;
        case 16: stream_read_kernel<16><<<blocks, CEILING_THREADS, 0, stream>>>(in4, n4, out); break;
        default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

cudaError_t stream_copy(const float* in, float* out, int64_t n4, int unroll, cudaStream_t stream) {
    const auto* in4 = reinterpret_cast<const float4*>(in);
    auto* out4 = reinterpret_cast<float4*>(out);
    const int blocks = stream_blocks(n4);
    switch (unroll) {
        case 4: stream_copy_kernel<4><<<blocks, CEILING_THREADS, 0, stream>>>(in4, out4, n4); break;
        case 8: stream_copy_kernel<8><<<blocks, CEILING_THREADS, 0, stream>>>(in4, out4, n4); break;
        case 16: stream_copy_kernel<16><<<blocks, CEILING_THREADS, 0, stream>>>(in4, out4, n4); break;
        default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}
