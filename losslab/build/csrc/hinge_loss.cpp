// Python binding of the hinge_loss launchers (kernels/hinge_loss/launchers.h): each
// rung's forward and backward, bound by their one declaration, and the options launchers
// (options.h) that losslab.nn.functional.hinge_loss calls. Python validates and allocates the
// tensors and passes data pointers, sizes, the dtype code and the current CUDA stream as integers.
#include "bind.h"
#include "hinge_loss/launchers.h"
#include "hinge_loss/options.h"

// The rungs bound: all of them, unless the includer names fewer (an exported
// single-rung solution links only its rung's kernels).
#ifndef BOUND_RUNGS
#define BIND_OPTIONS  // losslab.nn's options (options.h), in vectorized.cu and fused.cu
#define BOUND_RUNGS HINGE_LOSS_RUNGS
#endif

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "losslab hinge_loss kernels: <rung>_forward and <rung>_backward per rung";
#define BIND_RUNG(rung) LOSSLAB_BIND_RUNG(m, hinge_loss, rung)
    BOUND_RUNGS(BIND_RUNG)
#undef BIND_RUNG
#ifdef BIND_OPTIONS
    losslab::bind(m, "vectorized_options_forward", &hinge_loss_vectorized_options_forward);
    losslab::bind(m, "vectorized_options_backward", &hinge_loss_vectorized_options_backward);
    losslab::bind(m, "fused_options_forward", &hinge_loss_fused_options_forward);
#endif
}
