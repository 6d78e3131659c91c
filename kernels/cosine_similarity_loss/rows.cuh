// The operators' row kernels, templated on the dtype (fp32 math) and the launch
// shape; vectorized.cu and fused.cu instantiate them with their knobs.
//
// forward_rows: a block per row, or rows in turn (row, row + gridDim.x, ...) where the
// launcher starts fewer blocks (vectorized.cu). Each thread loads the row's first TILE * THREADS
// 16-byte packs of p and t into registers (all TILE loads in flight before any
// use), streams any packs beyond them, and adds p.t, p.p and t.t; the block adds
// its threads' sums (common/reduce.cuh). Then, by what the caller passes: the row's
// dots for the backward, its cos (F.cosine_similarity), its 1 - cos into the loss
// (the last block adds the partials in a fixed order: common/last_block.cuh), and,
// with GRAD, dL/dp (and dL/dt) for grad_loss = 1 from the registers: where the row
// fits the tile (D <= TILE * THREADS * 16 / sizeof(T)) p and t leave DRAM once.
// A block that takes many rows publishes one partial for them all: one fence and one
// ticket per block, not per row (on an H200, 32768 x 8192 float32 forward: one block per
// row 0.514 ms, where the ladder's two kernels took 0.487).
//
// backward_rows: one block per row, the gradient from the row's dots and upstream
// gradient (grad_loss / B of the loss, or each row's gradient of cos).
#pragma once
#include "common/last_block.cuh"
#include "common/reduce.cuh"
#include "common/row_split.cuh"
#include "common/vector_load.cuh"
#include "cosine_similarity_loss/cosine.cuh"

struct RowDots {
    float pt = 0.0f, pp = 0.0f, tt = 0.0f;
    __device__ __forceinline__ void add(float p, float t) {
        pt = fmaf(p, t, pt), pp = fmaf(p, p, pp), tt = fmaf(t, t, tt);
    }
};

// The row's split: packs only where every buffer of the row sits at p's offset from a
// 16-byte boundary (a null gradient buffer is no constraint).
template <typename T>
__device__ __forceinline__ RowSplit split_rows(int64_t D, const T* p, const T* t, const T* gp, const T* gt) {
    return split_row(D, p, t, gp ? gp : p, gt ? gt : p);
}

// dL/dp and dL/dt of elements (p, t), from the row's coefficients (cosine.cuh).
__device__ __forceinline__ float grad_p(const RowCosine& c, float p, float t) { return fmaf(c.k_other, t, c.k_p * p); }
__device__ __forceinline__ float grad_t(const RowCosine& c, float p, float t) { return fmaf(c.k_other, p, c.k_t * t); }

// One pack's gradients, stored where their buffers are not null.
template <typename T>
__device__ __forceinline__ void store_grads(const RowCosine& c, const Pack<T>& p, const Pack<T>& t, T* gp, T* gt) {
    constexpr int V = Pack<T>::size;
    float out[V];
#pragma unroll
    for (int k = 0; k < V; ++k) out[k] = grad_p(c, p[k], t[k]);
    store_pack(gp, pack_of<T>(out));
    if (gt == nullptr) return;
#pragma unroll
    for (int k = 0; k < V; ++k) out[k] = grad_t(c, p[k], t[k]);
    store_pack(gt, pack_of<T>(out));
}

// The scalar elements of a row (head, tail, or the whole row where no pack fits).
template <typename T>
__device__ __forceinline__ void scalar_grads(const RowCosine& c, const T* p, const T* t, T* gp, T* gt, int64_t j) {
    const float pj = to_float(p[j]), tj = to_float(t[j]);
    gp[j] = from_float<T>(grad_p(c, pj, tj));
    if (gt) gt[j] = from_float<T>(grad_t(c, pj, tj));
}

// At most 64 registers a thread up to a tile of 4 (65536 / 64 / THREADS blocks an SM): the 16-bit
// kernels took 99 without the bound, one 512-thread block an SM, half the bytes in flight; none spills.
template <typename T, int THREADS, int TILE, bool GRAD>
__global__ void __launch_bounds__(THREADS, TILE <= 4 ? 65536 / 64 / THREADS : 1)
forward_rows(const T* __restrict__ predictions,  // (B, D)
             const T* __restrict__ targets,      // (B, D)
             float* __restrict__ row_dots,       // (3, B) or null: p.t, p.p, t.t of each row
             T* __restrict__ row_cos,            // (B,) or null: each row's cos
             float* __restrict__ row_partials,   // (gridDim.x,) with loss: each block's sum of 1 - cos
             unsigned int* __restrict__ ticket,  // () with loss: zero before the launch and after
             T* __restrict__ loss,               // () or null: the mean of 1 - cos
             T* __restrict__ grad_predictions,   // (B, D) with GRAD: dL/dp for grad_loss = 1
             T* __restrict__ grad_targets,       // (B, D) or null, with GRAD: dL/dt
             int64_t B, int64_t D, float eps) {
    constexpr int V = Pack<T>::size;
    auto one_row = [&](int64_t row) {  // its 1 - cos
        const T* p = predictions + row * D;
        const T* t = targets + row * D;
        T* gp = GRAD ? grad_predictions + row * D : nullptr;
        T* gt = GRAD && grad_targets ? grad_targets + row * D : nullptr;
        const RowSplit s = split_rows(D, p, t, gp, gt);
        const T* pv = p + s.head;
        const T* tv = t + s.head;
        RowDots d;
        // the row's first TILE * THREADS packs, kept for the gradient; zeroed, so that no pack a short
        // row leaves unloaded carries over from the row before (ptxas spilled one to local memory)
        Pack<T> pr[TILE] = {}, tr[TILE] = {};
#pragma unroll
        for (int u = 0; u < TILE; ++u) {
            const int64_t k = threadIdx.x + int64_t(u) * THREADS;
            if (k < s.packs) pr[u] = load_pack(pv + V * k), tr[u] = load_pack(tv + V * k);
        }
#pragma unroll
        for (int u = 0; u < TILE; ++u)
            if (threadIdx.x + int64_t(u) * THREADS < s.packs)
#pragma unroll
                for (int k = 0; k < V; ++k) d.add(pr[u][k], tr[u][k]);
#pragma unroll 4
        for (int64_t k = threadIdx.x + int64_t(TILE) * THREADS; k < s.packs; k += THREADS) {  // beyond the tile
            const Pack<T> a = load_pack(pv + V * k), b = load_pack(tv + V * k);
#pragma unroll
            for (int e = 0; e < V; ++e) d.add(a[e], b[e]);
        }
        for (int64_t j = threadIdx.x; j < s.head; j += THREADS) d.add(to_float(p[j]), to_float(t[j]));
        for (int64_t j = s.head + V * s.packs + threadIdx.x; j < D; j += THREADS) d.add(to_float(p[j]), to_float(t[j]));
        d.pt = block_reduce_sum(d.pt), d.pp = block_reduce_sum(d.pp), d.tt = block_reduce_sum(d.tt);
        const RowCosine c = row_cosine(d.pt, d.pp, d.tt, eps, -1.0f / float(B));
        if (threadIdx.x == 0) {
            if (row_dots) row_dots[row] = d.pt, row_dots[B + row] = d.pp, row_dots[2 * B + row] = d.tt;
            if (row_cos) row_cos[row] = from_float<T>(c.cos);
        }
        if constexpr (GRAD) {
            T* gpv = gp + s.head;
            T* gtv = gt ? gt + s.head : nullptr;
#pragma unroll
            for (int u = 0; u < TILE; ++u) {
                const int64_t k = threadIdx.x + int64_t(u) * THREADS;
                if (k < s.packs) store_grads(c, pr[u], tr[u], gpv + V * k, gtv ? gtv + V * k : nullptr);
            }
            for (int64_t k = threadIdx.x + int64_t(TILE) * THREADS; k < s.packs; k += THREADS)  // re-read (L2)
                store_grads(c, load_pack(pv + V * k), load_pack(tv + V * k), gpv + V * k, gtv ? gtv + V * k : nullptr);
            for (int64_t j = threadIdx.x; j < s.head; j += THREADS) scalar_grads(c, p, t, gp, gt, j);
            for (int64_t j = s.head + V * s.packs + threadIdx.x; j < D; j += THREADS) scalar_grads(c, p, t, gp, gt, j);
        }
        return 1.0f - c.cos;
    };
    float partial = 0.0f;  // the block's rows' 1 - cos
    if constexpr (GRAD) {  // fused: a block per row (a loop here spills the tile's registers)
        partial = one_row(blockIdx.x);
    } else {
#pragma unroll 1
        for (int64_t row = blockIdx.x; row < B; row += gridDim.x) partial += one_row(row);
    }
    if (loss) finish_sum(partial, row_partials, ticket, float(B), loss);  // the last block: the loss
}

template <typename T, int THREADS>
__global__ void __launch_bounds__(THREADS)
backward_rows(const T* __restrict__ predictions,  // (B, D)
              const T* __restrict__ targets,      // (B, D)
              const float* __restrict__ row_dots, // (3, B) from the forward
              const T* __restrict__ grad_loss,    // () or null: the loss's upstream gradient
              const float* __restrict__ grad_cos, // (B,) or null: each row's upstream gradient of cos
              T* __restrict__ grad_predictions,   // (B, D) or null
              T* __restrict__ grad_targets,       // (B, D) or null
              int64_t B, int64_t D, float eps) {
    constexpr int V = Pack<T>::size;
    const int64_t row = blockIdx.x;
    const float scale = grad_cos ? grad_cos[row] : -to_float(*grad_loss) / float(B);
    const RowCosine c = row_cosine(row_dots[row], row_dots[B + row], row_dots[2 * B + row], eps, scale);
    const T* p = predictions + row * D;
    const T* t = targets + row * D;
    // dL/dt of F.cosine_similarity(x1, x2) alone: the same code with the inputs' roles swapped
    const bool swap = grad_predictions == nullptr;
    T* g = (swap ? grad_targets : grad_predictions) + row * D;
    T* g2 = swap || grad_targets == nullptr ? nullptr : grad_targets + row * D;
    const RowCosine cs = swap ? RowCosine{c.cos, c.k_other, c.k_t, c.k_p} : c;
    const T* a = swap ? t : p;
    const T* b = swap ? p : t;
    const RowSplit s = split_rows(D, a, b, g, g2);
#pragma unroll 4
    for (int64_t k = threadIdx.x; k < s.packs; k += THREADS) {
        const int64_t j = s.head + V * k;
        store_grads(cs, load_pack(a + j), load_pack(b + j), g + j, g2 ? g2 + j : nullptr);
    }
    for (int64_t j = threadIdx.x; j < s.head; j += THREADS) scalar_grads(cs, a, b, g, g2, j);
    for (int64_t j = s.head + V * s.packs + threadIdx.x; j < D; j += THREADS) scalar_grads(cs, a, b, g, g2, j);
}
