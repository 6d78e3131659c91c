// warp_shuffle: as shared_memory, but the block combines its threads' (max, sum)
// with __shfl_xor_sync inside each warp and one shared slot per warp. It
// replaces shared_memory's two eight-step barrier-separated trees (most threads
// idle) with register-to-register exchanges and four barriers.
#include "cross_entropy/cross_entropy.cuh"
#include "cross_entropy/launchers.h"
#include "cross_entropy/row_backward.cuh"

// Launch knobs (losslab/build/knobs.py): -DLOSSLAB_CROSS_ENTROPY_WARP_SHUFFLE_<KNOB>=<value> builds another one.
#ifndef LOSSLAB_CROSS_ENTROPY_WARP_SHUFFLE_THREADS
#define LOSSLAB_CROSS_ENTROPY_WARP_SHUFFLE_THREADS 256  // threads per block: 32 64 128 256 512 1024
#endif
constexpr int THREADS = LOSSLAB_CROSS_ENTROPY_WARP_SHUFFLE_THREADS;
static_assert(THREADS >= 32 && THREADS <= 1024 && THREADS % 32 == 0,
              "LOSSLAB_CROSS_ENTROPY_WARP_SHUFFLE_THREADS: a multiple of 32 from 32 to 1024 (whole warps)");

__global__ void __launch_bounds__(THREADS)
cross_entropy_warp_shuffle_forward_kernel(const float* __restrict__ logits,     // (N, C)
                                          const int64_t* __restrict__ targets,  // (N,)
                                          float* __restrict__ row_losses,       // (N,)
                                          float* __restrict__ row_max,          // (N,)
                                          float* __restrict__ row_log_sum,      // (N,)
                                          int64_t C) {
    const int64_t row = blockIdx.x;
    const float* x = logits + row * C;
    LogSumExp lse;
    for (int64_t j = threadIdx.x; j < C; j += THREADS) lse_add(lse, x[j]);
    lse = block_reduce_logsumexp(lse);
    if (threadIdx.x == 0) store_row(x, targets[row], C, lse, row, row_losses, row_max, row_log_sum);
}

cudaError_t cross_entropy_warp_shuffle_forward(const void* logits, const int64_t* targets, int64_t* counts,
                                               float* row_losses, float* row_max, float* row_log_sum, void* loss,
                                               void* /*grad_logits: not fused*/, int64_t N, int64_t C,
                                               DType dtype, cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // a teaching rung: float32 only
    cross_entropy_warp_shuffle_forward_kernel<<<N, THREADS, 0, stream>>>(
        static_cast<const float*>(logits), targets, row_losses, row_max, row_log_sum, C);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    return cross_entropy_valid_mean(targets, row_losses, counts, loss, N, C, stream);
}

// The backward has nothing to reduce, so shuffles change nothing there: it is
// shared_memory's coalesced element-wise kernel (row_backward.cuh).
cudaError_t cross_entropy_warp_shuffle_backward(const void* logits, const int64_t* targets, const float* row_max,
                                                const float* row_log_sum, const int64_t* counts,
                                                const void* grad_loss, void* grad_logits, int64_t N, int64_t C,
                                                DType dtype, cudaStream_t stream) {
    return cross_entropy_row_backward(logits, targets, row_max, row_log_sum, counts,
                                      static_cast<const float*>(grad_loss), grad_logits, N, C, dtype, stream);
}
