// gradient: Megatron-style code keeps the softmax it formed in the forward and turns it
// into the gradient in the backward, a second full tensor held between the two. Here the
// forward saved only two floats per row, the global max and log of the global sum, so
// the backward re-reads this rank's slice once and writes its gradient once, with no
// collective: every term of softmax(x)_j = exp(x_j - max - log_sum) is local. The loop
// is the ladder's fused gradient (kernels/cross_entropy/ladder/fused.cu) with 16-byte
// packs of any dtype and label smoothing's uniform term.
#include "common/dispatch.cuh"
#include "common/row_split.cuh"
#include "common/vector_load.cuh"
#include "vocab_parallel/launchers.h"

namespace {

constexpr int THREADS = 256;

template <typename T>
__global__ void __launch_bounds__(THREADS)
gradient_kernel(const T* __restrict__ logits,          // (N, V) this rank's slice
                const int64_t* __restrict__ targets,    // (N,) global class ids
                const float* __restrict__ row_max,      // (N,)
                const float* __restrict__ row_log_sum,  // (N,)
                const float* __restrict__ row_weight,   // (N,)
                const T* __restrict__ grad_loss,        // () or (N,)
                int64_t grad_loss_stride, T* __restrict__ grad_logits, int64_t V, int64_t vocab_start,
                float target_weight, float smoothing_per_class) {
    constexpr int P = Pack<T>::size;
    const int64_t row = blockIdx.x;  // one block per row
    const float weight = row_weight[row];
    // an ignored row writes zeros whatever grad_loss holds, as PyTorch does
    const float scale = weight == 0.0f ? 0.0f : weight * to_float(grad_loss[row * grad_loss_stride]);
    const float m = row_max[row], log_sum = row_log_sum[row];  // (x - m) - log_sum: exact near the max
    const int64_t local = targets[row] - vocab_start;  // outside [0, V) when another rank holds the target
    const T* x = logits + row * V;
    T* g = grad_logits + row * V;
    auto grad = [&](float v, int64_t j) {
        return (__expf((v - m) - log_sum) - (j == local ? target_weight : 0.0f) - smoothing_per_class) * scale;
    };
    const RowSplit s = split_row(V, x, g);  // no packs unless x and g are equally aligned
#pragma unroll 4
    for (int64_t k = threadIdx.x; k < s.packs; k += THREADS) {
        const int64_t j = s.head + k * P;
        const Pack<T> p = load_pack(x + j);
        float out[P];
#pragma unroll
        for (int i = 0; i < P; ++i) out[i] = grad(p[i], j + i);
        store_pack(g + j, pack_of<T>(out));
    }
    for (int64_t j = threadIdx.x; j < s.head; j += THREADS) g[j] = from_float<T>(grad(to_float(x[j]), j));
    for (int64_t j = s.head + P * s.packs + threadIdx.x; j < V; j += THREADS)
        g[j] = from_float<T>(grad(to_float(x[j]), j));
}

}  // namespace

cudaError_t vocab_parallel_gradient(const void* logits, const int64_t* targets, const float* row_max,
                                    const float* row_log_sum, const float* row_weight, const void* grad_loss,
                                    int64_t grad_loss_stride, void* grad_logits, int64_t N, int64_t V,
                                    int64_t vocab_start, float target_weight, float smoothing_per_class, DType dtype,
                                    cudaStream_t stream) {
    if (N == 0) return cudaSuccess;
    return dispatch_dtype(dtype, [&](auto tag) {
        using T = decltype(tag);
        gradient_kernel<T><<<N, THREADS, 0, stream>>>(
            static_cast<const T*>(logits), targets, row_max, row_log_sum, row_weight, static_cast<const T*>(grad_loss),
            grad_loss_stride, static_cast<T*>(grad_logits), V, vocab_start, target_weight, smoothing_per_class);
        return cudaGetLastError();
    });
}
