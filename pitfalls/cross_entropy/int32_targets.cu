// Pitfall: int64 targets read as int32.
//
// PyTorch's class indices are int64 (torch.long). A kernel that takes them as
// `const int*` reads 4-byte halves: element 2k is the low half of target k and
// element 2k + 1 its high half (0 for a class index, -1 for ignore_index).
// Row r then uses the wrong class, and no error is raised: the indices are
// all still in range. Otherwise a one-block-per-row, warp-shuffle forward.
#include <math.h>
#include "common/reduce.cuh"

constexpr int THREADS = 256;
constexpr int IGNORE_INDEX = -100;

__global__ void __launch_bounds__(THREADS)
int32_rows_kernel(const float* __restrict__ logits,     // (N, C)
                  const int64_t* __restrict__ targets,  // (N,)
                  float* __restrict__ row_losses,       // (N,)
                  float* __restrict__ row_max,          // (N,)
                  float* __restrict__ row_log_sum,      // (N,)
                  int64_t C) {
    const float* x = logits + blockIdx.x * C;
    const int target = reinterpret_cast<const int*>(targets)[blockIdx.x];  // PITFALL: int64 read as int32
    float local_max = -INFINITY;
    for (int64_t j = threadIdx.x; j < C; j += THREADS) local_max = fmaxf(local_max, x[j]);
    const float max = block_reduce_max(local_max);
    float local_sum = 0.0f;
    for (int64_t j = threadIdx.x; j < C; j += THREADS) local_sum += expf(x[j] - max);
    const float log_sum = logf(block_reduce_sum(local_sum));
    if (threadIdx.x == 0) {
        row_max[blockIdx.x] = max;
        row_log_sum[blockIdx.x] = log_sum;
        const bool valid = target >= 0 && target < C;
        row_losses[blockIdx.x] = target == IGNORE_INDEX ? 0.0f : valid ? max + log_sum - x[target] : NAN;
    }
}

// The mean over valid rows: one block adds the row losses in a fixed order.
__global__ void __launch_bounds__(1024)
mean_kernel(const float* __restrict__ row_losses, const int64_t* __restrict__ counts, float* __restrict__ loss,
            int64_t N) {
    float sum = 0.0f;
    for (int64_t i = threadIdx.x; i < N; i += 1024) sum += row_losses[i];
    sum = block_reduce_sum(sum);
    if (threadIdx.x == 0) *loss = sum / float(counts[0]);
}

cudaError_t cross_entropy_custom_forward(const float* logits, const int64_t* targets, const int64_t* counts,
                                         float* row_losses, float* row_max, float* row_log_sum, float* loss,
                                         int64_t N, int64_t C, cudaStream_t stream) {
    int32_rows_kernel<<<N, THREADS, 0, stream>>>(logits, targets, row_losses, row_max, row_log_sum, C);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    mean_kernel<<<1, 1024, 0, stream>>>(row_losses, counts, loss, N);
    return cudaGetLastError();
}
