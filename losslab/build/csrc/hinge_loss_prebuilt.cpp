// C entry points of the hinge_loss operator kernels for the prebuilt library (c_abi.h): what the
// pybind binding hinge_loss.cpp binds, under the same names, from the same X-macro.
#include "c_abi.h"
#include "hinge_loss/launchers.h"
#include "hinge_loss/options.h"

#define EXPORT_RUNG(rung) LOSSLAB_EXPORT_RUNG(hinge_loss, rung)
static const LosslabEntry ENTRIES[] = {
    HINGE_LOSS_RUNGS(EXPORT_RUNG)
    LOSSLAB_EXPORT(vectorized_options_forward, &hinge_loss_vectorized_options_forward)
    LOSSLAB_EXPORT(vectorized_options_backward, &hinge_loss_vectorized_options_backward)
    LOSSLAB_EXPORT(fused_options_forward, &hinge_loss_fused_options_forward)
};
LOSSLAB_EXPORT_ENTRIES(ENTRIES)
