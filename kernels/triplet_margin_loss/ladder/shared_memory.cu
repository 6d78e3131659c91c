// shared_memory: one block per row, coalesced loads, the two squared distances by a tree in
// shared memory. naive's flaw: neighbouring threads read addresses D floats apart (32 cache
// lines per warp load), and N threads leave most SMs idle. Here thread k of a 256-thread block
// reads elements k, k + 256, ... of its row, so a warp load is 32 consecutive floats, one
// 128-byte line; the block adds its threads' sums with a tree (8 barrier-separated steps). The
// backward reduces the same way, then each thread writes its elements' gradient.
#include "common/sum_partials.cuh"
#include "triplet_margin_loss/ladder/ladder.h"
#include "triplet_margin_loss/triplet.cuh"

namespace {

constexpr int THREADS = 256;

// The block's two sums, every thread getting them: each thread stores its values, then a tree
// halves the active threads each step, log2(256) = 8 steps, each behind a barrier.
__device__ __forceinline__ Squares block_squares(Squares s) {
    __shared__ float partial_ap[THREADS], partial_an[THREADS];
    partial_ap[threadIdx.x] = s.ap;
    partial_an[threadIdx.x] = s.an;
    __syncthreads();
    for (int stride = THREADS / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride) {
            partial_ap[threadIdx.x] += partial_ap[threadIdx.x + stride];
            partial_an[threadIdx.x] += partial_an[threadIdx.x + stride];
        }
        __syncthreads();
    }
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

}  // namespace

// --- the launchers (launchers.h) ---

cudaError_t triplet_margin_loss_shared_memory_forward(
    const void* anchor, const void* positive, const void* negative, float* row_losses, void* loss,
    void* /*grad_anchor*/, int64_t N, int64_t D, DType dtype, cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // float32 only
    forward_kernel<<<N, THREADS, 0, stream>>>(
        static_cast<const float*>(anchor), static_cast<const float*>(positive), static_cast<const float*>(negative),
        row_losses, N, D);
    const cudaError_t err = cudaGetLastError();
    return err != cudaSuccess ? err : launch_sum_partials(row_losses, N, float(N), loss, stream);
}

cudaError_t triplet_margin_loss_shared_memory_backward(
    const void* anchor, const void* positive, const void* negative, const void* grad_loss, void* grad_anchor,
    int64_t N, int64_t D, DType dtype, cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // float32 only
    backward_kernel<<<N, THREADS, 0, stream>>>(
        static_cast<const float*>(anchor), static_cast<const float*>(positive), static_cast<const float*>(negative),
        static_cast<const float*>(grad_loss), static_cast<float*>(grad_anchor), N, D);
    return cudaGetLastError();
}
