// A wrong answer to the triplet_warp_squares exercise, test data for tests/test_exercises.py:
// each shuffle's result replaces the value instead of being added.
//
// The shared_memory rung adds a block's two sums with a tree in shared memory:
// 8 steps, each behind a __syncthreads(), most threads idle. The 32 lanes of a
// warp can instead exchange registers: __shfl_xor_sync(mask, v, offset)
// returns v from the lane whose index differs from this lane's in the bits of
// `offset` (FULL_WARP: common/reduce.cuh's mask of all 32 lanes).
//
// Contract of the loop you write in block_squares: after it, every lane of
// each warp (at least lane 0: it alone writes the warp's slots) holds the sums
// of its warp's 32 lanes' s.ap and s.an, exchanged through registers (no
// shared memory, no barrier). The slots, the one barrier and the sum of the
// slots are written for you, and so are the forward and the backward.
#include "common/reduce.cuh"
#include "common/sum_partials.cuh"
#include "triplet_margin_loss/launchers.h"
#include "triplet_margin_loss/triplet.cuh"

constexpr int THREADS = 256;

// The block's two sums, every thread getting them: the warp's sums, one shared slot per warp, a
// barrier, the slots added.
__device__ __forceinline__ Squares block_squares(Squares s) {
    __shared__ float warp_ap[THREADS / 32], warp_an[THREADS / 32];
    for (int lanes = 16; lanes > 0; lanes /= 2) {  // the partner: this lane's index xor 16, 8, 4, 2, 1
        s.ap = __shfl_xor_sync(FULL_WARP, s.ap, lanes);
        s.an = __shfl_xor_sync(FULL_WARP, s.an, lanes);
    }
    if (threadIdx.x % 32 == 0) {
        warp_ap[threadIdx.x / 32] = s.ap;
        warp_an[threadIdx.x / 32] = s.an;
    }
    __syncthreads();
    Squares block;
    for (int w = 0; w < THREADS / 32; ++w) {
        block.ap += warp_ap[w];
        block.an += warp_an[w];
    }
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
