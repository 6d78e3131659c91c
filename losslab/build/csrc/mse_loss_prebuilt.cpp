// C entry points of the mse_loss operator kernels for the prebuilt library (c_abi.h): what the
// pybind binding mse_loss.cpp binds, under the same names, from the same X-macro.
#include "c_abi.h"
#include "mse_loss/launchers.h"
#include "mse_loss/options.h"

#define EXPORT_RUNG(rung) LOSSLAB_EXPORT_RUNG(mse_loss, rung)
static const LosslabEntry ENTRIES[] = {
    MSE_LOSS_RUNGS(EXPORT_RUNG)
    LOSSLAB_EXPORT(vectorized_options_forward, &mse_loss_vectorized_options_forward)
    LOSSLAB_EXPORT(vectorized_options_backward, &mse_loss_vectorized_options_backward)
    LOSSLAB_EXPORT(fused_options_forward, &mse_loss_fused_options_forward)
};
LOSSLAB_EXPORT_ENTRIES(ENTRIES)
