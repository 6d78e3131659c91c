// Device code of smooth_l1_loss's operators (options.h gives the formulas): grid-stride passes
// over the flat tensors, UNROLL 16-byte packs per tensor in flight where every tensor a
// pass touches has the same offset from a 16-byte boundary (a scalar head before it;
// scalar loads throughout otherwise), as many blocks as the SMs hold at once (at most
// SMOOTH_L1_LOSS_MAX_BLOCKS), each writing one partial sum that the last block to finish adds
// in a fixed order (common/last_block.cuh: no float atomicAdd, bitwise repeatable).
// The including rung file declares THREADS and UNROLL first (its launch knobs); all of it is in an
// anonymous namespace, so each rung's kernels are its own, built with its own knobs.
#pragma once
#include <algorithm>
#include "common/grid.cuh"
#include "common/vector_load.cuh"
#include "common/last_block.cuh"
#include "common/reduce.cuh"
#include "common/stream_workspace.cuh"
#include "smooth_l1_loss/smooth_l1_loss.cuh"
#include "smooth_l1_loss/options.h"

namespace {

constexpr int BLOCKS_PER_SM = 1024 / THREADS;  // 1024 threads an SM: at most 64 registers a thread

// The forward: the terms (reduction none) or their sum / divisor; with grad, also
// dL/dinput = factor * slope(input - target) / divisor for grad_loss = 1.
template <typename T>
__global__ void __launch_bounds__(THREADS, BLOCKS_PER_SM)
smooth_l1_loss_forward_kernel(const T* __restrict__ input,     // (n,)
                        const T* __restrict__ target,    // (n,)
                        float* __restrict__ partials,    // (gridDim.x,)
                        unsigned int* __restrict__ ticket,  // () zero before the launch and after
                        T* __restrict__ loss,            // ()
                        T* __restrict__ terms,           // (n,) or null
                        T* __restrict__ grad,            // (n,) or null
                        int64_t n, float divisor, float beta, float factor) {
    constexpr int V = Pack<T>::size;
    const float grad_scale = factor / divisor, inv_beta = beta > 0.0f ? 1.0f / beta : 0.0f;
    const int64_t stride = int64_t(gridDim.x) * THREADS;
    const int64_t first = blockIdx.x * int64_t(THREADS) + threadIdx.x;
    const int64_t found = common_head(n, input, target, terms, grad, sizeof(T));
    const int64_t head = found < 0 ? n : found, packs = found < 0 ? 0 : (n - head) / V;
    float sum = 0.0f;
    auto one = [&](int64_t i) {
        const float d = to_float(input[i]) - to_float(target[i]);
        const float term = factor * smooth_l1(d, beta, inv_beta);
        if (terms) terms[i] = from_float<T>(term);
        else sum += term;
        if (grad) grad[i] = from_float<T>(smooth_l1_slope(d, beta, inv_beta) * grad_scale);
    };
    auto pack = [&](const Pack<T>& xp, const Pack<T>& tp, int64_t i0) {
        float d[V], term[V];
#pragma unroll
        for (int e = 0; e < V; ++e) d[e] = xp[e] - tp[e], term[e] = factor * smooth_l1(d[e], beta, inv_beta);
        if (terms) {
            store_pack(terms + i0, pack_of<T>(term));
        } else {
#pragma unroll
            for (int e = 0; e < V; ++e) sum += term[e];
        }
        if (grad) {
#pragma unroll
            for (int e = 0; e < V; ++e) d[e] = smooth_l1_slope(d[e], beta, inv_beta) * grad_scale;
            store_pack(grad + i0, pack_of<T>(d));
        }
    };
    for (int64_t i = first; i < head; i += stride) one(i);
    int64_t k = first;
    for (; k + (UNROLL - 1) * stride < packs; k += UNROLL * stride) {
        Pack<T> xp[UNROLL], tp[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)  // all loads in flight before any use
            xp[u] = load_pack(input + head + V * (k + u * stride)),
            tp[u] = load_pack(target + head + V * (k + u * stride));
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) pack(xp[u], tp[u], head + V * (k + u * stride));
    }
    for (; k < packs; k += stride)
        pack(load_pack(input + head + V * k), load_pack(target + head + V * k), head + V * k);
    for (int64_t i = head + V * packs + first; i < n; i += stride) one(i);
    if (terms) return;  // the whole grid takes this branch
    finish_sum(block_reduce_sum(sum), partials, ticket, divisor, loss);
}

// The forward of both rungs, one kernel for elements of type T: the terms (reduction
// none) or the 0-d loss (the last block adds the partial sums); the gradient for
// grad_loss = 1 too when grad_input is given.
template <typename T>
cudaError_t smooth_l1_loss_forward_launch(const void* input, const void* target, float* partials, void* loss,
                                    void* elementwise, void* grad_input, int64_t n, float divisor, float beta,
                                    float factor, cudaStream_t stream) {
    unsigned int* ticket = nullptr;  // reduction none draws none
    const cudaError_t err = elementwise ? cudaSuccess
        : stream_workspace(stream, partials + SMOOTH_L1_LOSS_MAX_BLOCKS, sizeof(unsigned int),
                           reinterpret_cast<void**>(&ticket));
    if (err != cudaSuccess) return err;
    const int64_t blocks = one_wave_blocks(int64_t(THREADS) * Pack<T>::size * UNROLL, n, BLOCKS_PER_SM,
                                                 SMOOTH_L1_LOSS_MAX_BLOCKS);
    smooth_l1_loss_forward_kernel<T><<<blocks, THREADS, 0, stream>>>(
        static_cast<const T*>(input), static_cast<const T*>(target), partials, ticket, static_cast<T*>(loss),
        static_cast<T*>(elementwise), static_cast<T*>(grad_input), n, divisor, beta, factor);
    return cudaGetLastError();
}

}  // namespace
