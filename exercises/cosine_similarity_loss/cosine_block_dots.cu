// Exercise 23 -- a block's three dot products with one tree (cosine_similarity_loss's shared_memory rung).
//
// naive gives each thread a whole row: a warp's loads touch 32 cache lines,
// and only B threads exist. Here each row gets a block of THREADS threads,
// thread k reading elements k, k + THREADS, ... (written for you), so each
// thread holds a part of the row's three sums p.t, p.p and t.t, and the block
// must add its THREADS parts of each into one.
//
// Contract of block_dots: called by all THREADS threads of the block with
// their Dots, it returns the block's three sums in thread 0 (the others'
// results are unused). Every thread has stored its parts in tree[0..2]
// [threadIdx.x] (written for you); at each step of the tree the first `stride`
// threads add the slots `stride` further into their own, for each of the
// three sums, halving `stride` from THREADS / 2 down to 1, until tree[k][0]
// holds the block's sum k. A thread reads slots other threads wrote: each step
// must see the last one's. The backward (from the forward's row_dots) is
// written for you.
//
// Grade it from the shell: python -m losslab grade exercises/cosine_similarity_loss/cosine_block_dots.cu
// (in Python: losslab.teach.exercises.grade("cosine_block_dots")). Done when it is green and its
// machine code shows more barriers (BAR.SYNC) than the skeleton's.
#include "common/sum_partials.cuh"
#include "cosine_similarity_loss/cosine.cuh"
#include "cosine_similarity_loss/launchers.h"

constexpr int THREADS = 256;

struct Dots {
    float pt, pp, tt;
};

// The block's three sums, in thread 0.
__device__ __forceinline__ Dots block_dots(Dots d) {
    __shared__ float tree[3][THREADS];
    tree[0][threadIdx.x] = d.pt, tree[1][threadIdx.x] = d.pp, tree[2][threadIdx.x] = d.tt;
    __syncthreads();
    // FILL ME IN (roughly 5 lines): the tree, for the three sums at once (contract above).
    return {tree[0][0], tree[1][0], tree[2][0]};
}

__global__ void __launch_bounds__(THREADS)
tree_forward_kernel(const float* __restrict__ predictions,  // (B, D)
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
    tree_forward_kernel<<<B, THREADS, 0, stream>>>(static_cast<const float*>(predictions),
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
