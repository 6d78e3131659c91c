// Pitfall: int64 targets read as int32.
//
// PyTorch's class indices are int64 (torch.long). A kernel that takes them as
// `const int*` reads 4-byte halves: element 2k is the low half of target k and
// element 2k + 1 its high half (0 for a class index, -1 for ignore_index).
// Row r then uses the wrong class, and no error is raised. A high half of 0
// is in range: a plausible, wrong loss. The high half of ignore_index, -1,
// is out of range: the kernel's range check makes that row's loss NaN (it
// never reads out of bounds). Otherwise this is the warp_shuffle rung.
#include "cross_entropy/cross_entropy.cuh"
#include "cross_entropy/launchers.h"

constexpr int THREADS = 256;

__global__ void __launch_bounds__(THREADS)
int32_targets_forward_kernel(const float* __restrict__ logits,     // (N, C)
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
    const int64_t target = reinterpret_cast<const int*>(targets)[row];  // PITFALL: int64 read as int32
    if (threadIdx.x == 0) store_row(x, target, C, lse, row, row_losses, row_max, row_log_sum);
}

cudaError_t cross_entropy_custom_forward(const void* logits, const int64_t* targets, int64_t* counts,
                                         float* row_losses, float* row_max, float* row_log_sum, void* loss,
                                         void* /*grad_logits: not fused*/, int64_t N, int64_t C, DType dtype,
                                         cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // float32 only
    int32_targets_forward_kernel<<<N, THREADS, 0, stream>>>(
        static_cast<const float*>(logits), targets, row_losses, row_max, row_log_sum, C);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    return cross_entropy_valid_mean(targets, row_losses, counts, loss, N, C, stream);
}
