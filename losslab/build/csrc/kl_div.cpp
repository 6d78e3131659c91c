// Python binding of the kl_div launchers (kernels/kl_div/launchers.h): each
// rung's forward and backward, bound by their one declaration. Python validates
// and allocates the tensors and passes data pointers, sizes, the dtype code and
// the current CUDA stream as integers.
#include "bind.h"
#include "kl_div/launchers.h"
#include "kl_div/options.h"

// The rungs bound: all of them, unless the includer names fewer (an exported
// single-rung solution links only its rung's kernels).
#ifndef BOUND_RUNGS
#define BIND_OPTIONS  // PyTorch's options (options.h), in vectorized.cu and fused.cu
#define BOUND_RUNGS KL_DIV_RUNGS
#endif

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "losslab kl_div kernels: <rung>_forward and <rung>_backward per rung";
#define BIND_RUNG(rung) LOSSLAB_BIND_RUNG(m, kl_div, rung)
    BOUND_RUNGS(BIND_RUNG)
#undef BIND_RUNG
#ifdef BIND_OPTIONS
    losslab::bind(m, "vectorized_options_forward", &kl_div_vectorized_options_forward);
    losslab::bind(m, "vectorized_options_backward", &kl_div_vectorized_options_backward);
    losslab::bind(m, "fused_options_forward", &kl_div_fused_options_forward);
#endif
}
