// The one row kernel of the triplet_margin_loss operators (vectorized.cu and fused.cu launch it):
// a row of (anchor, positive, negative) a block. Each thread loads its first CACHE 16-byte packs
// of the three rows at once and keeps them in registers; the block reduces the squared distances
// |a - p + eps|^2, |a - n + eps|^2 (and |p - n + eps|^2 for swap), each thread then writes the
// gradients of its elements from those registers (rows longer than THREADS * CACHE packs read the
// rest again), and the last block adds the rows' losses in a fixed order (common/last_block.cuh).
// A forward alone (no gradient) reads a row in rounds of CACHE packs a tensor, a row a block
// while that takes a few waves of the blocks the GPU holds at once, else rows in turn on those
// blocks, each block publishing one partial for its rows; inputs that fit in a few L2s with
// evict-first loads (evict_first_fits).
// The formulas and PyTorch's conventions: options.h.
#pragma once
#include <algorithm>
#include <cstdint>
#include <math.h>
#include "common/grid.cuh"
#include "common/last_block.cuh"
#include "common/reduce.cuh"
#include "common/row_split.cuh"
#include "common/stream_workspace.cuh"
#include "common/vector_load.cuh"
#include "triplet_margin_loss/options.h"

// What one launch reads and writes; a null pointer is not read or not written.
template <typename T>
struct TripletRows {
    const T *a, *p, *n;     // (N, D) each
    T *ga, *gp, *gn;        // (N, D) each: the gradients written, or null
    float* row_losses;      // (N,) each row's loss, or null (a backward)
    unsigned int* ticket;   // with loss: zero before the launch and after
    T* loss;                // () the rows' sum / divisor, or null
    const T* scalar_grad;   // () of T: the upstream gradient (the rungs' backward), or null
    const float* grad;      // float32 upstream gradient, () or (N,) (per_row), or null; neither: 1
    int per_row;
    int64_t N, D;
    float divisor;          // N for mean, 1 for sum and none
    TripletOptions opt;
};

template <typename T, int THREADS, int CACHE, bool GRAD, bool EVICT_FIRST = false>
__global__ void __launch_bounds__(THREADS) triplet_rows_kernel(const TripletRows<T> r) {
    constexpr int V = Pack<T>::size;
    const int64_t D = r.D;
    auto one_row = [&](int64_t row) {  // its loss
        const int64_t base = row * D;
        const T *a = r.a + base, *p = r.p + base, *n = r.n + base;
        T *ga = r.ga ? r.ga + base : nullptr, *gp = r.gp ? r.gp + base : nullptr, *gn = r.gn ? r.gn + base : nullptr;
        const bool swap = r.opt.swap;
        const float eps = r.opt.eps;
        // packs only where every row read or written sits at one offset from a 16-byte boundary
        const RowSplit split = split_row(D, a, p, n, ga ? ga : a, gp ? gp : a, gn ? gn : a);
        const int64_t head = split.head, packs = split.packs, tail = head + V * packs;
        float ap = 0.0f, an = 0.0f, pn = 0.0f;
        auto add = [&](float x, float y, float z) {
            const float u = x - y + eps, v = x - z + eps;
            ap = fmaf(u, u, ap);
            an = fmaf(v, v, an);
            if (swap) {
                const float w = y - z + eps;
                pn = fmaf(w, w, pn);
            }
        };
        auto add_pack = [&](const Pack<T>& x, const Pack<T>& y, const Pack<T>& z) {
#pragma unroll
            for (int k = 0; k < V; ++k) add(x[k], y[k], z[k]);
        };
        for (int64_t j = threadIdx.x; j < head; j += THREADS) add(to_float(a[j]), to_float(p[j]), to_float(n[j]));
        const T *av = a + head, *pv = p + head, *nv = n + head;
        Pack<T> ca[CACHE], cp[CACHE], cn[CACHE];  // a round of this thread's packs: 3 * CACHE loads in flight
        auto load_round = [&](int64_t first) {  // packs first, first + THREADS, ... below packs
#pragma unroll
            for (int k = 0; k < CACHE; ++k) {
                const int64_t i = first + int64_t(k) * THREADS;
                if (i < packs && EVICT_FIRST) {
                    ca[k].raw = __ldcs(reinterpret_cast<const uint4*>(av + V * i));
                    cp[k].raw = __ldcs(reinterpret_cast<const uint4*>(pv + V * i));
                    cn[k].raw = __ldcs(reinterpret_cast<const uint4*>(nv + V * i));
                } else if (i < packs) {
                    ca[k] = load_pack(av + V * i);
                    cp[k] = load_pack(pv + V * i);
                    cn[k] = load_pack(nv + V * i);
                }
            }
        };
        load_round(threadIdx.x);
#pragma unroll
        for (int k = 0; k < CACHE; ++k)
            if (threadIdx.x + int64_t(k) * THREADS < packs) add_pack(ca[k], cp[k], cn[k]);
        if constexpr (GRAD) {  // the first round stays in registers for the gradient: the rest a pack at a time
            for (int64_t i = threadIdx.x + int64_t(CACHE) * THREADS; i < packs; i += THREADS)
                add_pack(load_pack(av + V * i), load_pack(pv + V * i), load_pack(nv + V * i));
        } else {  // a forward alone keeps nothing: the rest in rounds, every load of a round in flight
            const int64_t step = int64_t(CACHE) * THREADS;
            for (int64_t first = threadIdx.x + step; first < packs; first += step) {
                load_round(first);
#pragma unroll
                for (int k = 0; k < CACHE; ++k)
                    if (first + int64_t(k) * THREADS < packs) add_pack(ca[k], cp[k], cn[k]);
            }
        }
        for (int64_t j = tail + threadIdx.x; j < D; j += THREADS) add(to_float(a[j]), to_float(p[j]), to_float(n[j]));
        ap = block_reduce_sum(ap);
        an = block_reduce_sum(an);
        if (swap) pn = block_reduce_sum(pn);

        const float d_ap = sqrtf(ap), d_an = sqrtf(an), d_pn = sqrtf(pn);
        // at::min(d_an, d_pn): a NaN propagates (fminf would drop it)
        const float d_neg = !swap ? d_an : (isnan(d_an) || isnan(d_pn)) ? d_an + d_pn : fminf(d_an, d_pn);
        const float x = r.opt.margin + d_ap - d_neg;
        const float row_loss = x < 0.0f ? 0.0f : x;  // clamp_min: NaN stays NaN

        if (GRAD && (ga || gp || gn)) {
            float g = r.scalar_grad ? to_float(*r.scalar_grad) : r.grad ? r.grad[r.per_row ? row : 0] : 1.0f;
            g = x > 0.0f ? g / r.divisor : 0.0f;  // clamp_min's backward: the gradient where x > 0 (0 at x = 0, NaN)
            // min's backward: the smaller takes it, a tie splits it in half, a NaN passes it to both
            const float wa = !swap ? 1.0f : d_an == d_pn ? 0.5f : d_an > d_pn ? 0.0f : 1.0f;
            const float wp = !swap ? 0.0f : d_an == d_pn ? 0.5f : d_pn > d_an ? 0.0f : 1.0f;
            // norm's backward: u * grad / |u|, zero where |u| is zero
            const float c_ap = d_ap == 0.0f ? 0.0f : g / d_ap;
            const float c_an = d_an == 0.0f ? 0.0f : -g * wa / d_an;
            const float c_pn = d_pn == 0.0f ? 0.0f : -g * wp / d_pn;
            auto grads = [&](float x, float y, float z, float& da, float& dp, float& dn) {
                const float u = x - y + eps, v = x - z + eps;
                da = fmaf(c_ap, u, c_an * v);
                dp = -c_ap * u;
                dn = -c_an * v;
                if (swap) {
                    const float w = y - z + eps;
                    dp = fmaf(c_pn, w, dp);
                    dn = fmaf(-c_pn, w, dn);
                }
            };
            auto scalar = [&](int64_t j) {
                float da, dp, dn;
                grads(to_float(a[j]), to_float(p[j]), to_float(n[j]), da, dp, dn);
                if (ga) ga[j] = from_float<T>(da);
                if (gp) gp[j] = from_float<T>(dp);
                if (gn) gn[j] = from_float<T>(dn);
            };
            auto pack = [&](const Pack<T>& x, const Pack<T>& y, const Pack<T>& z, int64_t i) {
                float da[V], dp[V], dn[V];
#pragma unroll
                for (int k = 0; k < V; ++k) grads(x[k], y[k], z[k], da[k], dp[k], dn[k]);
                if (ga) store_pack(ga + head + V * i, pack_of<T>(da));
                if (gp) store_pack(gp + head + V * i, pack_of<T>(dp));
                if (gn) store_pack(gn + head + V * i, pack_of<T>(dn));
            };
            for (int64_t j = threadIdx.x; j < head; j += THREADS) scalar(j);
#pragma unroll
            for (int k = 0; k < CACHE; ++k) {
                const int64_t i = threadIdx.x + int64_t(k) * THREADS;
                if (i < packs) pack(ca[k], cp[k], cn[k], i);
            }
            for (int64_t i = threadIdx.x + int64_t(CACHE) * THREADS; i < packs; i += THREADS)
                pack(load_pack(av + V * i), load_pack(pv + V * i), load_pack(nv + V * i), i);
            for (int64_t j = tail + threadIdx.x; j < D; j += THREADS) scalar(j);
        }
        if (!r.loss && r.row_losses && threadIdx.x == 0) r.row_losses[row] = row_loss;  // reduction none
        return row_loss;
    };
    float partial = 0.0f;
    if constexpr (GRAD)  // a block per row: the gradient's packs are this row's registers
        partial = one_row(blockIdx.x);
    else
        for (int64_t row = blockIdx.x; row < r.N; row += gridDim.x) partial += one_row(row);
    if (r.loss) finish_sum(partial, r.row_losses, r.ticket, r.divisor, r.loss);  // the last block: the loss
}

// THREADS is a float32 row's block: a 16-bit row holds half the bytes, so half the threads keep as
// many packs each in flight (32768 x 8192 bfloat16 on an H100: 512 threads, forward 0.752 ms, 72 %
// of DRAM; 256 threads 0.533 ms; fused forward+backward 1.060 -> 0.721 ms).
template <typename T>
constexpr int row_block(int threads) {
    return sizeof(T) == 2 && threads % 64 == 0 ? threads / 2 : threads;
}

// A forward alone reads inputs of at most EVICT_FIRST_L2S times the current device's L2 with
// evict-first loads: after earlier kernels' writes (in a timing, the L2 flush's) the L2 holds dirty
// lines, which a plain load evicts, their write-back sharing the DRAM with the reads. The same
// bound as hinge_loss's forward (kernels/hinge_loss/walk.cuh, with its measurements); here, on an
// H100 at 2048 x 8192 bfloat16 (1.9 L2s), forward 0.049 -> 0.046 ms, and 8192 x 8192 (7.7 L2s)
// 0.146 -> 0.152 ms.
constexpr int EVICT_FIRST_L2S = 4;

inline bool evict_first_fits(int64_t bytes) {
    int device = 0, l2 = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device);
    return bytes <= int64_t(EVICT_FIRST_L2S) * l2;
}

// One launch of the row kernel for element type T, the ticket the stream's where the loss is written.
// WAVES 0: a launch that may write a gradient, N blocks of BLOCK threads (a row each); otherwise a
// forward alone (no gradient pointer): a row a block while that is at most WAVES times the blocks
// the GPU holds at once (the block scheduler evens out the rows: 2048 x 8192 bfloat16 on an H100,
// 0.046 -> 0.045 ms against rows in turn), else those blocks taking rows in turn (no tail).
// The rungs' launchers pick T with dispatch_dtype.
template <typename T, int BLOCK, int CACHE, int WAVES = 0>
cudaError_t triplet_rows(const void* a, const void* p, const void* n, void* ga, void* gp, void* gn,
                         float* row_losses, void* loss, const void* scalar_grad, const float* grad, int per_row,
                         int64_t N, int64_t D, TripletOptions opt, cudaStream_t stream) {
    if (N <= 0 || N > INT32_MAX || D <= 0 || (WAVES > 0 && (ga || gp || gn))) return cudaErrorInvalidValue;
    unsigned int* ticket = nullptr;
    if (loss != nullptr) {
        const cudaError_t err = stream_workspace(stream, row_losses + N, sizeof(unsigned int),
                                                 reinterpret_cast<void**>(&ticket));
        if (err != cudaSuccess) return err;
    }
    const TripletRows<T> r{static_cast<const T*>(a), static_cast<const T*>(p), static_cast<const T*>(n),
                           static_cast<T*>(ga), static_cast<T*>(gp), static_cast<T*>(gn), row_losses, ticket,
                           static_cast<T*>(loss), static_cast<const T*>(scalar_grad), grad, per_row, N, D,
                           opt.reduction == TRIPLET_MEAN ? float(N) : 1.0f, opt};
    const auto forward = [&](auto kernel, int64_t resident) {
        kernel<<<static_cast<unsigned int>(N <= WAVES * resident ? N : resident), BLOCK, 0, stream>>>(r);
    };
    if constexpr (WAVES == 0) {
        triplet_rows_kernel<T, BLOCK, CACHE, true><<<static_cast<unsigned int>(N), BLOCK, 0, stream>>>(r);
    } else if (evict_first_fits(3 * N * D * int64_t(sizeof(T)))) {
        constexpr auto kernel = triplet_rows_kernel<T, BLOCK, CACHE, false, true>;
        forward(kernel, resident_blocks<kernel, BLOCK>());
    } else {
        constexpr auto kernel = triplet_rows_kernel<T, BLOCK, CACHE, false>;
        forward(kernel, resident_blocks<kernel, BLOCK>());
    }
    return cudaGetLastError();
}

// PyTorch's defaults, the rungs' contract (launchers.h).
constexpr TripletOptions TRIPLET_DEFAULTS{1.0f, 1e-6f, 0, TRIPLET_MEAN};
