// fused: vectorized's forward writes the gradient too (for grad_loss = 1), right after the row's
// two distances, while the row is still in L1 and L2; the backward only scales it in place (no
// work when grad_loss is 1). vectorized's backward read the three (N, D) inputs from DRAM a
// second time: fused reads them once from DRAM, the forward's second sweep of its row hitting
// the caches.
// not faster: forward (it also writes the gradient: inference runs vectorized's forward)
#include "common/reduce.cuh"
#include "common/scale.cuh"
#include "common/sum_partials.cuh"
#include "triplet_margin_loss/ladder/ladder.h"
#include "triplet_margin_loss/triplet.cuh"

namespace {

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
    add_squares(s, a.x, p.x, n.x), add_squares(s, a.y, p.y, n.y);
    add_squares(s, a.z, p.z, n.z), add_squares(s, a.w, p.w, n.w);
}

__device__ __forceinline__ float4 grad_pack(float4 a, float4 p, float4 n, Coefficients c) {
    return make_float4(triplet_grad(a.x, p.x, n.x, c), triplet_grad(a.y, p.y, n.y, c),
                       triplet_grad(a.z, p.z, n.z, c), triplet_grad(a.w, p.w, n.w, c));
}

// --- forward: each row's loss and dL/da for grad_loss = 1; then launch_sum_partials adds the losses ---

__global__ void __launch_bounds__(THREADS)
forward_kernel(const float* __restrict__ anchor,    // (N, D)
               const float* __restrict__ positive,  // (N, D)
               const float* __restrict__ negative,  // (N, D)
               float* __restrict__ row_losses,      // (N,) written: each row's loss
               float* __restrict__ grad_anchor,     // (N, D) written
               int64_t N, int64_t D) {
    const int64_t row = blockIdx.x;  // one block per row
    const float *a = anchor + row * D, *p = positive + row * D, *n = negative + row * D;
    float* g = grad_anchor + row * D;
    const bool packs = packed(a, p, n, g, D);
    Squares s;
    if (packs)
        for (int64_t i = threadIdx.x; i < D / 4; i += THREADS) add_pack(s, load4(a, i), load4(p, i), load4(n, i));
    else
        for (int64_t j = threadIdx.x; j < D; j += THREADS) add_squares(s, a[j], p[j], n[j]);
    s = block_squares(s);
    if (threadIdx.x == 0) row_losses[row] = triplet_row_loss(s);
    const Coefficients c = triplet_coefficients(s, 1.0f / float(N));
    if (packs)
        for (int64_t i = threadIdx.x; i < D / 4; i += THREADS)
            reinterpret_cast<float4*>(g)[i] = grad_pack(load4(a, i), load4(p, i), load4(n, i), c);
    else
        for (int64_t j = threadIdx.x; j < D; j += THREADS) g[j] = triplet_grad(a[j], p[j], n[j], c);
}

}  // namespace

// --- the launchers (launchers.h) ---

cudaError_t triplet_margin_loss_fused_forward(
    const void* anchor, const void* positive, const void* negative, float* row_losses, void* loss,
    void* grad_anchor, int64_t N, int64_t D, DType dtype, cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // float32 only
    if (grad_anchor == nullptr) return cudaErrorInvalidValue;   // it writes the gradient
    forward_kernel<<<N, THREADS, 0, stream>>>(
        static_cast<const float*>(anchor), static_cast<const float*>(positive), static_cast<const float*>(negative),
        row_losses, static_cast<float*>(grad_anchor), N, D);
    const cudaError_t err = cudaGetLastError();
    return err != cudaSuccess ? err : launch_sum_partials(row_losses, N, float(N), loss, stream);
}

// The forward wrote dL/da for grad_loss = 1: scale it in place.
cudaError_t triplet_margin_loss_fused_backward(
    const void* /*anchor*/, const void* /*positive*/, const void* /*negative*/, const void* grad_loss,
    void* grad_anchor, int64_t N, int64_t D, DType dtype, cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // float32 only
    return scale_in_place(grad_anchor, grad_loss, N * D, dtype, stream);
}
