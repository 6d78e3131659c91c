// shared_memory: one block per row, forward and backward.
// flaw of naive: neighbouring threads read addresses D floats apart (uncoalesced), and
//     B threads are too few to fill the GPU.
// idea: consecutive threads read consecutive floats, so a warp's load is one coalesced
//     128-byte line, and B blocks fill the GPU. The block adds its threads' three sums
//     with a tree in shared memory, halving the active threads at each step, a barrier
//     between steps (log2(256) = 8 of them).
// The operator: ladder/shared_memory.cu with its block size a launch knob (the ladder has no knobs).
#include "common/sum_partials.cuh"
#include "cosine_similarity_loss/cosine.cuh"
#include "cosine_similarity_loss/launchers.h"

// Launch knobs (losslab/build/knobs.py): -DLOSSLAB_COSINE_SIMILARITY_LOSS_SHARED_MEMORY_THREADS=<value>
// builds another one.
#ifndef LOSSLAB_COSINE_SIMILARITY_LOSS_SHARED_MEMORY_THREADS
#define LOSSLAB_COSINE_SIMILARITY_LOSS_SHARED_MEMORY_THREADS 256  // threads per block: 32 64 128 256 512 1024
#endif

namespace {

constexpr int THREADS = LOSSLAB_COSINE_SIMILARITY_LOSS_SHARED_MEMORY_THREADS;
static_assert(THREADS >= 32 && THREADS <= 1024 && (THREADS & (THREADS - 1)) == 0,
              "LOSSLAB_COSINE_SIMILARITY_LOSS_SHARED_MEMORY_THREADS: a power of 2 from 32 to 1024 "
              "(the tree halves it)");

struct Dots {
    float pt, pp, tt;
};

// The block's three sums, in every thread: a tree in shared memory, 8 steps, each
// halving the active threads, a barrier after each.
__device__ __forceinline__ Dots block_dots(Dots d) {
    __shared__ float tree[3][THREADS];
    tree[0][threadIdx.x] = d.pt, tree[1][threadIdx.x] = d.pp, tree[2][threadIdx.x] = d.tt;
    __syncthreads();
    for (int stride = THREADS / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride)
            for (int k = 0; k < 3; ++k) tree[k][threadIdx.x] += tree[k][threadIdx.x + stride];
        __syncthreads();
    }
    return {tree[0][0], tree[1][0], tree[2][0]};
}

__global__ void __launch_bounds__(THREADS) forward_kernel(
    const float* __restrict__ predictions,  // (B, D)
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
__global__ void __launch_bounds__(THREADS) backward_kernel(
    const float* __restrict__ predictions,  // (B, D)
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

}  // namespace

cudaError_t cosine_similarity_loss_shared_memory_forward(
    const void* predictions, const void* targets, float* row_dots, float* row_partials, void* loss,
    void* /*grad_predictions: not fused*/, void* grad_targets, int64_t B, int64_t D, float eps, DType dtype,
    cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // a teaching rung: float32 only
    if (grad_targets) return cudaErrorInvalidValue;             // and dL/dp only
    const int64_t blocks = B;  // one block per row
    forward_kernel<<<blocks, THREADS, 0, stream>>>(static_cast<const float*>(predictions),
                                                   static_cast<const float*>(targets), row_dots, row_partials,
                                                   B, D, eps);
    const cudaError_t err = cudaGetLastError();
    return err != cudaSuccess ? err : launch_sum_partials(row_partials, B, float(B), loss, stream);
}

cudaError_t cosine_similarity_loss_shared_memory_backward(
    const void* predictions, const void* targets, const float* row_dots, const void* grad_loss,
    void* grad_predictions, void* grad_targets, int64_t B, int64_t D, float eps, DType dtype,
    cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // a teaching rung: float32 only
    if (grad_targets) return cudaErrorInvalidValue;             // and dL/dp only
    const int64_t blocks = B;  // one block per row
    backward_kernel<<<blocks, THREADS, 0, stream>>>(static_cast<const float*>(predictions),
                                                    static_cast<const float*>(targets), row_dots,
                                                    static_cast<const float*>(grad_loss),
                                                    static_cast<float*>(grad_predictions), B, D, eps);
    return cudaGetLastError();
}
