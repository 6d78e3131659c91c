// naive: one thread per row, looping over its D elements of the anchor, the positive and the
// negative for the row's two squared distances (triplet.cuh); the backward likewise, once for the
// distances and once for the gradient. The formula written down, and its flaw: neighbouring
// threads read addresses D floats apart, so every warp-wide load touches 32 cache lines
// (uncoalesced), and N threads are too few to fill the GPU.
#include "common/sum_partials.cuh"
#include "triplet_margin_loss/ladder/ladder.h"
#include "triplet_margin_loss/triplet.cuh"

namespace {

constexpr int THREADS = 256;

// One thread adds all D terms in turn, in double: a float32 sum drifts by up to D/2 ulps (2.7e-6 in
// the gradient on 1000 equal terms, past the 1e-6 check; the rungs above add D / THREADS terms each,
// then a tree). The doubles' adds hide behind the uncoalesced loads.
struct RowSquares {
    double ap = 0.0, an = 0.0;
    __device__ Squares rounded() const { return Squares{float(ap), float(an)}; }
};

__device__ __forceinline__ void add_squares(RowSquares& s, float a, float p, float n) {
    const double ap = a - p + TRIPLET_EPS, an = a - n + TRIPLET_EPS;
    s.ap += ap * ap, s.an += an * an;
}

// --- forward: each row's loss; then launch_sum_partials adds them in a fixed order ---

__global__ void __launch_bounds__(THREADS)
forward_kernel(const float* __restrict__ anchor,    // (N, D)
               const float* __restrict__ positive,  // (N, D)
               const float* __restrict__ negative,  // (N, D)
               float* __restrict__ row_losses,      // (N,) written: each row's loss
               int64_t N, int64_t D) {
    const int64_t row = blockIdx.x * int64_t(THREADS) + threadIdx.x;  // one thread per row
    if (row >= N) return;
    const float *a = anchor + row * D, *p = positive + row * D, *n = negative + row * D;
    RowSquares s;
    for (int64_t j = 0; j < D; ++j) add_squares(s, a[j], p[j], n[j]);
    row_losses[row] = triplet_row_loss(s.rounded());
}

// --- backward: dL/da = (u / d(a, p) - v / d(a, n)) * grad_loss / N on the rows with a loss ---

__global__ void __launch_bounds__(THREADS)
backward_kernel(const float* __restrict__ anchor,     // (N, D)
                const float* __restrict__ positive,   // (N, D)
                const float* __restrict__ negative,   // (N, D)
                const float* __restrict__ grad_loss,  // ()
                float* __restrict__ grad_anchor,      // (N, D) written
                int64_t N, int64_t D) {
    const int64_t row = blockIdx.x * int64_t(THREADS) + threadIdx.x;  // one thread per row
    if (row >= N) return;
    const float *a = anchor + row * D, *p = positive + row * D, *n = negative + row * D;
    float* g = grad_anchor + row * D;
    RowSquares s;
    for (int64_t j = 0; j < D; ++j) add_squares(s, a[j], p[j], n[j]);
    const Coefficients c = triplet_coefficients(s.rounded(), *grad_loss / float(N));
    for (int64_t j = 0; j < D; ++j) g[j] = triplet_grad(a[j], p[j], n[j], c);
}

}  // namespace

// --- the launchers (launchers.h) ---

cudaError_t triplet_margin_loss_naive_forward(
    const void* anchor, const void* positive, const void* negative, float* row_losses, void* loss,
    void* /*grad_anchor*/, int64_t N, int64_t D, DType dtype, cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // float32 only
    forward_kernel<<<(N + THREADS - 1) / THREADS, THREADS, 0, stream>>>(
        static_cast<const float*>(anchor), static_cast<const float*>(positive), static_cast<const float*>(negative),
        row_losses, N, D);
    const cudaError_t err = cudaGetLastError();
    return err != cudaSuccess ? err : launch_sum_partials(row_losses, N, float(N), loss, stream);
}

cudaError_t triplet_margin_loss_naive_backward(
    const void* anchor, const void* positive, const void* negative, const void* grad_loss, void* grad_anchor,
    int64_t N, int64_t D, DType dtype, cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // float32 only
    backward_kernel<<<(N + THREADS - 1) / THREADS, THREADS, 0, stream>>>(
        static_cast<const float*>(anchor), static_cast<const float*>(positive), static_cast<const float*>(negative),
        static_cast<const float*>(grad_loss), static_cast<float*>(grad_anchor), N, D);
    return cudaGetLastError();
}
