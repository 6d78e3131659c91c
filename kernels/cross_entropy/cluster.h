// The cluster rung's choice (cluster.cu), apart from launchers.h's contract: how a row
// is split over a thread-block cluster, or why fused's kernels run instead. Plain C++.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>
#include "common/dtype.h"

struct ClusterPlan {
    int cluster_size;      // CTAs per row (0 when fused runs instead)
    int slice_packs;       // 16-byte packs of the row per CTA (the last CTA may hold fewer)
    int clusters;          // clusters launched, each taking every clusters-th row (at most N)
    const char* fallback;  // why fused's kernels run instead, or null
};

// The plan for rows of C logits of `dtype` at `logits` with their gradient at
// `grad_logits`, N rows, on the current device (cached for the last arguments).
ClusterPlan cross_entropy_cluster_plan(const void* logits, const void* grad_logits, int64_t N, int64_t C,
                                       DType dtype);

// Tuning: clusters of at most `max_cluster` CTAs (1 to 16; above 8 is non-portable), each
// aiming at `slice_bytes` of a row in shared memory (16 bytes to 200 KiB), at most `clusters`
// of them launched (0: cluster.cu's rule; a few make each take many rows, as tests want);
// (0, 0, 0) restores the defaults (8, 64 KiB, 0). cudaErrorInvalidValue outside those ranges.
cudaError_t cross_entropy_cluster_tune(int max_cluster, int64_t slice_bytes, int64_t clusters);
