// Exercise 24 -- a warp's three dot products through shuffles (cosine_similarity_loss's warp_shuffle rung).
//
// The shared_memory rung adds a block's three sums with a tree in shared
// memory: 8 steps, each behind a __syncthreads(), most threads idle. The 32
// lanes of a warp can instead exchange registers: __shfl_xor_sync(mask, v,
// offset) returns v from the lane whose index differs from this lane's in the
// bits of `offset`.
//
// Contract of the loop you write in block_dots: after it, every lane of each
// warp (at least lane 0: it alone writes the warp's slot) holds the sums of
// its warp's 32 lanes' d.pt, d.pp and d.tt, exchanged through registers (no
// shared memory, no barrier). The slots, the one barrier and the sum of the
// slots are written for you, and so is the backward.
//
// Grade it from the shell: python -m losslab grade exercises/cosine_similarity_loss/cosine_warp_dots.cu
// (in Python: losslab.teach.exercises.grade("cosine_warp_dots")). Done when it is green and its machine
// code shows a shuffle (SHFL.BFLY or SHFL.DOWN).
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
    // FILL ME IN (roughly 5 lines): the warp's three sums (contract above).
    if (threadIdx.x % 32 == 0)
        slots[0][threadIdx.x / 32] = d.pt, slots[1][threadIdx.x / 32] = d.pp, slots[2][threadIdx.x / 32] = d.tt;
    __syncthreads();
    Dots block{0.0f, 0.0f, 0.0f};
    for (int w = 0; w < THREADS / 32; ++w) block.pt += slots[0][w], block.pp += slots[1][w], block.tt += slots[2][w];
    return block;
}

__global__ void __launch_bounds__(THREADS)
shuffle_forward_kernel(const float* __restrict__ predictions,  // (B, D)
                       const float* __restrict__ targets,      // (B, D)
                       float* __restrict__ row_dots,           // (3, B): p.t, p.p, t.t of each row
                       float* __restrict__ row_partials,       // (B,)
                       int64_t B, int64_t D, float eps) {
    const int64_t row = blockIdx.x;  // one block per row
    const float* p = predictions + row * D;
    const float* t = targets + row * D;
    Dots d{0.0f, 0.0f, 0.0f};
    for (int64_t j = threadIdx.x; j < D; j += THREADS) {  // lane k + 1 reads the next float
        const float pj = p[j], tj = t[j];
        d.pt += pj * tj, d.pp += pj * pj, d.tt += tj * tj;
    }
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
    shuffle_forward_kernel<<<B, THREADS, 0, stream>>>(static_cast<const float*>(predictions),
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
