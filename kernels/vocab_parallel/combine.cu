// combine: after the all-gather each rank holds every rank's four floats per row, and the
// combination in plain torch (losslab/distributed/algebra.py) was about 20 small kernels,
// a fraction of a millisecond of launches for a few KB of data. Here one thread per row
// reads its W tuples (max, sum of exp(x - max), target logit, sum of logits) twice, the
// global max first, then the sum rescaled to it (Milakov and Gimelshein, 2018), and
// writes the row's max, log-sum, loss and weight as algebra.row_losses and reduce do.
// Precise expf/logf: the data is tiny and the loss carries their error.
#include <float.h>
#include <math.h>
#include "vocab_parallel/launchers.h"

namespace {

constexpr int THREADS = 256;

__global__ void __launch_bounds__(THREADS)
combine_kernel(const float4* __restrict__ gathered,  // (W, N): (max, sum, target logit, sum of logits)
               const int64_t* __restrict__ targets,  // (N,) global class ids
               float* __restrict__ out,              // (4, N) written: max, log-sum, loss, weight
               int64_t W, int64_t N, int64_t vocab_size, int64_t ignore_index, float label_smoothing) {
    const int64_t row = blockIdx.x * int64_t{THREADS} + threadIdx.x;
    if (row >= N) return;
    // -FLT_MAX, the max of a slice of -inf logits: exp(m - M) is then exp(0) or 0, never NaN
    float row_max = -FLT_MAX;
    for (int64_t r = 0; r < W; ++r) {
        const float m = gathered[r * N + row].x;
        if (m > row_max || isnan(m)) row_max = m;  // NaN propagates, as torch.amax
    }
    float sum = 0.0f, target_logit = 0.0f, logit_sum = 0.0f;
    for (int64_t r = 0; r < W; ++r) {
        const float4 s = gathered[r * N + row];
        sum += s.y * expf(s.x - row_max);
        target_logit += s.z;
        logit_sum += s.w;
    }
    const float log_sum = logf(sum);
    // lse - x_t as (M - x_t) + log S: exact near the max
    float loss = (row_max - target_logit) + log_sum;
    if (label_smoothing != 0.0f) {  // a branch, not eps * ...: 0 * inf would be NaN
        const float uniform = (row_max - logit_sum / static_cast<float>(vocab_size)) + log_sum;
        loss = (1.0f - label_smoothing) * loss + label_smoothing * uniform;
    }
    const int64_t t = targets[row];
    const bool ignored = t == ignore_index;
    if (ignored) loss = 0.0f;
    else if (t < 0 || t >= vocab_size) loss = NAN;
    out[row] = row_max;
    out[N + row] = log_sum;
    out[2 * N + row] = loss;
    out[3 * N + row] = isnan(loss) ? NAN : (ignored ? 0.0f : 1.0f);
}

}  // namespace

cudaError_t vocab_parallel_combine(const float* gathered, const int64_t* targets, float* out, int64_t W, int64_t N,
                                   int64_t vocab_size, int64_t ignore_index, float label_smoothing,
                                   cudaStream_t stream) {
    if (N == 0) return cudaSuccess;
    const int64_t blocks = (N + THREADS - 1) / THREADS;
    combine_kernel<<<blocks, THREADS, 0, stream>>>(reinterpret_cast<const float4*>(gathered), targets, out, W, N,
                                                   vocab_size, ignore_index, label_smoothing);
    return cudaGetLastError();
}
