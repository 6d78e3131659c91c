// A wrong answer to the coalesce exercise, test data for tests/test_exercises.py: every element is added
// once, but each thread reads its own contiguous chunk of the row: a warp's 32 loads touch 32 cache lines.
//
// naive gives each thread a whole row: at step j the 32 lanes of a warp read
// p[k*D + j] for k = 0..31, addresses D floats apart, so one load touches 32
// cache lines. Here each row gets a block of THREADS threads instead, and
// thread k must read elements k, k + THREADS, k + 2*THREADS, ... of its row:
// then the 32 lanes of a warp read 32 consecutive floats, one 128-byte line.
// The block's tree reduction and the second stage are written for you.
#include "kl_div/kl_div.cuh"
#include "common/sum_partials.cuh"
#include "kl_div/launchers.h"

constexpr int THREADS = 256;

__global__ void __launch_bounds__(THREADS)
coalesced_forward_kernel(const float* __restrict__ predictions,  // (B, D)
                         const float* __restrict__ targets,      // (B, D)
                         float* __restrict__ row_partials,       // (B,)
                         int64_t D) {
    __shared__ float partial[THREADS];
    const int64_t row_start = blockIdx.x * D;  // this block's row
    float sum = 0.0f;
    // wrong: each thread walks its own contiguous chunk; lanes of a warp read `chunk` floats apart
    const int64_t chunk = (D + THREADS - 1) / THREADS, first = threadIdx.x * chunk;
    for (int64_t j = first; j < min(first + chunk, D); ++j)
        sum += kl_div_term(predictions[row_start + j], targets[row_start + j]);

    partial[threadIdx.x] = sum;
    __syncthreads();
    for (int stride = THREADS / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
        __syncthreads();
    }
    if (threadIdx.x == 0) row_partials[blockIdx.x] = partial[0];
}

cudaError_t kl_div_custom_forward(const void* predictions_, const void* targets_, float* row_partials,
                                  void* loss, void* /*grad_predictions: not fused*/, int64_t B, int64_t D,
                                  DType dtype, cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // float32 only
    const float* predictions = static_cast<const float*>(predictions_);
    const float* targets = static_cast<const float*>(targets_);
    coalesced_forward_kernel<<<B, THREADS, 0, stream>>>(predictions, targets, row_partials, D);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    return launch_sum_partials(row_partials, B, float(B), loss, stream);
}
