// Python binding of the kl_div teaching ladder (kernels/kl_div/ladder/): each rung's
// forward and backward, bound by their one declaration in kl_div/launchers.h, as
// kl_div.cpp binds the production rungs. The ladder defines launchers of the same
// names, so it is an extension of its own (losslab.build.ladder: losslab_kl_div_ladder).
#include "bind.h"
#include "kl_div/ladder/ladder.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "losslab kl_div teaching ladder: <rung>_forward and <rung>_backward per rung";
#define BIND_RUNG(rung) LOSSLAB_BIND_RUNG(m, kl_div, rung)
    KL_DIV_LADDER(BIND_RUNG)
#undef BIND_RUNG
}
