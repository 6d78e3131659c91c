// Python binding of the cross_entropy launchers (kernels/cross_entropy/launchers.h):
// each rung's forward and backward, bound by their one declaration (a launcher runs
// all its stages: one call from Python per forward and per backward). Python
// validates and allocates the tensors and passes data pointers, sizes, the dtype
// code and the current CUDA stream as integers.
#include "bind.h"
#include "cross_entropy/cluster.h"
#include "cross_entropy/launchers.h"
#include "cross_entropy/options.h"

// The rungs bound: all of them, unless the includer names fewer (an exported
// single-rung solution links only its rung's kernels).
#ifndef BOUND_RUNGS
#define BIND_OPTIONS  // PyTorch's options (options.h), in vectorized.cu and fused.cu
#define BIND_CLUSTER_PLAN  // the cluster rung's plan and tuning (cluster.h)
#define BOUND_RUNGS CROSS_ENTROPY_RUNGS
#endif

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "losslab cross_entropy kernels: <rung>_forward and <rung>_backward per rung";
#define BIND_RUNG(rung) LOSSLAB_BIND_RUNG(m, cross_entropy, rung)
    BOUND_RUNGS(BIND_RUNG)
#undef BIND_RUNG
#ifdef BIND_OPTIONS
    losslab::bind(m, "vectorized_options_forward", &cross_entropy_vectorized_options_forward);
    losslab::bind(m, "vectorized_options_backward", &cross_entropy_vectorized_options_backward);
    losslab::bind(m, "fused_options_forward", &cross_entropy_fused_options_forward);
#endif
#ifdef BIND_CLUSTER_PLAN
    // cluster_plan(logits, grad_logits, N, C, dtype) -> (CTAs per row, slice bytes, why fused runs
    // instead or ""), on the current device; cluster_tune(max_cluster, slice_bytes, clusters).
    m.def("cluster_plan", [](uintptr_t logits, uintptr_t grad_logits, int64_t N, int64_t C, int dtype) {
        const ClusterPlan plan = cross_entropy_cluster_plan(reinterpret_cast<const void*>(logits),
                                                            reinterpret_cast<const void*>(grad_logits), N, C,
                                                            static_cast<DType>(dtype));
        return pybind11::make_tuple(plan.cluster_size, int64_t(plan.slice_packs) * 16,
                                    plan.fallback ? plan.fallback : "");
    });
    losslab::bind(m, "cluster_tune", &cross_entropy_cluster_tune);
#endif
}
