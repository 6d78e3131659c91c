// naive: one thread per row, looping over its D elements: the formula written down.
// flaw of naive: neighbouring threads read addresses D floats apart, so every warp-wide
//     load touches 32 cache lines (uncoalesced), and only B threads exist: ceil(B / 256)
//     blocks, 128 at 32768 rows, leave part of an H100's 132 SMs idle. The backward too.
// idea: each thread sums its row's p.t, p.p and t.t, keeps them for the backward and
//     writes 1 - cos (cosine_similarity_loss/cosine.cuh) into row_partials; a second
//     kernel adds the B values in a fixed order and divides by B
//     (common/sum_partials.cuh: deterministic, no float atomicAdd).
// The operator: ladder/naive.cu with its block size a launch knob (the ladder has no knobs).
#include "common/sum_partials.cuh"
#include "cosine_similarity_loss/cosine.cuh"
#include "cosine_similarity_loss/launchers.h"

// Launch knobs (losslab/build/knobs.py): -DLOSSLAB_COSINE_SIMILARITY_LOSS_NAIVE_THREADS=<value> builds another one.
#ifndef LOSSLAB_COSINE_SIMILARITY_LOSS_NAIVE_THREADS
#define LOSSLAB_COSINE_SIMILARITY_LOSS_NAIVE_THREADS 256  // threads per block: 32 64 128 256 512 1024
#endif

namespace {

constexpr int THREADS = LOSSLAB_COSINE_SIMILARITY_LOSS_NAIVE_THREADS;
static_assert(THREADS >= 32 && THREADS <= 1024 && THREADS % 32 == 0,
              "LOSSLAB_COSINE_SIMILARITY_LOSS_NAIVE_THREADS: a multiple of 32 from 32 to 1024 (whole warps)");

__global__ void __launch_bounds__(THREADS) forward_kernel(
    const float* __restrict__ predictions,  // (B, D)
    const float* __restrict__ targets,      // (B, D)
    float* __restrict__ row_dots,           // (3, B): p.t, p.p, t.t of each row
    float* __restrict__ row_partials,       // (B,)
    int64_t B, int64_t D, float eps) {
    const int64_t row = blockIdx.x * int64_t(THREADS) + threadIdx.x;  // this thread's row
    if (row >= B) return;
    const float* p = predictions + row * D;
    const float* t = targets + row * D;
    float pt = 0.0f, pp = 0.0f, tt = 0.0f;
    for (int64_t j = 0; j < D; ++j) {  // lane k + 1 reads D floats away
        const float pj = p[j], tj = t[j];
        pt += pj * tj, pp += pj * pj, tt += tj * tj;
    }
    row_dots[row] = pt, row_dots[B + row] = pp, row_dots[2 * B + row] = tt;
    row_partials[row] = 1.0f - row_cosine(pt, pp, tt, eps, 0.0f).cos;
}

// dL/dp = -grad_loss / B * dcos/dp, from the row's dots: k_other * t + k_p * p.
__global__ void __launch_bounds__(THREADS) backward_kernel(
    const float* __restrict__ predictions,  // (B, D)
    const float* __restrict__ targets,      // (B, D)
    const float* __restrict__ row_dots,     // (3, B)
    const float* __restrict__ grad_loss,    // ()
    float* __restrict__ grad_predictions,   // (B, D)
    int64_t B, int64_t D, float eps) {
    const int64_t row = blockIdx.x * int64_t(THREADS) + threadIdx.x;  // this thread's row
    if (row >= B) return;
    const RowCosine c = row_cosine(row_dots[row], row_dots[B + row], row_dots[2 * B + row], eps,
                                   -*grad_loss / float(B));
    for (int64_t i = row * D; i < (row + 1) * D; ++i)
        grad_predictions[i] = c.k_other * targets[i] + c.k_p * predictions[i];
}

}  // namespace

cudaError_t cosine_similarity_loss_naive_forward(
    const void* predictions, const void* targets, float* row_dots, float* row_partials, void* loss,
    void* /*grad_predictions: not fused*/, void* grad_targets, int64_t B, int64_t D, float eps, DType dtype,
    cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // a teaching rung: float32 only
    if (grad_targets) return cudaErrorInvalidValue;             // and dL/dp only
    const int64_t blocks = (B + THREADS - 1) / THREADS;  // one thread per row
    forward_kernel<<<blocks, THREADS, 0, stream>>>(static_cast<const float*>(predictions),
                                                   static_cast<const float*>(targets), row_dots, row_partials,
                                                   B, D, eps);
    const cudaError_t err = cudaGetLastError();
    return err != cudaSuccess ? err : launch_sum_partials(row_partials, B, float(B), loss, stream);
}

cudaError_t cosine_similarity_loss_naive_backward(
    const void* predictions, const void* targets, const float* row_dots, const void* grad_loss,
    void* grad_predictions, void* grad_targets, int64_t B, int64_t D, float eps, DType dtype,
    cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // a teaching rung: float32 only
    if (grad_targets) return cudaErrorInvalidValue;             // and dL/dp only
    const int64_t blocks = (B + THREADS - 1) / THREADS;  // one thread per row
    backward_kernel<<<blocks, THREADS, 0, stream>>>(static_cast<const float*>(predictions),
                                                    static_cast<const float*>(targets), row_dots,
                                                    static_cast<const float*>(grad_loss),
                                                    static_cast<float*>(grad_predictions), B, D, eps);
    return cudaGetLastError();
}
