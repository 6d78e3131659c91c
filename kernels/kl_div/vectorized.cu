// vectorized: warp_shuffle's structure with 128-bit loads. Each thread issues
// UNROLL float4 loads per tensor before using any of them, so four times the
// bytes per instruction and UNROLL times the loads in flight that scalar loads
// left too few of to saturate HBM. A scalar head and tail handle rows that do
// not start or end on a 16-byte boundary (odd D, or a slice with an offset).
#include "kl_div.cuh"
#include "launchers.h"
#include "../common/reduce.cuh"
#include "../common/sum_partials.cuh"
#include "../common/vector_load.cuh"
#include <algorithm>

constexpr int THREADS = 256;
constexpr int UNROLL = 4;

__device__ __forceinline__ float kl_div_term4(float4 p, float4 t) {
    return kl_div_term(p.x, t.x) + kl_div_term(p.y, t.y) + kl_div_term(p.z, t.z) +
           kl_div_term(p.w, t.w);
}

__global__ void __launch_bounds__(THREADS)
kl_div_vectorized_forward_kernel(const float* __restrict__ predictions,  // (B, D)
                                 const float* __restrict__ targets,      // (B, D)
                                 float* __restrict__ row_partials,       // (B,)
                                 int64_t D) {
    const float* p = predictions + blockIdx.x * D;
    const float* t = targets + blockIdx.x * D;
    // Vector loads need both rows at the same offset from a 16-byte boundary;
    // otherwise the whole row goes through the scalar tail loop.
    int64_t head = 0, body4 = 0;
    if (reinterpret_cast<uintptr_t>(p) % 16 == reinterpret_cast<uintptr_t>(t) % 16) {
        head = min(D, int64_t(floats_to_alignment(p)));
        body4 = (D - head) / 4;
    }
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < head; j += THREADS) sum += kl_div_term(p[j], t[j]);

    const float* pv = p + head;
    const float* tv = t + head;
    int64_t i = threadIdx.x;
    for (; i + (UNROLL - 1) * THREADS < body4; i += UNROLL * THREADS) {
        float4 pb[UNROLL], tb[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            pb[u] = load_float4(pv + 4 * (i + u * THREADS));
            tb[u] = load_float4(tv + 4 * (i + u * THREADS));
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) sum += kl_div_term4(pb[u], tb[u]);
    }
    for (; i < body4; i += THREADS) sum += kl_div_term4(load_float4(pv + 4 * i), load_float4(tv + 4 * i));

    for (int64_t j = head + 4 * body4 + threadIdx.x; j < D; j += THREADS)
        sum += kl_div_term(p[j], t[j]);

    sum = block_reduce_sum(sum);
    if (threadIdx.x == 0) row_partials[blockIdx.x] = sum;
}

// Element-wise gradient, one float4 of each tensor per thread. Used when all
// three tensors are 16-byte aligned; the scalar tail covers n % 4.
__global__ void __launch_bounds__(THREADS)
kl_div_vectorized_backward_kernel(const float* __restrict__ predictions,  // (B, D)
                                  const float* __restrict__ targets,      // (B, D)
                                  const float* __restrict__ grad_loss,    // ()
                                  float* __restrict__ grad_predictions,   // (B, D)
                                  int64_t n, float B) {
    const float scaled_grad = *grad_loss / B;
    const int64_t i = blockIdx.x * int64_t(THREADS) + threadIdx.x;
    if (i < n / 4) {
        const float4 p = load_float4(predictions + 4 * i);
        const float4 t = load_float4(targets + 4 * i);
        store_float4(grad_predictions + 4 * i,
                     make_float4(kl_div_grad(p.x, t.x, scaled_grad), kl_div_grad(p.y, t.y, scaled_grad),
                                 kl_div_grad(p.z, t.z, scaled_grad), kl_div_grad(p.w, t.w, scaled_grad)));
    }
    const int64_t tail = n / 4 * 4 + i;  // the first n % 4 threads finish the tail
    if (tail < n) grad_predictions[tail] = kl_div_grad(predictions[tail], targets[tail], scaled_grad);
}

cudaError_t kl_div_vectorized_forward(const float* predictions, const float* targets,
                                      float* row_partials, float* loss, int64_t B, int64_t D,
                                      cudaStream_t stream) {
    kl_div_vectorized_forward_kernel<<<B, THREADS, 0, stream>>>(predictions, targets,
                                                                row_partials, D);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    return launch_sum_partials(row_partials, B, float(B), loss, stream);
}

cudaError_t kl_div_vectorized_backward(const float* predictions, const float* targets,
                                       const float* grad_loss, float* grad_predictions,
                                       int64_t B, int64_t D, cudaStream_t stream) {
    if (!is_aligned_16(predictions) || !is_aligned_16(targets) || !is_aligned_16(grad_predictions))
        return kl_div_shared_memory_backward(predictions, targets, grad_loss, grad_predictions,
                                             B, D, stream);
    const int64_t n = B * D;
    const int64_t blocks = (n / 4 + THREADS) / THREADS;  // at least one block for the tail
    kl_div_vectorized_backward_kernel<<<blocks, THREADS, 0, stream>>>(
        predictions, targets, grad_loss, grad_predictions, n, float(B));
    return cudaGetLastError();
}
