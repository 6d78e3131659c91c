// Python binding of the triplet_margin_loss teaching ladder (kernels/triplet_margin_loss/ladder/): each
// rung's forward and backward, with the operators' signatures (kernels/triplet_margin_loss/launchers.h),
// bound by the ladder's X-macro. The ladder is its own extension (losslab/build/ladder.py), so its
// triplet_margin_loss_<rung>_forward never meets the operator of the same name.
#include "bind.h"
#include "triplet_margin_loss/ladder/ladder.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "losslab triplet_margin_loss teaching ladder: <rung>_forward and <rung>_backward per rung";
#define BIND_RUNG(rung) LOSSLAB_BIND_RUNG(m, triplet_margin_loss, rung)
    TRIPLET_MARGIN_LOSS_LADDER(BIND_RUNG)
#undef BIND_RUNG
}
