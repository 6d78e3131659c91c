// A wrong answer to the smooth_l1_vectorize exercise, test data for tests/test_exercises.py:
// every thread adds the whole tail.
//
// A scalar load moves 4 bytes per instruction; a float4 load moves 16 (one
// LDG.E.128), so a warp keeps four times the bytes in flight. A float4 load is
// legal only on a 16-byte aligned address, and a row of D floats need not
// start or end on one (D odd, or a slice with a storage offset). So a row is
// read in three parts:
//   head:  the first elements, up to the first 16-byte boundary (written for you);
//   packs: the float4s after the head, shared by the block's threads;
//   tail:  the last D - head - 4 * packs elements, one float each.
// When p and t sit at different offsets from a boundary, no float4 fits both:
// head is then the whole row (written for you). The block reduction is
// common/reduce.cuh's warp-shuffle block_reduce_sum.
#include "smooth_l1_loss/smooth_l1_loss.cuh"
#include "common/reduce.cuh"
#include "common/sum_partials.cuh"
#include "common/vector_load.cuh"
#include "smooth_l1_loss/launchers.h"

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
        sum += smooth_l1_term(p[j], t[j]);

    for (int64_t i = threadIdx.x; i < packs; i += THREADS) {
        const float4 pv = load_float4(p + head + 4 * i), tv = load_float4(t + head + 4 * i);
        sum += smooth_l1_term(pv.x, tv.x) + smooth_l1_term(pv.y, tv.y) + smooth_l1_term(pv.z, tv.z) +
               smooth_l1_term(pv.w, tv.w);
    }
    for (int64_t j = head + 4 * packs; j < D; ++j)
        sum += smooth_l1_term(p[j], t[j]);

    sum = block_reduce_sum(sum);
    if (threadIdx.x == 0) row_partials[blockIdx.x] = sum;
}

cudaError_t smooth_l1_loss_custom_forward(const void* predictions_, const void* targets_, float* row_partials,
                                          void* loss, void* /*grad_predictions: not fused*/, int64_t B, int64_t D,
                                          DType dtype, cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // float32 only
    const float* predictions = static_cast<const float*>(predictions_);
    const float* targets = static_cast<const float*>(targets_);
    vector_forward_kernel<<<B, THREADS, 0, stream>>>(predictions, targets, row_partials, D);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    return launch_sum_partials(row_partials, B, float(B) * float(D), loss, stream);  // the mean over B D
}
