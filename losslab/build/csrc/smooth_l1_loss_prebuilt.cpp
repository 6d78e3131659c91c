// C entry points of the smooth_l1_loss operator kernels for the prebuilt library (c_abi.h): what the
// pybind binding smooth_l1_loss.cpp binds, under the same names, from the same X-macro.
#include "c_abi.h"
#include "smooth_l1_loss/launchers.h"
#include "smooth_l1_loss/options.h"

#define EXPORT_RUNG(rung) LOSSLAB_EXPORT_RUNG(smooth_l1_loss, rung)
static const LosslabEntry ENTRIES[] = {
    SMOOTH_L1_LOSS_RUNGS(EXPORT_RUNG)
    LOSSLAB_EXPORT(vectorized_options_forward, &smooth_l1_loss_vectorized_options_forward)
    LOSSLAB_EXPORT(vectorized_options_backward, &smooth_l1_loss_vectorized_options_backward)
    LOSSLAB_EXPORT(fused_options_forward, &smooth_l1_loss_fused_options_forward)
};
LOSSLAB_EXPORT_ENTRIES(ENTRIES)
