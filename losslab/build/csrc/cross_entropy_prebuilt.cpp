// C entry points of the cross_entropy operator kernels for the prebuilt library (c_abi.h): what
// the pybind binding cross_entropy.cpp binds, under the same names, from the same X-macro.
#include "c_abi.h"
#include "cross_entropy/cluster.h"
#include "cross_entropy/launchers.h"
#include "cross_entropy/options.h"

// cluster_plan as the binding returns it: (CTAs per row, slice bytes, why fused runs instead or "").
static const char* cluster_plan(const void* logits, const void* grad_logits, int64_t N, int64_t C, DType dtype,
                                int64_t* cluster_size, int64_t* slice_bytes) {
    const ClusterPlan plan = cross_entropy_cluster_plan(logits, grad_logits, N, C, dtype);
    *cluster_size = plan.cluster_size;
    *slice_bytes = int64_t(plan.slice_packs) * 16;
    return plan.fallback ? plan.fallback : "";
}

#define EXPORT_RUNG(rung) LOSSLAB_EXPORT_RUNG(cross_entropy, rung)
static const LosslabEntry ENTRIES[] = {
    CROSS_ENTROPY_RUNGS(EXPORT_RUNG)
    LOSSLAB_EXPORT(vectorized_options_forward, &cross_entropy_vectorized_options_forward)
    LOSSLAB_EXPORT(vectorized_options_backward, &cross_entropy_vectorized_options_backward)
    LOSSLAB_EXPORT(fused_options_forward, &cross_entropy_fused_options_forward)
    LOSSLAB_EXPORT(cluster_tune, &cross_entropy_cluster_tune)
    losslab_c::entry("cluster_plan", &cluster_plan, 2),
};
LOSSLAB_EXPORT_ENTRIES(ENTRIES)
