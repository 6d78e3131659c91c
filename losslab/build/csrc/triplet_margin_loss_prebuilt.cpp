// C entry points of the triplet_margin_loss operator kernels for the prebuilt library (c_abi.h):
// what the pybind binding triplet_margin_loss.cpp binds, under the same names, from the same X-macro.
#include "c_abi.h"
#include "triplet_margin_loss/launchers.h"
#include "triplet_margin_loss/options.h"

#define EXPORT_RUNG(rung) LOSSLAB_EXPORT_RUNG(triplet_margin_loss, rung)
static const LosslabEntry ENTRIES[] = {
    TRIPLET_MARGIN_LOSS_RUNGS(EXPORT_RUNG)
    LOSSLAB_EXPORT(vectorized_options_forward, &triplet_margin_loss_vectorized_options_forward)
    LOSSLAB_EXPORT(vectorized_options_backward, &triplet_margin_loss_vectorized_options_backward)
    LOSSLAB_EXPORT(fused_options_forward, &triplet_margin_loss_fused_options_forward)
};
LOSSLAB_EXPORT_ENTRIES(ENTRIES)
