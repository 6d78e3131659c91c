// A wrong answer to the vectorize exercise, test data for tests/test_simulator.py:
// every thread adds the whole tail.
#include "kl_div/kl_div.cuh"
#include "common/reduce.cuh"
#include "common/sum_partials.cuh"
#include "common/vector_load.cuh"
#include "kl_div/launchers.h"

constexpr int THREADS = 256;

__global__ void __launch_bounds__(THREADS)
vector_forward_kernel(const float* __restrict__ predictions,  // (B, D)
                      const float* __restrict__ targets,      // (B, D)
                      float* __restrict__ row_partials,       // (B,)
                      int64_t D) {
    const float* p = predictions + blockIdx.x * D;  // this block's row
    const float* t = targets + blockIdx.x * D;
    int64_t head = D;
    if (floats_to_alignment(p) == floats_to_alignment(t))
        head = min(D, int64_t(floats_to_alignment(p)));
    const int64_t packs = (D - head) / 4;  // float4s after the head
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < head; j += THREADS)
        sum += kl_div_term(p[j], t[j]);

    for (int64_t i = threadIdx.x; i < packs; i += THREADS) {
        const float4 pv = load_float4(p + head + 4 * i), tv = load_float4(t + head + 4 * i);
        sum += kl_div_term(pv.x, tv.x) + kl_div_term(pv.y, tv.y) + kl_div_term(pv.z, tv.z) + kl_div_term(pv.w, tv.w);
    }
    for (int64_t j = head + 4 * packs; j < D; ++j)
        sum += kl_div_term(p[j], t[j]);

    sum = block_reduce_sum(sum);
    if (threadIdx.x == 0) row_partials[blockIdx.x] = sum;
}

cudaError_t kl_div_custom_forward(const void* predictions_, const void* targets_, float* row_partials,
                                  void* loss, void* /*grad_predictions: not fused*/, int64_t B, int64_t D,
                                  DType dtype, cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // float32 only
    const float* predictions = static_cast<const float*>(predictions_);
    const float* targets = static_cast<const float*>(targets_);
    vector_forward_kernel<<<B, THREADS, 0, stream>>>(predictions, targets, row_partials, D);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    return launch_sum_partials(row_partials, B, float(B), loss, stream);
}
