// Device code of kl_div's options (options.h gives the formulas): one grid-stride
// pass over the flat tensors, 16-byte packs where every tensor it touches has the
// same offset from a 16-byte boundary (scalar loads otherwise), at most
// KL_DIV_OPTIONS_MAX_BLOCKS blocks, each writing one partial sum that the last
// block to finish adds in a fixed order (common/last_block.cuh: no float atomicAdd).
#pragma once
#include <algorithm>
#include "common/dispatch.cuh"
#include "common/reduce.cuh"
#include "common/last_block.cuh"
#include "common/stream_workspace.cuh"
#include "common/xlogy.cuh"
#include "kl_div/options.h"

constexpr int KL_OPTIONS_THREADS = 256;

// x = input, or log(input) without log_input (the log as the rungs take it, kl_div.cuh).
__device__ __forceinline__ float kl_options_term(float input, float t, bool log_target, bool log_input) {
    const float x = log_input ? input : fast_log(input);
    return log_target ? expf(t) * (t - x) : xlogy(t, t) - t * x;
}

// dterm/dx = -t (or -exp(t)): with log-probabilities the input is not needed; without,
// dterm/dinput = dterm/dx / input, in float32, so a 16-bit gradient does not underflow in
// between as PyTorch's through torch.log does. __fdividef as the rungs' (kl_div.cuh says why).
__device__ __forceinline__ float kl_options_grad(float input, float t, bool log_target, bool log_input,
                                                 float scale) {
    const float grad_x = -(log_target ? expf(t) : t) * scale;
    return log_input ? grad_x : __fdividef(grad_x, input);
}

template <typename T>
__global__ void __launch_bounds__(KL_OPTIONS_THREADS)
kl_div_options_forward_kernel(const T* __restrict__ input, const T* __restrict__ target,
                              float* __restrict__ partials,  // (gridDim.x,)
                              unsigned int* __restrict__ ticket,  // () zero before the launch and after
                              T* __restrict__ loss,          // ()
                              T* __restrict__ terms,         // (n,) or null
                              T* __restrict__ grad,          // (n,) or null
                              int64_t n, bool log_target, bool log_input, float divisor) {
    const float grad_scale = 1.0f / divisor;
    constexpr int V = Pack<T>::size;
    const int64_t stride = int64_t(gridDim.x) * KL_OPTIONS_THREADS;
    const int64_t first = blockIdx.x * int64_t(KL_OPTIONS_THREADS) + threadIdx.x;
    const int64_t found = common_head(n, input, target, terms, grad, sizeof(T));
    const int64_t head = found < 0 ? n : found, packs = found < 0 ? 0 : (n - head) / V;
    float sum = 0.0f;
    auto one = [&](int64_t i) {
        const float x = to_float(input[i]), t = to_float(target[i]);
        const float term = kl_options_term(x, t, log_target, log_input);
        if (terms) terms[i] = from_float<T>(term);
        else sum += term;
        if (grad) grad[i] = from_float<T>(kl_options_grad(x, t, log_target, log_input, grad_scale));
    };
    for (int64_t i = first; i < head; i += stride) one(i);
    for (int64_t k = first; k < packs; k += stride) {
        const int64_t i0 = head + V * k;
        const Pack<T> xp = load_pack(input + i0), tp = load_pack(target + i0);
        float tf[V], gf[V];
#pragma unroll
        for (int e = 0; e < V; ++e) {
            tf[e] = kl_options_term(xp[e], tp[e], log_target, log_input);
            gf[e] = kl_options_grad(xp[e], tp[e], log_target, log_input, grad_scale);
        }
        if (terms) {
            Pack<T> out;
            out.raw = make_uint4(0, 0, 0, 0);
#pragma unroll
            for (int e = 0; e < V; ++e) out.set(e, tf[e]);
            store_pack(terms + i0, out);
        } else {
#pragma unroll
            for (int e = 0; e < V; ++e) sum += tf[e];
        }
        if (grad) {
            Pack<T> out;
            out.raw = make_uint4(0, 0, 0, 0);
#pragma unroll
            for (int e = 0; e < V; ++e) out.set(e, gf[e]);
            store_pack(grad + i0, out);
        }
    }
    for (int64_t i = head + V * packs + first; i < n; i += stride) one(i);
    if (terms) return;  // the whole grid takes this branch
    finish_sum(block_reduce_sum(sum), partials, ticket, divisor, loss);
}

// The forward of both rungs, one kernel: the terms (reduction none) or the 0-d loss
// (the last block adds the partial sums); the gradient for grad_loss = 1 too when
// grad_input is given.
inline cudaError_t kl_div_options_launch(const void* input, const void* target, float* partials, void* loss,
                                         void* elementwise, void* grad_input, int64_t n, int log_target,
                                         int log_input, float divisor, DType dtype, cudaStream_t stream) {
    unsigned int* ticket = nullptr;  // reduction none draws none
    const cudaError_t err = elementwise ? cudaSuccess
        : stream_workspace(stream, partials + KL_DIV_OPTIONS_MAX_BLOCKS, sizeof(unsigned int),
                           reinterpret_cast<void**>(&ticket));
    if (err != cudaSuccess) return err;
    return dispatch_dtype(dtype, [&](auto tag) {
        using T = decltype(tag);
        const int64_t per_block = int64_t(KL_OPTIONS_THREADS) * Pack<T>::size;
        const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>((n + per_block - 1) / per_block,
                                                                      KL_DIV_OPTIONS_MAX_BLOCKS));
        kl_div_options_forward_kernel<T><<<blocks, KL_OPTIONS_THREADS, 0, stream>>>(
            static_cast<const T*>(input), static_cast<const T*>(target), partials, ticket, static_cast<T*>(loss),
            static_cast<T*>(elementwise), static_cast<T*>(grad_input), n, log_target != 0, log_input != 0, divisor);
        return cudaGetLastError();
    });
}
