// naive: one thread per row, looping over its D elements: the formula written down.
// flaw of naive: neighbouring threads read predictions D floats apart, so every warp-wide
//     load touches 32 cache lines (uncoalesced), and only B threads exist: ceil(B / 256)
//     blocks, 128 at 32768 rows, leave SMs idle and too few loads in flight. The backward too.
// idea: each thread sums its row's max(1 - p * t, 0) (hinge_loss/hinge_loss.cuh) into
//     partials; a second kernel adds the B sums in a fixed order and divides by B * D
//     (common/sum_partials.cuh: deterministic, no float atomicAdd). All threads read the
//     same t[j] at once: one broadcast load, the only coalesced one.
#include "common/sum_partials.cuh"
#include "hinge_loss/hinge_loss.cuh"
#include "hinge_loss/ladder/ladder.h"

namespace {

constexpr int THREADS = 256;

__global__ void __launch_bounds__(THREADS) forward_kernel(
    const float* __restrict__ predictions,  // (B, D)
    const float* __restrict__ targets,      // (D,)
    float* __restrict__ partials,           // (B,)
    int64_t B, int64_t D) {
    const int64_t row = blockIdx.x * int64_t(THREADS) + threadIdx.x;  // this thread's row
    if (row >= B) return;
    const float* p = predictions + row * D;
    float sum = 0.0f;
    for (int64_t j = 0; j < D; ++j) sum += hinge_term(hinge_margin(p[j], targets[j]));  // lane k + 1: D floats away
    partials[row] = sum;
}

__global__ void __launch_bounds__(THREADS) backward_kernel(
    const float* __restrict__ predictions,  // (B, D)
    const float* __restrict__ targets,      // (D,)
    const float* __restrict__ grad_loss,    // ()
    float* __restrict__ grad_predictions,   // (B, D)
    int64_t B, int64_t D) {
    const float scaled_grad = *grad_loss / (float(B) * float(D));
    const int64_t row = blockIdx.x * int64_t(THREADS) + threadIdx.x;  // this thread's row
    if (row >= B) return;
    for (int64_t j = 0; j < D; ++j)
        grad_predictions[row * D + j] = hinge_grad(hinge_margin(predictions[row * D + j], targets[j]), targets[j],
                                                   scaled_grad);
}

}  // namespace

cudaError_t hinge_loss_naive_forward(
    const void* predictions,  // (B, D)
    const void* targets,      // (D,)
    float* partials,          // (max(B, 1024) + 4,): each row's sum in the first B
    void* loss,               // (): the sum of the rows / (B * D)
    void* grad_predictions,   // (B, D): unused (only fused writes the gradient in the forward)
    int64_t B, int64_t D, DType dtype, cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // a teaching rung: float32 only
    const int64_t blocks = (B + THREADS - 1) / THREADS;  // one thread per row
    forward_kernel<<<blocks, THREADS, 0, stream>>>(static_cast<const float*>(predictions),
                                                   static_cast<const float*>(targets), partials, B, D);
    const cudaError_t err = cudaGetLastError();
    return err != cudaSuccess ? err : launch_sum_partials(partials, B, float(B) * float(D), loss, stream);
}

cudaError_t hinge_loss_naive_backward(
    const void* predictions,  // (B, D)
    const void* targets,      // (D,)
    const void* grad_loss,    // ()
    void* grad_predictions,   // (B, D): written
    int64_t B, int64_t D, DType dtype, cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // a teaching rung: float32 only
    const int64_t blocks = (B + THREADS - 1) / THREADS;  // one thread per row
    backward_kernel<<<blocks, THREADS, 0, stream>>>(static_cast<const float*>(predictions),
                                                    static_cast<const float*>(targets),
                                                    static_cast<const float*>(grad_loss),
                                                    static_cast<float*>(grad_predictions), B, D);
    return cudaGetLastError();
}
