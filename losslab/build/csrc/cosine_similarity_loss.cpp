// Python binding of the cosine_similarity_loss launchers (kernels/cosine_similarity_loss/launchers.h):
// each rung's forward and backward, bound by their one declaration, and F.cosine_similarity's row
// launchers. Python validates and allocates the tensors and passes data pointers, sizes, eps, the
// dtype code and the current CUDA stream as integers and floats.
#include "bind.h"
#include "cosine_similarity_loss/launchers.h"
#include "cosine_similarity_loss/similarity.h"

// The rungs bound: all of them, unless the includer names fewer (an exported
// single-rung solution links only its rung's kernels).
#ifndef BOUND_RUNGS
#define BIND_ROWS  // F.cosine_similarity's launchers, in vectorized.cu
#define BOUND_RUNGS COSINE_SIMILARITY_LOSS_RUNGS
#endif

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "losslab cosine_similarity_loss kernels: <rung>_forward and <rung>_backward per rung";
#define BIND_RUNG(rung) LOSSLAB_BIND_RUNG(m, cosine_similarity_loss, rung)
    BOUND_RUNGS(BIND_RUNG)
#undef BIND_RUNG
#ifdef BIND_ROWS
    losslab::bind(m, "rows_forward", &cosine_similarity_loss_rows_forward);
    losslab::bind(m, "rows_backward", &cosine_similarity_loss_rows_backward);
#endif
}
