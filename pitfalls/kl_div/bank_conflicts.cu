// Pitfall: shared-memory bank conflicts.
//
// Shared memory has 32 banks of 4 bytes: a warp's 32 accesses take one cycle
// when they fall in 32 different banks. Here each thread stores its sum into a
// permuted slot, lanes of a warp 8 floats apart: their addresses fall in only
// 4 banks, so one store instruction is replayed 8 times (8-way conflict). The
// values are right (the tree still adds all 256 slots once); the cost shows in
// Nsight Compute's l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum.
// Otherwise this is the shared_memory rung.
#include "common/sum_partials.cuh"
#include "kl_div/kl_div.cuh"
#include "kl_div/elementwise_backward.cuh"
#include "kl_div/launchers.h"

constexpr int THREADS = 256;

__global__ void __launch_bounds__(THREADS)
pitfall_bank_conflicts_kernel(const float* __restrict__ predictions,  // (B, D)
                                    const float* __restrict__ targets,      // (B, D)
                                    float* __restrict__ row_partials,       // (B,)
                                    int64_t D) {
    __shared__ float partial[THREADS];
    const int64_t row_start = blockIdx.x * D;
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < D; j += THREADS)
        sum += kl_div_term(predictions[row_start + j], targets[row_start + j]);
    partial[(threadIdx.x % 32) * 8 + threadIdx.x / 32] = sum;  // PITFALL: lanes 8 floats apart, 4 banks
    __syncthreads();
    for (int stride = THREADS / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
        __syncthreads();
    }
    if (threadIdx.x == 0) row_partials[blockIdx.x] = partial[0];
}

cudaError_t kl_div_custom_forward(const void* predictions, const void* targets, float* row_partials,
                                         void* loss, void* /*grad_predictions: not fused*/, int64_t B, int64_t D,
                                         DType dtype, cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // a teaching rung: float32 only
    pitfall_bank_conflicts_kernel<<<B, THREADS, 0, stream>>>(static_cast<const float*>(predictions),
                                                                   static_cast<const float*>(targets),
                                                                   row_partials, D);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    return launch_sum_partials(row_partials, B, float(B), loss, stream);
}
