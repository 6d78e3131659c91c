// fused: the forward also writes dL/dp for grad_loss = 1, from registers; the backward only scales it.
// flaw of vectorized: training reads p and t from DRAM twice, in the forward and again
//     in the backward.
// idea: each thread keeps TILE packs of p and of t in registers (packs threadIdx.x + i * THREADS)
//     while the block adds the row's three sums, then writes the gradient from them. A row of
//     up to TILE * THREADS packs (8192 floats) leaves DRAM once: with grad_loss = 1, training
//     moves 2 reads and 1 write of B x D, vectorized 4 reads and 1 write. A longer row re-reads
//     only what lies beyond the tile; one whose gradient is not aligned like p and t is read
//     twice, as scalars. The backward scales the gradient in place by grad_loss
//     (common/scale.cuh), not at all when it is 1. With no gradient buffer (inference) the
//     launcher refuses, and the caller runs vectorized's forward. 512 threads x 4 packs, not
//     256 x 8: the same 8192 floats in half the registers a thread (64, no spills). Re-reading
//     the row from L2 instead (forward+backward, 32768 x 8192) took 1.461 ms against
//     vectorized's 1.769 on the H100 but 1.376 against 1.242 on the H200.
// not faster: forward (it also writes the gradient; forward_backward, training, is where it pays)
// diff bound: 59 lines (vectorized's backward kernel goes; the tile is loaded, then stored from)
#include "common/row_split.cuh"
#include "common/scale.cuh"
#include "common/sum_partials.cuh"
#include "cosine_similarity_loss/cosine.cuh"
#include "cosine_similarity_loss/ladder/ladder.h"

namespace {

constexpr int THREADS = 512;
constexpr int TILE = 4;  // float4s of p and of t a thread keeps: 4 x 512 x 4 = 8192 floats a row

struct Dots {
    float pt, pp, tt;
};

// The block's three sums, in every thread: five butterfly exchanges inside each warp
// (__shfl_xor_sync, registers only, every lane getting the warp's sums), one shared slot
// per warp, one barrier, and every thread adds the THREADS / 32 slots.
__device__ __forceinline__ Dots block_dots(Dots d) {
    __shared__ float slots[3][THREADS / 32];
    for (int lanes = 16; lanes > 0; lanes /= 2) {  // the partner: this lane's index xor 16, 8, 4, 2, 1
        d.pt += __shfl_xor_sync(0xffffffffu, d.pt, lanes);
        d.pp += __shfl_xor_sync(0xffffffffu, d.pp, lanes);
        d.tt += __shfl_xor_sync(0xffffffffu, d.tt, lanes);
    }
    if (threadIdx.x % 32 == 0)
        slots[0][threadIdx.x / 32] = d.pt, slots[1][threadIdx.x / 32] = d.pp, slots[2][threadIdx.x / 32] = d.tt;
    __syncthreads();
    Dots block{0.0f, 0.0f, 0.0f};
    for (int w = 0; w < THREADS / 32; ++w) block.pt += slots[0][w], block.pp += slots[1][w], block.tt += slots[2][w];
    return block;
}

// One row's dL/dp from its coefficients, k_other * t + k_p * p: float4 loads and stores from pack `first` on.
__device__ __forceinline__ void row_grad(const RowCosine& c, const float* p, const float* t, float* g, int64_t D,
                                         int64_t first) {
    const RowSplit s = split_row(D, p, t, g);  // no packs unless p, t and g are equally aligned
    const float4* p4 = reinterpret_cast<const float4*>(p + s.head);
    const float4* t4 = reinterpret_cast<const float4*>(t + s.head);
    float4* g4 = reinterpret_cast<float4*>(g + s.head);
    auto grad = [&](float pj, float tj) { return c.k_other * tj + c.k_p * pj; };
#pragma unroll 4
    for (int64_t k = first + threadIdx.x; k < s.packs; k += THREADS) {
        const float4 a = p4[k], b = t4[k];
        g4[k] = make_float4(grad(a.x, b.x), grad(a.y, b.y), grad(a.z, b.z), grad(a.w, b.w));
    }
    for (int64_t j = threadIdx.x; j < s.head; j += THREADS) g[j] = grad(p[j], t[j]);
    for (int64_t j = s.head + 4 * s.packs + threadIdx.x; j < D; j += THREADS) g[j] = grad(p[j], t[j]);
}

__global__ void __launch_bounds__(THREADS) forward_kernel(
    const float* __restrict__ predictions,  // (B, D)
    const float* __restrict__ targets,      // (B, D)
    float* __restrict__ row_partials,       // (B,)
    float* __restrict__ grad_predictions,   // (B, D): dL/dp for grad_loss = 1
    int64_t B, int64_t D, float eps) {
    const int64_t row = blockIdx.x;  // one block per row
    const float* p = predictions + row * D;
    const float* t = targets + row * D;
    float* g = grad_predictions + row * D;
    const RowSplit s = split_row(D, p, t, g);  // g too: the gradient is stored in the same packs
    const float4* p4 = reinterpret_cast<const float4*>(p + s.head);
    const float4* t4 = reinterpret_cast<const float4*>(t + s.head);
    Dots d{0.0f, 0.0f, 0.0f};
    auto add = [&](float pj, float tj) { d.pt += pj * tj, d.pp += pj * pj, d.tt += tj * tj; };
    float4 pr[TILE], tr[TILE];  // packs threadIdx.x + i * THREADS: all 2 * TILE loads in flight at once
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int i = 0; i < TILE; ++i) {
        const int64_t k = threadIdx.x + i * THREADS;
        pr[i] = k < s.packs ? p4[k] : zero, tr[i] = k < s.packs ? t4[k] : zero;
    }
#pragma unroll
    for (int i = 0; i < TILE; ++i)
        add(pr[i].x, tr[i].x), add(pr[i].y, tr[i].y), add(pr[i].z, tr[i].z), add(pr[i].w, tr[i].w);
#pragma unroll 4
    for (int64_t k = TILE * THREADS + threadIdx.x; k < s.packs; k += THREADS) {  // beyond the tile
        const float4 a = p4[k], b = t4[k];
        add(a.x, b.x), add(a.y, b.y), add(a.z, b.z), add(a.w, b.w);
    }
    for (int64_t j = threadIdx.x; j < s.head; j += THREADS) add(p[j], t[j]);
    for (int64_t j = s.head + 4 * s.packs + threadIdx.x; j < D; j += THREADS) add(p[j], t[j]);
    d = block_dots(d);
    const RowCosine c = row_cosine(d.pt, d.pp, d.tt, eps, -1.0f / float(B));
    if (threadIdx.x == 0) row_partials[row] = 1.0f - c.cos;
    auto grad = [&](float pj, float tj) { return c.k_other * tj + c.k_p * pj; };
    float4* g4 = reinterpret_cast<float4*>(g + s.head);
#pragma unroll
    for (int i = 0; i < TILE; ++i) {  // the tile's gradient, from registers
        const int64_t k = threadIdx.x + i * THREADS;
        if (k < s.packs)
            g4[k] = make_float4(grad(pr[i].x, tr[i].x), grad(pr[i].y, tr[i].y), grad(pr[i].z, tr[i].z),
                                grad(pr[i].w, tr[i].w));
    }
    row_grad(c, p, t, g, D, TILE * THREADS);  // beyond the tile, the head and the tail: read again
}

}  // namespace

cudaError_t cosine_similarity_loss_fused_forward(
    const void* predictions, const void* targets, float* /*row_dots: unwritten*/, float* row_partials, void* loss,
    void* grad_predictions, void* grad_targets, int64_t B, int64_t D, float eps, DType dtype,
    cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // a teaching rung: float32 only
    if (grad_targets) return cudaErrorInvalidValue;             // and dL/dp only
    if (grad_predictions == nullptr) return cudaErrorInvalidValue;  // fused writes the gradient
    const int64_t blocks = B;  // one block per row
    forward_kernel<<<blocks, THREADS, 0, stream>>>(static_cast<const float*>(predictions),
                                                   static_cast<const float*>(targets), row_partials,
                                                   static_cast<float*>(grad_predictions), B, D, eps);
    const cudaError_t err = cudaGetLastError();
    return err != cudaSuccess ? err : launch_sum_partials(row_partials, B, float(B), loss, stream);
}

cudaError_t cosine_similarity_loss_fused_backward(
    const void* /*predictions: unread*/, const void* /*targets*/, const float* /*row_dots*/, const void* grad_loss,
    void* grad_predictions, void* grad_targets, int64_t B, int64_t D, float /*eps*/, DType dtype,
    cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // a teaching rung: float32 only
    if (grad_targets) return cudaErrorInvalidValue;             // and dL/dp only
    return scale_in_place(grad_predictions, grad_loss, B * D, dtype, stream);  // the forward's, in place
}
