// warp_shuffle: shared_memory's reduction without its tree.
// flaw of shared_memory: its tree took eight barrier-separated steps, most threads idle
//     at each.
// idea: the 32 lanes of a warp add their sums in registers with five __shfl_xor_sync
//     butterflies (no shared memory, no barrier), then one shared slot per warp and a
//     single barrier finish the block. The row loop is shared_memory's, line for line;
//     the backward has nothing to reduce: it is shared_memory's.
// not faster: forward, forward_backward (one reduction ends each row's 64 KiB of loads at the
//   seed size: DRAM-bound either way; the backward is shared_memory's own kernel)
// The operator: ladder/warp_shuffle.cu with its block size a launch knob (the ladder has no knobs).
#include "common/sum_partials.cuh"
#include "cosine_similarity_loss/cosine.cuh"
#include "cosine_similarity_loss/launchers.h"

// Launch knobs (losslab/build/knobs.py): -DLOSSLAB_COSINE_SIMILARITY_LOSS_WARP_SHUFFLE_THREADS=<value>
// builds another one.
#ifndef LOSSLAB_COSINE_SIMILARITY_LOSS_WARP_SHUFFLE_THREADS
#define LOSSLAB_COSINE_SIMILARITY_LOSS_WARP_SHUFFLE_THREADS 256  // threads per block: 32 64 128 256 512 1024
#endif

namespace {

constexpr int THREADS = LOSSLAB_COSINE_SIMILARITY_LOSS_WARP_SHUFFLE_THREADS;
static_assert(THREADS >= 32 && THREADS <= 1024 && THREADS % 32 == 0,
              "LOSSLAB_COSINE_SIMILARITY_LOSS_WARP_SHUFFLE_THREADS: a multiple of 32 from 32 to 1024 (whole warps)");

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

cudaError_t cosine_similarity_loss_warp_shuffle_forward(
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

cudaError_t cosine_similarity_loss_warp_shuffle_backward(
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
