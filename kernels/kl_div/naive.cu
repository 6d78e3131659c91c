// naive: one thread per row, looping over the row -- the formula written down
// directly. Its flaw: neighbouring threads read addresses D floats apart, so
// every warp-wide load touches 32 different cache lines (uncoalesced), and
// only B threads exist to hide memory latency.
#include "common/sum_partials.cuh"
#include "kl_div/kl_div.cuh"
#include "kl_div/launchers.h"

// Launch knobs (losslab/build/knobs.py): -DLOSSLAB_KL_DIV_NAIVE_<KNOB>=<value> builds another one.
#ifndef LOSSLAB_KL_DIV_NAIVE_THREADS
#define LOSSLAB_KL_DIV_NAIVE_THREADS 256  // threads per block: 32 64 128 256 512 1024
#endif
constexpr int THREADS = LOSSLAB_KL_DIV_NAIVE_THREADS;
static_assert(THREADS >= 32 && THREADS <= 1024 && THREADS % 32 == 0,
              "LOSSLAB_KL_DIV_NAIVE_THREADS: a multiple of 32 from 32 to 1024 (whole warps)");

__global__ void kl_div_naive_forward_kernel(const float* __restrict__ predictions,  // (B, D)
                                            const float* __restrict__ targets,      // (B, D)
                                            float* __restrict__ row_partials,       // (B,)
                                            int64_t B, int64_t D) {
    const int64_t row = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
    if (row >= B) return;
    float sum = 0.0f;
    for (int64_t j = 0; j < D; ++j)
        sum += kl_div_term(predictions[row * D + j], targets[row * D + j]);
    row_partials[row] = sum;
}

__global__ void kl_div_naive_backward_kernel(const float* __restrict__ predictions,  // (B, D)
                                             const float* __restrict__ targets,      // (B, D)
                                             const float* __restrict__ grad_loss,    // ()
                                             float* __restrict__ grad_predictions,   // (B, D)
                                             int64_t B, int64_t D) {
    const int64_t row = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
    if (row >= B) return;
    const float scaled_grad = *grad_loss / float(B);
    for (int64_t j = 0; j < D; ++j) {
        const int64_t i = row * D + j;
        grad_predictions[i] = kl_div_grad(predictions[i], targets[i], scaled_grad);
    }
}

cudaError_t kl_div_naive_forward(const void* predictions, const void* targets, float* row_partials, void* loss,
                                 void* /*grad_predictions: not fused*/, int64_t B, int64_t D, DType dtype,
                                 cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // a teaching rung: float32 only
    const int64_t blocks = (B + THREADS - 1) / THREADS;
    kl_div_naive_forward_kernel<<<blocks, THREADS, 0, stream>>>(static_cast<const float*>(predictions),
                                                                static_cast<const float*>(targets),
                                                                row_partials, B, D);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    return launch_sum_partials(row_partials, B, float(B), loss, stream);
}

cudaError_t kl_div_naive_backward(const void* predictions, const void* targets, const void* grad_loss,
                                  void* grad_predictions, int64_t B, int64_t D, DType dtype, cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // a teaching rung: float32 only
    const int64_t blocks = (B + THREADS - 1) / THREADS;
    kl_div_naive_backward_kernel<<<blocks, THREADS, 0, stream>>>(
        static_cast<const float*>(predictions), static_cast<const float*>(targets),
        static_cast<const float*>(grad_loss), static_cast<float*>(grad_predictions), B, D);
    return cudaGetLastError();
}
