// statistics: a rank holding one slice of the vocabulary cannot finish a row's
// log-sum-exp alone, and Megatron-style code reduces its slice three times (max, target
// logit, sum of exponentials), each followed by an all-reduce. Here one pass of the
// ladder's online softmax (kernels/cross_entropy/ladder/vectorized.cu, fused.cu) folds
// the slice into four floats per row: the running (max, sum of exp(x - max)) raised
// once per 16-byte pack, the target's logit where the slice holds it, and the sum of
// the logits (label smoothing's term). One block per row; the block combines its
// threads' tuples with warp shuffles. The ranks then exchange the tuples once.
#include "common/dispatch.cuh"
#include "common/row_split.cuh"
#include "cross_entropy/cross_entropy.cuh"  // LogSumExp, lse_add, lse_raise_max, block_reduce_logsumexp
#include "vocab_parallel/launchers.h"

namespace {

constexpr int THREADS = 256;

template <typename T>
__global__ void __launch_bounds__(THREADS)
statistics_kernel(const T* __restrict__ logits,        // (N, V) this rank's slice
                  const int64_t* __restrict__ targets,  // (N,) global class ids
                  float4* __restrict__ statistics,      // (N,) written: (max, sum, target logit, sum of logits)
                  int64_t V, int64_t vocab_start) {
    constexpr int P = Pack<T>::size;
    const int64_t row = blockIdx.x;  // one block per row
    const T* x = logits + row * V;
    const RowSplit s = split_row(V, x);
    LogSumExp lse;
    float total = 0.0f;
#pragma unroll 4
    for (int64_t k = threadIdx.x; k < s.packs; k += THREADS) {
        const Pack<T> p = load_pack(x + s.head + k * P);
        float m = p[0];
#pragma unroll
        for (int i = 1; i < P; ++i) m = fmaxf(m, p[i]);
        lse_raise_max(lse, m);  // once per pack; a NaN never raises it but enters the sum below
#pragma unroll
        for (int i = 0; i < P; ++i) {
            lse.sum += __expf(p[i] - lse.max);  // MUFU.EX2 and two ops: a 16-bit row stays memory-bound
            total += p[i];
        }
    }
    for (int64_t j = threadIdx.x; j < s.head; j += THREADS) {
        lse_add(lse, to_float(x[j]));
        total += to_float(x[j]);
    }
    for (int64_t j = s.head + P * s.packs + threadIdx.x; j < V; j += THREADS) {
        lse_add(lse, to_float(x[j]));
        total += to_float(x[j]);
    }
    lse = block_reduce_logsumexp(lse);
    total = block_reduce_sum(total);
    if (threadIdx.x == 0) {
        const int64_t local = targets[row] - vocab_start;  // an ignored or foreign target falls outside [0, V)
        const float target_logit = local >= 0 && local < V ? to_float(x[local]) : 0.0f;
        statistics[row] = make_float4(lse.max, lse.sum, target_logit, total);
    }
}

}  // namespace

cudaError_t vocab_parallel_statistics(const void* logits, const int64_t* targets, float* statistics, int64_t N,
                                      int64_t V, int64_t vocab_start, DType dtype, cudaStream_t stream) {
    if (N == 0) return cudaSuccess;
    return dispatch_dtype(dtype, [&](auto tag) {
        using T = decltype(tag);
        statistics_kernel<T><<<N, THREADS, 0, stream>>>(static_cast<const T*>(logits), targets,
                                                        reinterpret_cast<float4*>(statistics), V, vocab_start);
        return cudaGetLastError();
    });
}
