// A wrong answer to the triplet_vectorize exercise, test data for tests/test_exercises.py:
// the packs read one float at a time: right numbers, 4-byte loads.
//
// A scalar load moves 4 bytes per instruction; a float4 load moves 16 (one
// LDG.E.128): a quarter of the load instructions for the same bytes, four
// floats of each input in flight a load. A float4 load is legal only on a
// 16-byte aligned address: where every row starts on a 16-byte boundary (D a
// multiple of 4, the tensors aligned: packed(), written for you) a row is D / 4
// packs; other rows keep warp_shuffle's scalar loop.
//
// Contract of the line you write in the forward: on a packed row, every
// element of the row is passed to add_squares exactly once over the block,
// the block's threads sharing the D / 4 packs as the scalar loop shares the
// elements (thread k: packs k, k + THREADS, ...), each read through load4 (one
// 16-byte load per input). add_pack adds a pack of each input; the block's
// sums and the backward (scalar: warp_shuffle's) are written for you.
#include "common/reduce.cuh"
#include "common/sum_partials.cuh"
#include "triplet_margin_loss/launchers.h"
#include "triplet_margin_loss/triplet.cuh"

constexpr int THREADS = 256;

// The block's two sums, every thread getting them: five butterfly exchanges inside each warp
// (each lane getting the warp's sums), one shared slot per warp, a barrier, the slots added.
__device__ __forceinline__ Squares block_squares(Squares s) {
    __shared__ float warp_ap[THREADS / 32], warp_an[THREADS / 32];
    for (int lanes = 16; lanes > 0; lanes /= 2) {  // the partner: this lane's index xor 16, 8, 4, 2, 1
        s.ap += __shfl_xor_sync(FULL_WARP, s.ap, lanes);
        s.an += __shfl_xor_sync(FULL_WARP, s.an, lanes);
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

// Every row of these tensors starts on a 16-byte boundary: float4 loads and stores apply.
__device__ __forceinline__ bool packed(const float* a, const float* p, const float* n, const float* g, int64_t D) {
    return D % 4 == 0 && (uintptr_t(a) | uintptr_t(p) | uintptr_t(n) | uintptr_t(g)) % 16 == 0;
}

__device__ __forceinline__ float4 load4(const float* x, int64_t i) { return reinterpret_cast<const float4*>(x)[i]; }

__device__ __forceinline__ void add_pack(Squares& s, float4 a, float4 p, float4 n) {
    add_squares(s, a.x, p.x, n.x);
    add_squares(s, a.y, p.y, n.y);
    add_squares(s, a.z, p.z, n.z);
    add_squares(s, a.w, p.w, n.w);
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
    if (packed(a, p, n, a, D)) {
        for (int64_t i = threadIdx.x; i < D / 4; i += THREADS) for (int k = 0; k < 4; ++k) add_squares(s, a[4 * i + k], p[4 * i + k], n[4 * i + k]);
    } else {
        for (int64_t j = threadIdx.x; j < D; j += THREADS) add_squares(s, a[j], p[j], n[j]);
    }
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
    Squares s;  // warp_shuffle's scalar loops here: the exercise is the forward's
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
