// Python binding of the mse_loss teaching ladder (kernels/mse_loss/ladder/): each rung's
// forward and backward, bound by their one declaration in mse_loss/launchers.h, as
// mse_loss.cpp binds the production rungs. The ladder defines launchers of the same
// names, so it is an extension of its own (losslab.build.ladder: losslab_mse_loss_ladder).
#include "bind.h"
#include "mse_loss/ladder/ladder.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "losslab mse_loss teaching ladder: <rung>_forward and <rung>_backward per rung";
#define BIND_RUNG(rung) LOSSLAB_BIND_RUNG(m, mse_loss, rung)
    MSE_LOSS_LADDER(BIND_RUNG)
#undef BIND_RUNG
}
