// Device ceilings: the peak DRAM bandwidth of reading, and of copying, with
// nothing else in the way. torch.sum and Tensor.copy_ are library kernels
// tuned for many shapes; these do only the streaming, so a loss kernel cannot
// beat the ceiling they measure. Each thread keeps STREAM_UNROLL 16-byte loads
// in flight in a grid-stride loop over float4s.
#include "launchers.h"

constexpr int STREAM_UNROLL = 4;

__global__ void __launch_bounds__(CEILING_THREADS)
stream_read_kernel(const float4* __restrict__ in,  // (n4,)
                   int64_t n4, float* __restrict__ out) {  // (gridDim.x * blockDim.x,)
    const int64_t stride = int64_t(gridDim.x) * CEILING_THREADS;
    int64_t i = blockIdx.x * int64_t(CEILING_THREADS) + threadIdx.x;
    float sum = 0.0f;
    for (; i + (STREAM_UNROLL - 1) * stride < n4; i += STREAM_UNROLL * stride) {
        float4 v[STREAM_UNROLL];
#pragma unroll
        for (int u = 0; u < STREAM_UNROLL; ++u) v[u] = in[i + u * stride];
#pragma unroll
        for (int u = 0; u < STREAM_UNROLL; ++u) sum += (v[u].x + v[u].y) + (v[u].z + v[u].w);
    }
    for (; i < n4; i += stride) sum += in[i].x + in[i].y + in[i].z + in[i].w;
    out[blockIdx.x * CEILING_THREADS + threadIdx.x] = sum;  // keeps the loads alive
}

__global__ void __launch_bounds__(CEILING_THREADS)
stream_copy_kernel(const float4* __restrict__ in,  // (n4,)
                   float4* __restrict__ out,       // (n4,)
                   int64_t n4) {
    const int64_t stride = int64_t(gridDim.x) * CEILING_THREADS;
    int64_t i = blockIdx.x * int64_t(CEILING_THREADS) + threadIdx.x;
    for (; i + (STREAM_UNROLL - 1) * stride < n4; i += STREAM_UNROLL * stride) {
        float4 v[STREAM_UNROLL];
#pragma unroll
        for (int u = 0; u < STREAM_UNROLL; ++u) v[u] = in[i + u * stride];
#pragma unroll
        for (int u = 0; u < STREAM_UNROLL; ++u) out[i + u * stride] = v[u];
    }
    for (; i < n4; i += stride) out[i] = in[i];
}

cudaError_t stream_read(const float* in, int64_t n4, float* out, int blocks, cudaStream_t stream) {
    stream_read_kernel<<<blocks, CEILING_THREADS, 0, stream>>>(reinterpret_cast<const float4*>(in), n4, out);
    return cudaGetLastError();
}

cudaError_t stream_copy(const float* in, float* out, int64_t n4, int blocks, cudaStream_t stream) {
    stream_copy_kernel<<<blocks, CEILING_THREADS, 0, stream>>>(reinterpret_cast<const float4*>(in),
                                                               reinterpret_cast<float4*>(out), n4);
    return cudaGetLastError();
}
