// Exercise 27 -- a block's two squared distances with one tree (triplet_margin_loss's shared_memory rung).
//
// naive gives each thread a whole row: a warp's loads touch 32 cache lines,
// and only N threads exist. Here each row gets a block of THREADS threads,
// thread k reading elements k, k + THREADS, ... (written for you), so each
// thread holds a part of the row's two sums |a - p + eps|^2 and
// |a - n + eps|^2 (Squares: .ap, .an), and the block must add its THREADS parts
// of each into one.
//
// Contract of block_squares: called by all THREADS threads of the block with
// their Squares, it returns the block's two sums in every thread (the backward
// uses them in each). Every thread has stored its parts in partial_ap and
// partial_an (written for you); at each step of the tree the first `stride`
// threads add the slots `stride` further into their own, for both sums,
// halving `stride` from THREADS / 2 down to 1, until slot 0 holds the block's
// sums. A thread reads slots other threads wrote: each step must see the last
// one's. The forward and the backward are written for you.
//
// Grade it from the shell: python -m losslab grade exercises/triplet_margin_loss/triplet_block_squares.cu
// (in Python: losslab.teach.exercises.grade("triplet_block_squares")). Done when it is green and its
// machine code shows more barriers (BAR.SYNC) than the skeleton's.
#include "common/sum_partials.cuh"
#include "triplet_margin_loss/launchers.h"
#include "triplet_margin_loss/triplet.cuh"

constexpr int THREADS = 256;

// The block's two sums, every thread getting them.
__device__ __forceinline__ Squares block_squares(Squares s) {
    __shared__ float partial_ap[THREADS], partial_an[THREADS];
    partial_ap[threadIdx.x] = s.ap;
    partial_an[threadIdx.x] = s.an;
    __syncthreads();
    // FILL ME IN (roughly 7 lines): the tree, for both sums at once (contract above).
    Squares block;
    block.ap = partial_ap[0];
    block.an = partial_an[0];
    return block;
}

// --- forward: each row's loss; then launch_sum_partials adds them in a fixed order ---

__global__ void __launch_bounds__(THREADS)
forward_kernel(const float* __restrict__ anchor,    // (N, D)
               const float* __restrict__ positive,  // (N, D)
               const float* __restrict__ negative,  // (N, D)
               float* __restrict__ row_losses,      // (N,) written: each row's loss
               int64_t N, int64_t D) {
    const int64_t row = blockIdx.x;  // one block per row
    const float *a = anchor + row * D, *p = positive + row * D, *n = negative + row * D;
    Squares s;
    for (int64_t j = threadIdx.x; j < D; j += THREADS) add_squares(s, a[j], p[j], n[j]);
    s = block_squares(s);
    if (threadIdx.x == 0) row_losses[row] = triplet_row_loss(s);
}

// --- backward: dL/da = (u / d(a, p) - v / d(a, n)) * grad_loss / N on the rows with a loss ---

__global__ void __launch_bounds__(THREADS)
backward_kernel(const float* __restrict__ anchor,     // (N, D)
                const float* __restrict__ positive,   // (N, D)
                const float* __restrict__ negative,   // (N, D)
                const float* __restrict__ grad_loss,  // ()
                float* __restrict__ grad_anchor,      // (N, D) written
                int64_t N, int64_t D) {
    const int64_t row = blockIdx.x;  // one block per row
    const float *a = anchor + row * D, *p = positive + row * D, *n = negative + row * D;
    float* g = grad_anchor + row * D;
    Squares s;
    for (int64_t j = threadIdx.x; j < D; j += THREADS) add_squares(s, a[j], p[j], n[j]);
    const Coefficients c = triplet_coefficients(block_squares(s), *grad_loss / float(N));
    for (int64_t j = threadIdx.x; j < D; j += THREADS) g[j] = triplet_grad(a[j], p[j], n[j], c);
}

cudaError_t triplet_margin_loss_custom_forward(
    const void* anchor, const void* positive, const void* negative, float* row_losses, void* loss,
    void* /*grad_anchor*/, int64_t N, int64_t D, DType dtype, cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // float32 only
    forward_kernel<<<N, THREADS, 0, stream>>>(
        static_cast<const float*>(anchor), static_cast<const float*>(positive), static_cast<const float*>(negative),
        row_losses, N, D);
    const cudaError_t err = cudaGetLastError();
    return err != cudaSuccess ? err : launch_sum_partials(row_losses, N, float(N), loss, stream);
}

cudaError_t triplet_margin_loss_custom_backward(
    const void* anchor, const void* positive, const void* negative, const void* grad_loss, void* grad_anchor,
    int64_t N, int64_t D, DType dtype, cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // float32 only
    backward_kernel<<<N, THREADS, 0, stream>>>(
        static_cast<const float*>(anchor), static_cast<const float*>(positive), static_cast<const float*>(negative),
        static_cast<const float*>(grad_loss), static_cast<float*>(grad_anchor), N, D);
    return cudaGetLastError();
}
