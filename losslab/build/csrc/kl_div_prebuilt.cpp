// C entry points of the kl_div operator kernels for the prebuilt library (c_abi.h): what the
// pybind binding kl_div.cpp binds, under the same names, from the same X-macro.
#include "c_abi.h"
#include "kl_div/launchers.h"
#include "kl_div/options.h"

#define EXPORT_RUNG(rung) LOSSLAB_EXPORT_RUNG(kl_div, rung)
static const LosslabEntry ENTRIES[] = {
    KL_DIV_RUNGS(EXPORT_RUNG)
    LOSSLAB_EXPORT(vectorized_options_forward, &kl_div_vectorized_options_forward)
    LOSSLAB_EXPORT(vectorized_options_backward, &kl_div_vectorized_options_backward)
    LOSSLAB_EXPORT(fused_options_forward, &kl_div_fused_options_forward)
};
LOSSLAB_EXPORT_ENTRIES(ENTRIES)
