// rows: the loss's own work on one chunk of logits that cuBLAS wrote (launchers.h gives the
// formulas). One block per row, two passes: the first reads the row for its online
// log-sum-exp (and the smoothing's weighted sum), the second reads it again and writes
// dloss/dlogits over it in place, so the chunk needs no second buffer. One block of 1024
// threads per SM keeps 132 rows in flight on an H100 (33 MB of Llama-3's 256 KB bf16 rows),
// within its 50 MB L2: the second read mostly comes from L2, so each logit costs about one
// read and one write of DRAM. Math in float32; exp by __expf (ex2.approx and a multiply:
// relative error below 2e-6 for the arguments whose terms count, -20 < x <= 0), far below
// the rounding of the bf16 logits it reads.
#include "common/dispatch.cuh"
#include "common/row_split.cuh"
#include "cross_entropy/cross_entropy.cuh"  // LogSumExp, block_reduce_logsumexp, target_in_range
#include "linear_cross_entropy/launchers.h"

constexpr int THREADS = 1024;  // one block per row (vocabularies are 32K-256K wide), one block per SM
constexpr int UNROLL = 2;  // packs loaded before any is used: two 16-byte loads in flight per thread

struct RowParams {
    const float* weight;  // (V,) or null
    int64_t V;
    float keep;        // 1 - label_smoothing
    float spread;      // label_smoothing / V
    float softcap;     // 0: none
    float inv_softcap;
};

__device__ __forceinline__ float capped(float z, const RowParams& p) {
    return p.softcap > 0.0f ? p.softcap * tanhf(z * p.inv_softcap) : z;
}

__device__ __forceinline__ float class_weight(const RowParams& p, int64_t j) {
    return p.weight ? __ldg(p.weight + j) : 1.0f;
}

// f(j, z_j) for this thread's elements of the row: 16-byte packs where the row allows
// (a scalar head up to the first 16-byte boundary: rows of a V that is no multiple of 8
// start anywhere), UNROLL packs loaded at a time, then a scalar tail.
template <typename T, typename F>
__device__ __forceinline__ void visit_row(const T* x, int64_t V, F&& f) {
    constexpr int P = Pack<T>::size;
    const RowSplit s = split_row(V, x);
    for (int64_t j = threadIdx.x; j < s.head; j += THREADS) f(j, to_float(x[j]));
    int64_t k = threadIdx.x;
    for (; k + (UNROLL - 1) * THREADS < s.packs; k += UNROLL * THREADS) {
        Pack<T> xp[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) xp[u] = load_pack(x + s.head + P * (k + u * THREADS));
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
#pragma unroll
            for (int e = 0; e < P; ++e) f(s.head + P * (k + u * THREADS) + e, xp[u][e]);
    }
    for (; k < s.packs; k += THREADS) {
        const Pack<T> xp = load_pack(x + s.head + P * k);
#pragma unroll
        for (int e = 0; e < P; ++e) f(s.head + P * k + e, xp[e]);
    }
    for (int64_t j = s.head + P * s.packs + threadIdx.x; j < V; j += THREADS) f(j, to_float(x[j]));
}

// Add y to the running (max, sum of exp(y - max)). NaN never raises the max but enters the sum.
__device__ __forceinline__ void online_add(LogSumExp& acc, float y) {
    if (y > acc.max) {
        acc.sum = acc.sum * __expf(acc.max - y) + 1.0f;
        acc.max = y;
    } else {
        acc.sum += __expf(y - acc.max);
    }
}

template <typename T>
__global__ void __launch_bounds__(THREADS, 1) rows_kernel(T* logits, const int64_t* targets, const float* stats,
                                                       const float* row_scale, float* row_losses, RowParams p,
                                                       int64_t ignore_index, int mean, int write_grad) {
    const int64_t row = blockIdx.x;
    T* x = logits + row * p.V;
    const float y0 = capped(to_float(x[0]), p);  // keeps the smoothing's sum near the logits' range
    LogSumExp acc;
    float wy = 0.0f;  // sum_j w_j (y_j - y0): the smoothing's part
    visit_row(x, p.V, [&](int64_t j, float z) {
        const float y = capped(z, p);
        online_add(acc, y);
        if (p.spread > 0.0f) wy += class_weight(p, j) * (y - y0);
    });
    const LogSumExp lse = block_reduce_logsumexp(acc);
    if (p.spread > 0.0f) wy = block_reduce_sum(wy);
    const float log_sum = logf(lse.sum);
    const int64_t t = targets[row];
    const bool ignored = t == ignore_index, in_range = target_in_range(t, p.V);
    const float wt = in_range ? p.keep * class_weight(p, t) : 0.0f;
    const float coef = wt + p.spread * stats[1];  // A = sum_j a_j
    if (threadIdx.x == 0) {
        float loss = 0.0f;
        if (!ignored) {
            loss = in_range ? wt * ((lse.max - capped(to_float(x[t]), p)) + log_sum) : NAN;
            if (p.spread > 0.0f) loss += p.spread * (stats[1] * ((lse.max - y0) + log_sum) - wy);
        }
        row_losses[row] = loss;
    }
    if (!write_grad) return;
    __syncthreads();  // thread 0 read x[t] above: it is overwritten below
    float scale = ignored ? 0.0f : (in_range ? 1.0f : NAN);  // 0, not 0 / 0, when every row is ignored
    if (!ignored) {
        if (row_scale) scale *= row_scale[row];
        if (mean) scale /= stats[0];
    }
    auto grad = [&](int64_t j, float z) {
        const float y = capped(z, p);
        float a = p.spread > 0.0f ? p.spread * class_weight(p, j) : 0.0f;
        if (j == t) a += wt;
        float g = (__expf((y - lse.max) - log_sum) * coef - a) * scale;
        if (p.softcap > 0.0f) g *= 1.0f - (y * p.inv_softcap) * (y * p.inv_softcap);  // d/dz softcap*tanh(z/softcap)
        return g;
    };
    constexpr int P = Pack<T>::size;
    const RowSplit s = split_row(p.V, x);
    for (int64_t j = threadIdx.x; j < s.head; j += THREADS) x[j] = from_float<T>(grad(j, to_float(x[j])));
    int64_t k = threadIdx.x;
    for (; k + (UNROLL - 1) * THREADS < s.packs; k += UNROLL * THREADS) {
        Pack<T> xp[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) xp[u] = load_pack(x + s.head + P * (k + u * THREADS));
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int64_t j0 = s.head + P * (k + u * THREADS);
            float g[P];
#pragma unroll
            for (int e = 0; e < P; ++e) g[e] = grad(j0 + e, xp[u][e]);
            store_pack(x + j0, pack_of<T>(g));
        }
    }
    for (; k < s.packs; k += THREADS) {
        const int64_t j0 = s.head + P * k;
        const Pack<T> xp = load_pack(x + j0);
        float g[P];
#pragma unroll
        for (int e = 0; e < P; ++e) g[e] = grad(j0 + e, xp[e]);
        store_pack(x + j0, pack_of<T>(g));
    }
    for (int64_t j = s.head + P * s.packs + threadIdx.x; j < p.V; j += THREADS)
        x[j] = from_float<T>(grad(j, to_float(x[j])));
}

cudaError_t linear_cross_entropy_rows(void* logits, const int64_t* targets, const float* weight, const float* stats,
                                      const float* row_scale, float* row_losses, int64_t rows, int64_t V,
                                      int64_t ignore_index, float label_smoothing, float softcap, int mean,
                                      int write_grad, DType dtype, cudaStream_t stream) {
    if (rows <= 0 || rows > INT32_MAX || V <= 0) return cudaErrorInvalidValue;
    const RowParams p{weight, V, 1.0f - label_smoothing, label_smoothing / float(V), softcap,
                      softcap > 0.0f ? 1.0f / softcap : 0.0f};
    return dispatch_dtype(dtype, [&](auto tag) {
        using T = decltype(tag);
        rows_kernel<T><<<unsigned(rows), THREADS, 0, stream>>>(static_cast<T*>(logits), targets, stats, row_scale,
                                                               row_losses, p, ignore_index, mean, write_grad);
        return cudaGetLastError();
    });
}
