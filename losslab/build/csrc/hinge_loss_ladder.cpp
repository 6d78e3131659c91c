// Python binding of the hinge_loss teaching ladder (kernels/hinge_loss/ladder/): each rung's
// forward and backward, bound by their one declaration in hinge_loss/launchers.h, as
// hinge_loss.cpp binds the production rungs. The ladder defines launchers of the same
// names, so it is an extension of its own (losslab.build.ladder: losslab_hinge_loss_ladder).
#include "bind.h"
#include "hinge_loss/ladder/ladder.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "losslab hinge_loss teaching ladder: <rung>_forward and <rung>_backward per rung";
#define BIND_RUNG(rung) LOSSLAB_BIND_RUNG(m, hinge_loss, rung)
    HINGE_LOSS_LADDER(BIND_RUNG)
#undef BIND_RUNG
}
