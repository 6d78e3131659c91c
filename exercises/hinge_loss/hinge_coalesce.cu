// Exercise 15 -- coalesce naive's row loop, rows in turn (hinge_loss's shared_memory rung).
//
// naive gives each thread a whole row: at step j the 32 lanes of a warp read
// p[k*D + j] for k = 0..31, addresses D floats apart, so one load touches 32
// cache lines; and only B threads exist. Here a grid of min(B, 1024) blocks
// of THREADS threads shares the work: block b takes rows b, b + gridDim.x,
// ..., and the block's threads share each of its rows.
//
// Contract of the loops you write: after them, `sum` holds this thread's
// share of hinge_term(hinge_margin(p_ij, t_j)) over its block's rows (targets
// is (D,): t_j multiplies column j of every row); over the grid every element
// is added exactly once (any B, any D, including D < THREADS); and at each
// step the 32 lanes of a warp read 32 consecutive floats of a row (one
// 128-byte line). The block's tree and the second stage (one partial per
// block) are written for you.
//
// Grade it from the shell: python -m losslab grade exercises/hinge_loss/hinge_coalesce.cu
// (in Python: losslab.teach.exercises.grade("hinge_coalesce")). Done when it is green.
#include <algorithm>
#include "hinge_loss/hinge_loss.cuh"
#include "common/sum_partials.cuh"
#include "hinge_loss/launchers.h"

constexpr int THREADS = 256;

__global__ void __launch_bounds__(THREADS)
coalesced_forward_kernel(const float* __restrict__ predictions,  // (B, D)
                         const float* __restrict__ targets,      // (D,)
                         float* __restrict__ partials,           // (gridDim.x,)
                         int64_t B, int64_t D) {
    __shared__ float partial[THREADS];
    float sum = 0.0f;
    // naive's loop, one thread walking row `row` alone:
    //     for (int64_t j = 0; j < D; ++j)
    //         sum += hinge_term(hinge_margin(predictions[row * D + j], targets[j]));
    // FILL ME IN (roughly 3 lines): the block's rows, and its threads' share of each (contract above).

    partial[threadIdx.x] = sum;
    __syncthreads();
    for (int stride = THREADS / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
        __syncthreads();
    }
    if (threadIdx.x == 0) partials[blockIdx.x] = partial[0];
}

cudaError_t hinge_loss_custom_forward(const void* predictions_, const void* targets_, float* partials,
                                      void* loss, void* /*grad_predictions: not fused*/, int64_t B, int64_t D,
                                      DType dtype, cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // float32 only
    const float* predictions = static_cast<const float*>(predictions_);
    const float* targets = static_cast<const float*>(targets_);
    const int64_t blocks = std::min<int64_t>(B, HINGE_LOSS_MAX_PARTIALS);  // rows in turn
    coalesced_forward_kernel<<<blocks, THREADS, 0, stream>>>(predictions, targets, partials, B, D);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    return launch_sum_partials(partials, blocks, float(B) * float(D), loss, stream);  // the mean over B D
}
