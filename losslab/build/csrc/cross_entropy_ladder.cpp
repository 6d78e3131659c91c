// Python binding of the cross_entropy teaching ladder (kernels/cross_entropy/ladder/):
// each rung's forward and backward, with the production launchers' signatures
// (kernels/cross_entropy/launchers.h), bound by the ladder's X-macro. The ladder is
// its own extension (losslab/build/ladder.py), so its cross_entropy_<rung>_forward
// never meets the production rung of the same name.
#include "bind.h"
#include "cross_entropy/ladder/ladder.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "losslab cross_entropy teaching ladder: <rung>_forward and <rung>_backward per rung";
#define BIND_RUNG(rung) LOSSLAB_BIND_RUNG(m, cross_entropy, rung)
    CROSS_ENTROPY_LADDER(BIND_RUNG)
#undef BIND_RUNG
}
