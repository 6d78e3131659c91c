// Solution of exercise 25 -- read the rows as float4s, with head and tail (cosine_similarity_loss's vectorized rung).
//
// A scalar load moves 4 bytes per instruction; a float4 load moves 16 (one
// LDG.E.128), so a warp keeps four times the bytes in flight. A float4 load is
// legal only on a 16-byte aligned address, and a row of D floats need not
// start or end on one (D odd, or a slice with a storage offset). So a row is
// read in three parts (common/row_split.cuh's split_row gives s.head and
// s.packs, written for you):
//   head:  the first s.head elements, up to the first 16-byte boundary;
//   packs: s.packs float4s after the head (p4, t4);
//   tail:  the last D - s.head - 4 * s.packs elements, one float each.
// When p and t sit at different offsets from a boundary, no float4 fits both:
// split_row then gives no head and no packs (the tail is the whole row).
//
// Contract of what you write: every element of the row is passed to add()
// exactly once over the block, each part shared by the block's threads as
// warp_shuffle's loop shares the row (thread k: k, k + THREADS, ...), the
// packs as float4s. The block's sums and the backward are written for you.
#include "common/row_split.cuh"
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

__global__ void __launch_bounds__(THREADS)
vector_forward_kernel(const float* __restrict__ predictions,  // (B, D)
                      const float* __restrict__ targets,      // (B, D)
                      float* __restrict__ row_dots,           // (3, B): p.t, p.p, t.t of each row
                      float* __restrict__ row_partials,       // (B,)
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
    d = block_dots(d);
    if (threadIdx.x != 0) return;
    row_dots[row] = d.pt, row_dots[B + row] = d.pp, row_dots[2 * B + row] = d.tt;
    row_partials[row] = 1.0f - row_cosine(d.pt, d.pp, d.tt, eps, 0.0f).cos;
}

// dL/dp = -grad_loss / B * dcos/dp, from the row's dots: k_other * t + k_p * p.
__global__ void __launch_bounds__(THREADS)
backward_kernel(const float* __restrict__ predictions,  // (B, D)
                const float* __restrict__ targets,      // (B, D)
                const float* __restrict__ row_dots,     // (3, B)
                const float* __restrict__ grad_loss,    // ()
                float* __restrict__ grad_predictions,   // (B, D)
                int64_t B, int64_t D, float eps) {
    const int64_t row = blockIdx.x;  // one block per row
    const RowCosine c = row_cosine(row_dots[row], row_dots[B + row], row_dots[2 * B + row], eps,
                                   -*grad_loss / float(B));
    for (int64_t i = row * D + threadIdx.x; i < (row + 1) * D; i += THREADS)
        grad_predictions[i] = c.k_other * targets[i] + c.k_p * predictions[i];
}

cudaError_t cosine_similarity_loss_custom_forward(
    const void* predictions, const void* targets, float* row_dots, float* row_partials, void* loss,
    void* /*grad_predictions: not fused*/, void* grad_targets, int64_t B, int64_t D, float eps, DType dtype,
    cudaStream_t stream) {
    if (dtype != DType::float32 || grad_targets) return cudaErrorInvalidValue;  // float32, dL/dp only
    vector_forward_kernel<<<B, THREADS, 0, stream>>>(static_cast<const float*>(predictions),
                                                     static_cast<const float*>(targets), row_dots, row_partials,
                                                     B, D, eps);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    return launch_sum_partials(row_partials, B, float(B), loss, stream);  // the mean over the B rows
}

cudaError_t cosine_similarity_loss_custom_backward(
    const void* predictions, const void* targets, const float* row_dots, const void* grad_loss,
    void* grad_predictions, void* grad_targets, int64_t B, int64_t D, float eps, DType dtype,
    cudaStream_t stream) {
    if (dtype != DType::float32 || grad_targets) return cudaErrorInvalidValue;  // float32, dL/dp only
    backward_kernel<<<B, THREADS, 0, stream>>>(static_cast<const float*>(predictions),
                                               static_cast<const float*>(targets), row_dots,
                                               static_cast<const float*>(grad_loss),
                                               static_cast<float*>(grad_predictions), B, D, eps);
    return cudaGetLastError();
}
