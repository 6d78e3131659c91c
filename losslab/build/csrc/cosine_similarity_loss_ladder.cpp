// Python binding of the cosine_similarity_loss teaching ladder (kernels/cosine_similarity_loss/ladder/):
// each rung's forward and backward, bound by their one declaration in launchers.h, as
// cosine_similarity_loss.cpp binds the production rungs. The ladder defines launchers of the same
// names, so it is an extension of its own (losslab.build.ladder).
#include "bind.h"
#include "cosine_similarity_loss/ladder/ladder.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "losslab cosine_similarity_loss teaching ladder: <rung>_forward and <rung>_backward per rung";
#define BIND_RUNG(rung) LOSSLAB_BIND_RUNG(m, cosine_similarity_loss, rung)
    COSINE_SIMILARITY_LOSS_LADDER(BIND_RUNG)
#undef BIND_RUNG
}
