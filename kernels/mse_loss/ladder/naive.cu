// naive: one thread per row of the (B, D) view, looping over its D elements: the mean written down.
// flaw of naive: an elementwise mean has no rows of its own; taking KernelBench's rows as
//     each thread's share, neighbouring threads read addresses D floats apart, so every
//     warp-wide load touches 32 cache lines (uncoalesced), and only B threads exist:
//     ceil(B / 256) blocks, 128 at 32768 rows, barely one per SM of an H100. The backward too.
// idea: each thread sums its row's mse_loss_term (mse_loss/mse_loss.cuh) into row_partials;
//     a second kernel adds the B sums in a fixed order and divides by B D
//     (common/sum_partials.cuh: deterministic, no float atomicAdd).
#include "common/sum_partials.cuh"
#include "mse_loss/mse_loss.cuh"
#include "mse_loss/ladder/ladder.h"

namespace {

constexpr int THREADS = 256;

__global__ void __launch_bounds__(THREADS) forward_kernel(
    const float* __restrict__ predictions,  // (B, D)
    const float* __restrict__ targets,      // (B, D)
    float* __restrict__ row_partials,       // (B,)
    int64_t B, int64_t D) {
    const int64_t row = blockIdx.x * int64_t(THREADS) + threadIdx.x;  // this thread's row
    if (row >= B) return;
    const float* p = predictions + row * D;
    const float* t = targets + row * D;
    // in double: D float32 additions in a row drift by about sqrt(D) ulps, and KernelBench's heavy-tailed
    // inputs push a 32768-term row's sum past the 1e-5 check (the rungs above add D / 256 terms each, then a tree)
    double sum = 0.0;
    for (int64_t j = 0; j < D; ++j) sum += mse_loss_term(p[j], t[j]);  // lane k + 1 reads D floats away
    row_partials[row] = float(sum);
}

__global__ void __launch_bounds__(THREADS) backward_kernel(
    const float* __restrict__ predictions,  // (B, D)
    const float* __restrict__ targets,      // (B, D)
    const float* __restrict__ grad_loss,    // ()
    float* __restrict__ grad_predictions,   // (B, D)
    int64_t B, int64_t D) {
    const float scaled_grad = 2.0f * *grad_loss / (float(B) * float(D));
    const int64_t row = blockIdx.x * int64_t(THREADS) + threadIdx.x;  // this thread's row
    if (row >= B) return;
    for (int64_t i = row * D; i < (row + 1) * D; ++i)
        grad_predictions[i] = mse_loss_grad(predictions[i], targets[i], scaled_grad);
}

}  // namespace

cudaError_t mse_loss_naive_forward(
    const void* predictions,  // (B, D)
    const void* targets,      // (B, D)
    float* row_partials,      // (B + 4,): each row's sum in the first B
    void* loss,               // (): the sum of the rows / (B D)
    void* grad_predictions,   // (B, D): unused (only fused writes the gradient in the forward)
    int64_t B, int64_t D, DType dtype, cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // a teaching rung: float32 only
    const int64_t blocks = (B + THREADS - 1) / THREADS;  // one thread per row
    forward_kernel<<<blocks, THREADS, 0, stream>>>(static_cast<const float*>(predictions),
                                                   static_cast<const float*>(targets), row_partials, B, D);
    const cudaError_t err = cudaGetLastError();
    return err != cudaSuccess ? err : launch_sum_partials(row_partials, B, float(B) * float(D), loss, stream);
}

cudaError_t mse_loss_naive_backward(
    const void* predictions,  // (B, D)
    const void* targets,      // (B, D)
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
