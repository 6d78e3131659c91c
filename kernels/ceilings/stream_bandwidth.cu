// Device ceiling: the peak DRAM read bandwidth, with nothing else in the way.
// torch.sum is a library kernel tuned for many shapes; this one only streams,
// in the pattern the loss kernels use (one block per contiguous 64 KiB chunk
// of each input, 16-byte loads, UNROLL of them in flight per thread); the
// caller takes the best of torch.sum and each UNROLL, so that no loss kernel
// beats the ceiling it measures.
#include "launchers.h"

constexpr int64_t CHUNK4 = 4096;  // float4s per block: 64 KiB

__device__ __forceinline__ float sum4(float4 v) { return (v.x + v.y) + (v.z + v.w); }

// Each block streams one 64 KiB chunk of the first half of the buffer and the
// matching chunk of the second half at once: two address streams, as a loss
// kernel reading predictions and targets has (seen on an H200: one stream read
// at 4.1 TB/s, two at 4.4).
template <int UNROLL>
__global__ void __launch_bounds__(CEILING_THREADS)
stream_read_kernel(const float4* __restrict__ in,  // (2 * half4,)
                   int64_t half4, float* __restrict__ out) {  // (gridDim.x * blockDim.x,)
    const int64_t begin = blockIdx.x * CHUNK4;
    const int64_t end = min(begin + CHUNK4, half4);
    const float4* a = in;
    const float4* b = in + half4;
    int64_t i = begin + threadIdx.x;
    float sum = 0.0f;
    for (; i + (UNROLL - 1) * CEILING_THREADS < end; i += UNROLL * CEILING_THREADS) {
        float4 va[UNROLL], vb[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            va[u] = a[i + u * CEILING_THREADS];
            vb[u] = b[i + u * CEILING_THREADS];
        }
        // every component is used: otherwise nvcc narrows each 16-byte load to the 8 bytes it needs
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) sum += sum4(va[u]) + sum4(vb[u]);
    }
    for (; i < end; i += CEILING_THREADS) sum += sum4(a[i]) + sum4(b[i]);
    out[blockIdx.x * CEILING_THREADS + threadIdx.x] = sum;  // keeps the loads alive
}

int stream_blocks(int64_t n4) { return int((n4 / 2 + CHUNK4 - 1) / CHUNK4); }

cudaError_t stream_read(const float* in, int64_t n4, float* out, int unroll, cudaStream_t stream) {
    if (n4 % 2) return cudaErrorInvalidValue;  // two equal halves
    const auto* in4 = reinterpret_cast<const float4*>(in);
    const int blocks = stream_blocks(n4);
    switch (unroll) {
        case 4: stream_read_kernel<4><<<blocks, CEILING_THREADS, 0, stream>>>(in4, n4 / 2, out); break;
        case 8: stream_read_kernel<8><<<blocks, CEILING_THREADS, 0, stream>>>(in4, n4 / 2, out); break;
        default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}
