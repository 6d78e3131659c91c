// Solution of exercise 26 -- fuse the gradient into the forward (cosine_similarity_loss's fused rung).
//
// Training runs the forward, then the backward, which reads p and t from DRAM
// again to form dL/dp. Once a block has its row's three sums, it can write the
// gradient at once, and the backward only scales it by grad_loss in place (not
// at all when grad_loss is 1, as in loss.backward()). Here the gradient reads
// the row a second time, partly from L2 (it need not beat vectorized: how much
// of the row is still in L2 depends on how many rows are in flight, so a slow
// time is not your bug); the fused rung goes one step further and keeps the
// row in registers, so that p and t leave DRAM once (rows of up to 8192 floats).
//
// Contract: after block_dots every thread of the block holds the row's sums d
// (p.t, p.p, t.t). The forward gets grad_predictions (B, D), never null here,
// and must leave in it dL/dp for grad_loss = 1, where L = (1/B) sum_rows
// (1 - cos(p_i, t_i)): row_cosine(pt, pp, tt, eps, scale) (cosine_similarity_loss/
// cosine.cuh) gives the coefficients of scale * dcos/dp, and row_grad(c, p, t,
// g, D) writes c.k_other * t + c.k_p * p into a row g of the gradient, the
// block's threads sharing it. The backward below is written for you.
#include "common/row_split.cuh"
#include "common/scale.cuh"
#include "common/sum_partials.cuh"
#include "cosine_similarity_loss/cosine.cuh"
#include "cosine_similarity_loss/launchers.h"

constexpr int THREADS = 256;
constexpr unsigned FULL_WARP = 0xffffffffu;

struct Dots {
    float pt, pp, tt;
};

// The block's three sums, in every thread: the warp's sums through shuffles, one shared
// slot per warp, one barrier, and every thread adds the THREADS / 32 slots.
__device__ __forceinline__ Dots block_dots(Dots d) {
    __shared__ float slots[3][THREADS / 32];
    for (int offset = 16; offset > 0; offset /= 2) {  // the partner: this lane's index xor 16, 8, 4, 2, 1
        d.pt += __shfl_xor_sync(FULL_WARP, d.pt, offset);
        d.pp += __shfl_xor_sync(FULL_WARP, d.pp, offset);
        d.tt += __shfl_xor_sync(FULL_WARP, d.tt, offset);
    }
    if (threadIdx.x % 32 == 0)
        slots[0][threadIdx.x / 32] = d.pt, slots[1][threadIdx.x / 32] = d.pp, slots[2][threadIdx.x / 32] = d.tt;
    __syncthreads();
    Dots block{0.0f, 0.0f, 0.0f};
    for (int w = 0; w < THREADS / 32; ++w) block.pt += slots[0][w], block.pp += slots[1][w], block.tt += slots[2][w];
    return block;
}

// One row's dL/dp from its coefficients, k_other * t + k_p * p, the block's threads sharing it:
// float4 loads and stores where p, t and g are equally aligned.
__device__ __forceinline__ void row_grad(const RowCosine& c, const float* p, const float* t, float* g, int64_t D) {
    const RowSplit s = split_row(D, p, t, g);
    const float4* p4 = reinterpret_cast<const float4*>(p + s.head);
    const float4* t4 = reinterpret_cast<const float4*>(t + s.head);
    float4* g4 = reinterpret_cast<float4*>(g + s.head);
    auto grad = [&](float pj, float tj) { return c.k_other * tj + c.k_p * pj; };
    for (int64_t k = threadIdx.x; k < s.packs; k += THREADS) {
        const float4 a = p4[k], b = t4[k];
        g4[k] = make_float4(grad(a.x, b.x), grad(a.y, b.y), grad(a.z, b.z), grad(a.w, b.w));
    }
    for (int64_t j = threadIdx.x; j < s.head; j += THREADS) g[j] = grad(p[j], t[j]);
    for (int64_t j = s.head + 4 * s.packs + threadIdx.x; j < D; j += THREADS) g[j] = grad(p[j], t[j]);
}

__global__ void __launch_bounds__(THREADS)
fused_forward_kernel(const float* __restrict__ predictions,  // (B, D)
                     const float* __restrict__ targets,      // (B, D)
                     float* __restrict__ row_partials,       // (B,)
                     float* __restrict__ grad_predictions,   // (B, D): dL/dp for grad_loss = 1
                     int64_t B, int64_t D, float eps) {
    const int64_t row = blockIdx.x;  // one block per row
    const float* p = predictions + row * D;
    const float* t = targets + row * D;
    const RowSplit s = split_row(D, p, t);  // s.head scalars, s.packs float4s, then the tail
    const float4* p4 = reinterpret_cast<const float4*>(p + s.head);
    const float4* t4 = reinterpret_cast<const float4*>(t + s.head);
    Dots d{0.0f, 0.0f, 0.0f};
    auto add = [&](float pj, float tj) { d.pt += pj * tj, d.pp += pj * pj, d.tt += tj * tj; };
    for (int64_t k = threadIdx.x; k < s.packs; k += THREADS) {
        const float4 a = p4[k], b = t4[k];
        add(a.x, b.x), add(a.y, b.y), add(a.z, b.z), add(a.w, b.w);
    }
    for (int64_t j = threadIdx.x; j < s.head; j += THREADS) add(p[j], t[j]);
    for (int64_t j = s.head + 4 * s.packs + threadIdx.x; j < D; j += THREADS) add(p[j], t[j]);
    d = block_dots(d);  // in every thread
    if (threadIdx.x == 0) row_partials[row] = 1.0f - row_cosine(d.pt, d.pp, d.tt, eps, 0.0f).cos;
    row_grad(row_cosine(d.pt, d.pp, d.tt, eps, -1.0f / float(B)), p, t, grad_predictions + row * D, D);
}

cudaError_t cosine_similarity_loss_custom_forward(
    const void* predictions, const void* targets, float* /*row_dots: unwritten*/, float* row_partials, void* loss,
    void* grad_predictions, void* grad_targets, int64_t B, int64_t D, float eps, DType dtype, cudaStream_t stream) {
    if (dtype != DType::float32 || grad_targets || grad_predictions == nullptr) return cudaErrorInvalidValue;
    fused_forward_kernel<<<B, THREADS, 0, stream>>>(static_cast<const float*>(predictions),
                                                    static_cast<const float*>(targets), row_partials,
                                                    static_cast<float*>(grad_predictions), B, D, eps);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    return launch_sum_partials(row_partials, B, float(B), loss, stream);  // the mean over the B rows
}

// The forward wrote dL/dp for grad_loss = 1: scale it in place by grad_loss (read on the device).
cudaError_t cosine_similarity_loss_custom_backward(
    const void* /*predictions: unread*/, const void* /*targets*/, const float* /*row_dots*/, const void* grad_loss,
    void* grad_predictions, void* grad_targets, int64_t B, int64_t D, float /*eps*/, DType dtype,
    cudaStream_t stream) {
    if (dtype != DType::float32 || grad_targets) return cudaErrorInvalidValue;  // float32, dL/dp only
    return scale_in_place(grad_predictions, grad_loss, B * D, dtype, stream);
}
