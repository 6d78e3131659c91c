// C entry points of the cosine_similarity_loss operator kernels for the prebuilt library (c_abi.h):
// what the pybind binding cosine_similarity_loss.cpp binds, under the same names, from the same X-macro.
#include "c_abi.h"
#include "cosine_similarity_loss/launchers.h"
#include "cosine_similarity_loss/similarity.h"

#define EXPORT_RUNG(rung) LOSSLAB_EXPORT_RUNG(cosine_similarity_loss, rung)
static const LosslabEntry ENTRIES[] = {
    COSINE_SIMILARITY_LOSS_RUNGS(EXPORT_RUNG)
    LOSSLAB_EXPORT(rows_forward, &cosine_similarity_loss_rows_forward)
    LOSSLAB_EXPORT(rows_backward, &cosine_similarity_loss_rows_backward)
};
LOSSLAB_EXPORT_ENTRIES(ENTRIES)
