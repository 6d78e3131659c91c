// The end of every cross_entropy forward: the mean of the row losses over the
// valid rows. Ignored rows leave both the sum and the count, so with every row
// ignored it is 0 / 0 = NaN, as in PyTorch; a target out of range makes it NaN.
#pragma once
#include <cstdint>
#include <math.h>
#include "common/last_block.cuh"
#include "common/vector_load.cuh"
#include "cross_entropy/cross_entropy.cuh"

// One target's share of counts = {rows with a class, targets out of range}.
__device__ __forceinline__ void count_target(int64_t target, int64_t C, int64_t& valid, int64_t& out_of_range) {
    valid += target_in_range(target, C);
    out_of_range += !target_in_range(target, C) && target != IGNORE_INDEX;
}

template <typename T>
__device__ __forceinline__ void write_mean(float sum, int64_t valid, int64_t out_of_range, T* loss) {
    *loss = from_float<T>(out_of_range ? NAN : sum / float(valid));
}

// The ticket a one-kernel forward draws: its counters' third word (launchers.h).
__host__ __device__ inline unsigned int* counters_ticket(int64_t* counters) {
    return reinterpret_cast<unsigned int*>(counters + 2);
}

// The end of a one-kernel forward: every block (or, given `index` and
// `publishers`, each of that many blocks, e.g. one per cluster) publishes its
// loss at block_losses[index]; the last to finish adds block_losses[0, summed)
// (default: one per publisher; more where publishers wrote others before, e.g.
// one per row) in a fixed order and writes the mean, the
// counters (n_valid and the number out of range, added by every block before
// its ticket, or by an earlier stage) being complete by then. Counters in the
// stream's workspace are copied to the forward's `counts` and zeroed for the
// next call (common/stream_workspace.cuh); while a graph is captured they are
// `counts` itself.
template <typename T>
__device__ __forceinline__ void finish_mean(float block_loss, float* block_losses, int64_t* counters,
                                            int64_t* counts, T* loss, unsigned int index = blockIdx.x,
                                            unsigned int publishers = gridDim.x, int64_t summed = 0) {
    if (!publish_partial(block_loss, block_losses, counters_ticket(counters), index, publishers)) return;
    const float sum = sum_in_order(block_losses, summed ? summed : publishers);
    if (threadIdx.x == 0) {
        const int64_t valid = __ldcg(counters), out_of_range = __ldcg(counters + 1);
        if (counters != counts) {
            counts[0] = valid;
            counts[1] = out_of_range;
            counts[2] = counts[3] = 0;  // the ticket's words, unused in counts: written, as while capturing
            counters[0] = counters[1] = 0;
        }
        write_mean(sum, valid, out_of_range, loss);
    }
}
