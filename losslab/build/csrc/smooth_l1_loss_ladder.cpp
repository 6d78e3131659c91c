// Python binding of the smooth_l1_loss teaching ladder (kernels/smooth_l1_loss/ladder/): each rung's
// forward and backward, bound by their one declaration in smooth_l1_loss/launchers.h, as
// smooth_l1_loss.cpp binds the production rungs. The ladder defines launchers of the same
// names, so it is an extension of its own (losslab.build.ladder: losslab_smooth_l1_loss_ladder).
#include "bind.h"
#include "smooth_l1_loss/ladder/ladder.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "losslab smooth_l1_loss teaching ladder: <rung>_forward and <rung>_backward per rung";
#define BIND_RUNG(rung) LOSSLAB_BIND_RUNG(m, smooth_l1_loss, rung)
    SMOOTH_L1_LOSS_LADDER(BIND_RUNG)
#undef BIND_RUNG
}
