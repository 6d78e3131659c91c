// vectorized: 16-byte float4 loads, several in flight, with a scalar head and tail.
// flaw of warp_shuffle: a load moves 4 bytes, and its backward keeps one element per thread
//     in flight (a grid-stride loop the compiler cannot batch).
// idea: one LDG.E.128 moves four floats: the forward issues UNROLL of them per tensor before
//     using any, the backward one per tensor and thread. A float4 needs a 16-byte aligned
//     address, which a row may lack (odd D, a view one element into its storage): a scalar
//     head up to the first boundary, a scalar tail after the last float4 (common/row_split.cuh).
// not faster: forward (the compiler may already unroll warp_shuffle's short loop body into
//     several loads, enough for DRAM, as it did for kl_div's)
// diff bound: 55 lines (head, float4 packs and tail come twice: in the forward and the backward)
#include "common/row_split.cuh"
#include "common/sum_partials.cuh"
#include "smooth_l1_loss/smooth_l1_loss.cuh"
#include "smooth_l1_loss/ladder/ladder.h"

namespace {

constexpr int THREADS = 256;
constexpr int UNROLL = 4;  // float4 loads in flight per tensor and thread in the forward

// A warp's 32 values summed by butterfly exchanges between registers: after 5 steps of
// __shfl_xor_sync (offsets 16, 8, 4, 2, 1) every lane holds the sum. No shared memory.
__device__ __forceinline__ float warp_sum(float value) {
    for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
    return value;
}

// The block's sum, in thread 0: each warp sums its lanes, lane 0 of each warp writes one
// shared slot, and after one barrier warp 0 sums the THREADS / 32 slots.
__device__ __forceinline__ float block_sum(float value) {
    __shared__ float partial[THREADS / 32];
    value = warp_sum(value);
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = value;
    __syncthreads();
    return threadIdx.x < 32 ? warp_sum(threadIdx.x < THREADS / 32 ? partial[threadIdx.x] : 0.0f) : 0.0f;
}

// The sum of four elements' terms, and four elements' gradients.
__device__ __forceinline__ float term4(float4 p, float4 t) {
    return (smooth_l1_term(p.x, t.x) + smooth_l1_term(p.y, t.y))
         + (smooth_l1_term(p.z, t.z) + smooth_l1_term(p.w, t.w));
}

__device__ __forceinline__ float4 grad4(float4 p, float4 t, float scaled_grad) {
    return make_float4(smooth_l1_grad(p.x, t.x, scaled_grad), smooth_l1_grad(p.y, t.y, scaled_grad),
                       smooth_l1_grad(p.z, t.z, scaled_grad), smooth_l1_grad(p.w, t.w, scaled_grad));
}

__global__ void __launch_bounds__(THREADS) forward_kernel(
    const float* __restrict__ predictions,  // (B, D)
    const float* __restrict__ targets,      // (B, D)
    float* __restrict__ row_partials,       // (B,)
    int64_t D) {
    const float* p = predictions + blockIdx.x * D;  // this block's row
    const float* t = targets + blockIdx.x * D;
    const RowSplit split = split_row(D, p, t);  // head, packs; no packs unless p and t share an offset
    const float4* p4 = reinterpret_cast<const float4*>(p + split.head);
    const float4* t4 = reinterpret_cast<const float4*>(t + split.head);
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < split.head; j += THREADS)
        sum += smooth_l1_term(p[j], t[j]);
    int64_t k = threadIdx.x;
    for (; k + (UNROLL - 1) * THREADS < split.packs; k += UNROLL * THREADS) {
        float4 pb[UNROLL], tb[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) pb[u] = p4[k + u * THREADS], tb[u] = t4[k + u * THREADS];  // all in flight
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
            sum += term4(pb[u], tb[u]);
    }
    for (; k < split.packs; k += THREADS) sum += term4(p4[k], t4[k]);
    for (int64_t j = split.head + 4 * split.packs + threadIdx.x; j < D; j += THREADS)
        sum += smooth_l1_term(p[j], t[j]);
    sum = block_sum(sum);
    if (threadIdx.x == 0) row_partials[blockIdx.x] = sum;
}

__global__ void __launch_bounds__(THREADS) backward_kernel(
    const float* __restrict__ predictions,  // (B, D)
    const float* __restrict__ targets,      // (B, D)
    const float* __restrict__ grad_loss,    // ()
    float* __restrict__ grad_predictions,   // (B, D)
    int64_t B, int64_t D) {
    const float scaled_grad = *grad_loss / (float(B) * float(D));
    const int64_t stride = int64_t(gridDim.x) * THREADS, first = blockIdx.x * int64_t(THREADS) + threadIdx.x;
    const RowSplit split = split_row(B * D, predictions, targets, grad_predictions);  // the tensor as one row
    const float4* p4 = reinterpret_cast<const float4*>(predictions + split.head);
    const float4* t4 = reinterpret_cast<const float4*>(targets + split.head);
    float4* g4 = reinterpret_cast<float4*>(grad_predictions + split.head);
    for (int64_t i = first; i < split.head; i += stride)
        grad_predictions[i] = smooth_l1_grad(predictions[i], targets[i], scaled_grad);
    for (int64_t k = first; k < split.packs; k += stride) g4[k] = grad4(p4[k], t4[k], scaled_grad);
    for (int64_t i = split.head + 4 * split.packs + first; i < B * D; i += stride)
        grad_predictions[i] = smooth_l1_grad(predictions[i], targets[i], scaled_grad);
}

}  // namespace

cudaError_t smooth_l1_loss_vectorized_forward(
    const void* predictions,  // (B, D)
    const void* targets,      // (B, D)
    float* row_partials,      // (B + 4,): each row's sum in the first B
    void* loss,               // (): the sum of the rows / (B D)
    void* grad_predictions,   // (B, D): unused (only fused writes the gradient in the forward)
    int64_t B, int64_t D, DType dtype, cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // a teaching rung: float32 only
    const int64_t blocks = B;  // one block per row
    forward_kernel<<<blocks, THREADS, 0, stream>>>(static_cast<const float*>(predictions),
                                                   static_cast<const float*>(targets), row_partials, D);
    const cudaError_t err = cudaGetLastError();
    return err != cudaSuccess ? err : launch_sum_partials(row_partials, B, float(B) * float(D), loss, stream);
}

cudaError_t smooth_l1_loss_vectorized_backward(
    const void* predictions,  // (B, D)
    const void* targets,      // (B, D)
    const void* grad_loss,    // ()
    void* grad_predictions,   // (B, D): written
    int64_t B, int64_t D, DType dtype, cudaStream_t stream) {
    if (dtype != DType::float32) return cudaErrorInvalidValue;  // a teaching rung: float32 only
    const int64_t blocks = (B * D / 4 + THREADS) / THREADS;  // one float4 per thread
    backward_kernel<<<blocks, THREADS, 0, stream>>>(static_cast<const float*>(predictions),
                                                    static_cast<const float*>(targets),
                                                    static_cast<const float*>(grad_loss),
                                                    static_cast<float*>(grad_predictions), B, D);
    return cudaGetLastError();
}
