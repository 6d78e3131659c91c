// Python binding of the triplet_margin_loss launchers (kernels/triplet_margin_loss/launchers.h):
// each rung's forward and backward, bound by their one declaration, and PyTorch's options
// (options.h). Python validates and allocates the tensors and passes data pointers, sizes, the
// dtype code and the current CUDA stream as integers.
#include "bind.h"
#include "triplet_margin_loss/launchers.h"
#include "triplet_margin_loss/options.h"

// The rungs bound: all of them, unless the includer names fewer (an exported
// single-rung solution links only its rung's kernels).
#ifndef BOUND_RUNGS
#define BIND_OPTIONS  // PyTorch's options (options.h), in vectorized.cu and fused.cu
#define BOUND_RUNGS TRIPLET_MARGIN_LOSS_RUNGS
#endif

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "losslab triplet_margin_loss kernels: <rung>_forward and <rung>_backward per rung";
#define BIND_RUNG(rung) LOSSLAB_BIND_RUNG(m, triplet_margin_loss, rung)
    BOUND_RUNGS(BIND_RUNG)
#undef BIND_RUNG
#ifdef BIND_OPTIONS
    losslab::bind(m, "vectorized_options_forward", &triplet_margin_loss_vectorized_options_forward);
    losslab::bind(m, "vectorized_options_backward", &triplet_margin_loss_vectorized_options_backward);
    losslab::bind(m, "fused_options_forward", &triplet_margin_loss_fused_options_forward);
#endif
}
