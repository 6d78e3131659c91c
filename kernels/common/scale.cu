// data *= *scale, in place, with 16-byte packs where the buffer allows them (a
// buffer the forward allocated always does). Every thread reads the scale
// first: when it is exactly 1 (loss.backward()) the forward's gradient is
// already final and no byte is moved.
#include <algorithm>
#include "common/dispatch.cuh"
#include "common/scale.cuh"
#include "common/vector_load.cuh"

constexpr int SCALE_THREADS = 256;
// About one wave of blocks on an H100/H200 (132 SMs x 8 blocks of 256 threads),
// grid-stride: enough to stream the buffer when the scale is not 1, and few to
// retire when it is 1 and every thread leaves at once.
constexpr int64_t SCALE_MAX_BLOCKS = 1024;

template <typename T>
__global__ void __launch_bounds__(SCALE_THREADS)
scale_in_place_kernel(T* __restrict__ data,            // (n,)
                      const T* __restrict__ scale,  // ()
                      int64_t n) {
    constexpr int V = Pack<T>::size;
    const float s = to_float(*scale);
    if (s == 1.0f) return;
    const int64_t stride = int64_t(gridDim.x) * SCALE_THREADS;
    const int64_t first = blockIdx.x * int64_t(SCALE_THREADS) + threadIdx.x;
    const int64_t packs = is_aligned_16(data) ? n / V : 0;
    for (int64_t i = first; i < packs; i += stride) {
        Pack<T> g = load_pack(data + V * i);
#pragma unroll
        for (int k = 0; k < V; ++k) g.set(k, g[k] * s);
        store_pack(data + V * i, g);
    }
    for (int64_t i = packs * V + first; i < n; i += stride) data[i] = from_float<T>(to_float(data[i]) * s);
}

cudaError_t scale_in_place(void* data, const void* scale, int64_t n, DType dtype, cudaStream_t stream) {
    return dispatch_dtype(dtype, [&](auto tag) {
        using T = decltype(tag);
        const int64_t blocks = std::min<int64_t>((n / Pack<T>::size + SCALE_THREADS) / SCALE_THREADS,
                                                 SCALE_MAX_BLOCKS);
        scale_in_place_kernel<T><<<blocks, SCALE_THREADS, 0, stream>>>(static_cast<T*>(data),
                                                                        static_cast<const T*>(scale), n);
        return cudaGetLastError();
    });
}
