// vectorized: warp_shuffle's structure with 128-bit loads. Each thread issues
// UNROLL 16-byte loads per tensor before using any of them: four floats (or
// eight bf16/fp16 values) per instruction. It pays where warp_shuffle kept one
// element per thread in flight (its backward); its forward loop was already
// unrolled by the compiler into four independent scalar loads, so there it is flat.
// A scalar head and tail handle rows that do not start or end on a 16-byte
// boundary (odd D, or a slice with a storage offset).
#include <algorithm>
#include "common/dispatch.cuh"
#include "common/last_block.cuh"
#include "common/reduce.cuh"
#include "common/row_split.cuh"
#include "common/stream_workspace.cuh"
#include "kl_div/kl_div.cuh"
#include "kl_div/launchers.h"
#include "kl_div/options.cuh"

// Launch knobs (losslab/build/knobs.py): -DLOSSLAB_KL_DIV_VECTORIZED_<KNOB>=<value> builds another one.
#ifndef LOSSLAB_KL_DIV_VECTORIZED_THREADS
#define LOSSLAB_KL_DIV_VECTORIZED_THREADS 256  // threads per block: 32 64 128 256 512 1024
#endif
#ifndef LOSSLAB_KL_DIV_VECTORIZED_UNROLL
#define LOSSLAB_KL_DIV_VECTORIZED_UNROLL 4  // 16-byte loads in flight per tensor: 1 2 4 8 16
#endif
constexpr int THREADS = LOSSLAB_KL_DIV_VECTORIZED_THREADS;
constexpr int UNROLL = LOSSLAB_KL_DIV_VECTORIZED_UNROLL;
static_assert(THREADS >= 32 && THREADS <= 1024 && THREADS % 32 == 0,
              "LOSSLAB_KL_DIV_VECTORIZED_THREADS: a multiple of 32 from 32 to 1024 (whole warps)");
static_assert(UNROLL >= 1, "LOSSLAB_KL_DIV_VECTORIZED_UNROLL: at least 1");

template <typename T>
__global__ void __launch_bounds__(THREADS)
kl_div_vectorized_forward_kernel(const T* __restrict__ predictions,  // (B, D)
                                 const T* __restrict__ targets,      // (B, D)
                                 float* __restrict__ row_partials,   // (B,)
                                 unsigned int* __restrict__ ticket,  // () zero before the launch and after
                                 T* __restrict__ loss,               // ()
                                 int64_t D) {
    constexpr int V = Pack<T>::size;
    const T* p = predictions + blockIdx.x * D;
    const T* t = targets + blockIdx.x * D;
    // Packs need both rows at the same offset from a 16-byte boundary;
    // otherwise the whole row goes through the scalar tail loop.
    const RowSplit split = split_row(D, p, t);
    const int64_t head = split.head, packs = split.packs;
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < head; j += THREADS)
        sum += kl_div_term(to_float(p[j]), to_float(t[j]));

    const T* pv = p + head;
    const T* tv = t + head;
    float sum_log2 = 0.0f;  // the packs' terms in log2 units: times LN2 once, below
    int64_t i = threadIdx.x;
    for (; i + (UNROLL - 1) * THREADS < packs; i += UNROLL * THREADS) {
        Pack<T> pb[UNROLL], tb[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            pb[u] = load_pack(pv + V * (i + u * THREADS));
            tb[u] = load_pack(tv + V * (i + u * THREADS));
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
#pragma unroll
            for (int k = 0; k < V; ++k) sum_log2 += kl_div_term_log2(pb[u][k], tb[u][k]);
    }
    for (; i < packs; i += THREADS) {
        const Pack<T> pb = load_pack(pv + V * i), tb = load_pack(tv + V * i);
#pragma unroll
        for (int k = 0; k < V; ++k) sum_log2 += kl_div_term_log2(pb[k], tb[k]);
    }
    sum = fmaf(sum_log2, LN2, sum);
    for (int64_t j = head + V * packs + threadIdx.x; j < D; j += THREADS)
        sum += kl_div_term(to_float(p[j]), to_float(t[j]));

    // The block's sum, then the last block to finish writes the loss: one kernel, no second stage.
    finish_sum(block_reduce_sum(sum), row_partials, ticket, float(gridDim.x), loss);
}

// Element-wise gradient over the flat tensor, one pack of each tensor per
// thread; the first n % V threads also finish the scalar tail.
template <typename T>
__global__ void __launch_bounds__(THREADS)
kl_div_vectorized_backward_kernel(const T* __restrict__ predictions,  // (B, D)
                                  const T* __restrict__ targets,      // (B, D)
                                  const T* __restrict__ grad_loss,    // ()
                                  T* __restrict__ grad_predictions,   // (B, D)
                                  int64_t n, float B) {
    constexpr int V = Pack<T>::size;
    const float scaled_grad = to_float(*grad_loss) / B;
    const int64_t i = blockIdx.x * int64_t(THREADS) + threadIdx.x;
    if (i < n / V) {
        const Pack<T> p = load_pack(predictions + V * i), t = load_pack(targets + V * i);
        float g[V];
#pragma unroll
        for (int k = 0; k < V; ++k) g[k] = kl_div_grad(p[k], t[k], scaled_grad);
        store_pack(grad_predictions + V * i, pack_of<T>(g));
    }
    const int64_t tail = n / V * V + i;
    if (tail < n)
        grad_predictions[tail] = from_float<T>(
            kl_div_grad(to_float(predictions[tail]), to_float(targets[tail]), scaled_grad));
}

// The fallback for inputs that are not 16-byte aligned: one element per thread.
template <typename T>
__global__ void __launch_bounds__(THREADS)
kl_div_scalar_backward_kernel(const T* __restrict__ predictions, const T* __restrict__ targets,
                              const T* __restrict__ grad_loss, T* __restrict__ grad_predictions,
                              int64_t n, float B) {
    const float scaled_grad = to_float(*grad_loss) / B;
    const int64_t stride = int64_t(gridDim.x) * THREADS;
    for (int64_t i = blockIdx.x * int64_t(THREADS) + threadIdx.x; i < n; i += stride)
        grad_predictions[i] = from_float<T>(
            kl_div_grad(to_float(predictions[i]), to_float(targets[i]), scaled_grad));
}

// One kernel (the last block writes the loss); its ticket is the stream's (stream_workspace.cuh).
cudaError_t kl_div_vectorized_forward(const void* predictions, const void* targets, float* row_partials,
                                      void* loss, void* /*grad_predictions: not fused*/, int64_t B, int64_t D,
                                      DType dtype, cudaStream_t stream) {
    unsigned int* ticket;
    const cudaError_t err = stream_workspace(stream, row_partials + B, sizeof(unsigned int),
                                             reinterpret_cast<void**>(&ticket));
    if (err != cudaSuccess) return err;
    return dispatch_dtype(dtype, [&](auto tag) {
        using T = decltype(tag);
        kl_div_vectorized_forward_kernel<T><<<B, THREADS, 0, stream>>>(
            static_cast<const T*>(predictions), static_cast<const T*>(targets), row_partials, ticket,
            static_cast<T*>(loss), D);
        return cudaGetLastError();
    });
}

cudaError_t kl_div_vectorized_backward(const void* predictions, const void* targets,
                                       const void* grad_loss, void* grad_predictions, int64_t B,
                                       int64_t D, DType dtype, cudaStream_t stream) {
    const int64_t n = B * D;
    return dispatch_dtype(dtype, [&](auto tag) {
        using T = decltype(tag);
        const T* p = static_cast<const T*>(predictions);
        const T* t = static_cast<const T*>(targets);
        const T* scale = static_cast<const T*>(grad_loss);
        T* g = static_cast<T*>(grad_predictions);
        if (is_aligned_16(p) && is_aligned_16(t) && is_aligned_16(g)) {
            const int64_t blocks = (n / Pack<T>::size + THREADS) / THREADS;  // >= 1 for the tail
            kl_div_vectorized_backward_kernel<T><<<blocks, THREADS, 0, stream>>>(p, t, scale, g, n, float(B));
        } else {
            const int64_t blocks = std::min<int64_t>((n + THREADS - 1) / THREADS, 1 << 20);
            kl_div_scalar_backward_kernel<T><<<blocks, THREADS, 0, stream>>>(p, t, scale, g, n, float(B));
        }
        return cudaGetLastError();
    });
}

// --- PyTorch's options (options.h): log-probability input (probabilities without
// log_input), log_target, any shape, reductions none/sum/mean/batchmean. Flat grid-stride
// passes (options.cuh).

template <typename T>
__global__ void __launch_bounds__(KL_OPTIONS_THREADS)
kl_div_options_backward_kernel(const T* __restrict__ input,  // (n,), read without log_input only
                               const T* __restrict__ target, const T* __restrict__ grad_loss,
                               const T* __restrict__ grad_terms,  // (n,) or null
                               T* __restrict__ grad, int64_t n, bool log_target, bool log_input, float divisor) {
    constexpr int V = Pack<T>::size;
    const float scale = grad_terms ? 0.0f : to_float(*grad_loss) / divisor;
    const int64_t stride = int64_t(gridDim.x) * KL_OPTIONS_THREADS;
    const int64_t first = blockIdx.x * int64_t(KL_OPTIONS_THREADS) + threadIdx.x;
    const int64_t found = common_head(n, target, grad_terms, grad, log_input ? nullptr : input, sizeof(T));
    const int64_t head = found < 0 ? n : found, packs = found < 0 ? 0 : (n - head) / V;
    auto one = [&](int64_t i) {
        grad[i] = from_float<T>(kl_options_grad(log_input ? 0.0f : to_float(input[i]), to_float(target[i]),
                                                log_target, log_input,
                                                grad_terms ? to_float(grad_terms[i]) : scale));
    };
    for (int64_t i = first; i < head; i += stride) one(i);
    for (int64_t k = first; k < packs; k += stride) {
        const int64_t i0 = head + V * k;
        const Pack<T> tp = load_pack(target + i0);
        Pack<T> up, xp, out;
        up.raw = xp.raw = out.raw = make_uint4(0, 0, 0, 0);
        if (grad_terms) up = load_pack(grad_terms + i0);
        if (!log_input) xp = load_pack(input + i0);
        float gf[V];
#pragma unroll
        for (int e = 0; e < V; ++e)
            gf[e] = kl_options_grad(xp[e], tp[e], log_target, log_input, grad_terms ? up[e] : scale);
#pragma unroll
        for (int e = 0; e < V; ++e) out.set(e, gf[e]);
        store_pack(grad + i0, out);
    }
    for (int64_t i = head + V * packs + first; i < n; i += stride) one(i);
}

cudaError_t kl_div_vectorized_options_forward(const void* input, const void* target, float* partials, void* loss,
                                              void* elementwise, void* /*grad_input: not fused*/, int64_t n,
                                              int log_target, int log_input, float divisor, DType dtype,
                                              cudaStream_t stream) {
    return kl_div_options_launch(input, target, partials, loss, elementwise, nullptr, n, log_target, log_input,
                                 divisor, dtype, stream);
}

cudaError_t kl_div_vectorized_options_backward(const void* input, const void* target, const void* grad_loss,
                                               const void* grad_terms, void* grad_input, int64_t n, int log_target,
                                               int log_input, float divisor, DType dtype, cudaStream_t stream) {
    if (!log_input && input == nullptr) return cudaErrorInvalidValue;
    return dispatch_dtype(dtype, [&](auto tag) {
        using T = decltype(tag);
        const int64_t per_block = int64_t(KL_OPTIONS_THREADS) * Pack<T>::size;
        const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>((n + per_block - 1) / per_block, 1 << 16));
        kl_div_options_backward_kernel<T><<<blocks, KL_OPTIONS_THREADS, 0, stream>>>(
            static_cast<const T*>(input), static_cast<const T*>(target), static_cast<const T*>(grad_loss),
            static_cast<const T*>(grad_terms), static_cast<T*>(grad_input), n, log_target != 0, log_input != 0,
            divisor);
        return cudaGetLastError();
    });
}
