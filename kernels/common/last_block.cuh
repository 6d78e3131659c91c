// A reduction in one kernel: every block publishes its partial sum, and the
// block that finishes last (it draws the last ticket) adds them all in a fixed
// order -- CUDA's threadFenceReduction sample. No float atomicAdd: the result
// is bitwise the same every run. The ticket is zero before the launch and zero
// again after it (atomicInc wraps it when the last block draws), so it lives in
// the stream's workspace (common/stream_workspace.cuh), never in a global that
// two streams or two captured graphs would share.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>
#include "common/reduce.cuh"
#include "common/vector_load.cuh"

// Every thread of every publishing block calls it once, at the end (no thread
// may have left the kernel). Thread 0 stores its `partial` in partials[index]
// and draws a ticket; true in every thread of the block that drew the last of
// `publishers` tickets, when every partial (and whatever thread 0 wrote before)
// is visible. By default every block publishes, one partial each.
__device__ __forceinline__ bool publish_partial(float partial, float* partials, unsigned int* ticket,
                                                unsigned int index, unsigned int publishers) {
    __shared__ bool last;
    if (threadIdx.x == 0) {
        partials[index] = partial;
        __threadfence();  // the partial reaches the whole grid before the ticket does
        last = atomicInc(ticket, publishers - 1) == publishers - 1;  // the last draw stores 0
    }
    __syncthreads();
    return last;
}

// partials[0, n) added in a fixed order (thread i takes i, i + blockDim.x, ...,
// then one block reduction); every thread gets the sum. Loads go to L2 (__ldcg):
// other blocks wrote them during this kernel. 16-byte loads where aligned, four
// in flight: one block reads them all while the rest of the GPU may be idle.
__device__ __forceinline__ float sum_in_order(const float* partials, int64_t n) {
    float sum = 0.0f;
    int64_t i = threadIdx.x;
    if (is_aligned_16(partials)) {
        const float4* packs = reinterpret_cast<const float4*>(partials);
#pragma unroll 4
        for (; i < n / 4; i += blockDim.x) {
            const float4 v = __ldcg(packs + i);
            sum += (v.x + v.y) + (v.z + v.w);
        }
        i = n / 4 * 4 + threadIdx.x;
    }
    for (; i < n; i += blockDim.x) sum += __ldcg(partials + i);
    return block_reduce_sum(sum);
}

// The end of a forward whose loss is the sum of the blocks' partials / divisor:
// the last block writes it, in the inputs' dtype T.
template <typename T>
__device__ __forceinline__ void finish_sum(float partial, float* partials, unsigned int* ticket, float divisor,
                                           T* result) {
    if (!publish_partial(partial, partials, ticket, blockIdx.x, gridDim.x)) return;
    const float sum = sum_in_order(partials, gridDim.x);
    if (threadIdx.x == 0) *result = from_float<T>(sum / divisor);
}
