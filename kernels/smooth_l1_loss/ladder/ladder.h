// The teaching ladder of smooth_l1_loss: one idea per step, float32 and PyTorch's default
// options (reduction mean) only, in the spirit of cuda-samples' reduce0..reduce7 and
// llm.c's dev/cuda kernels. The operators (kernels/smooth_l1_loss/vectorized.cu, fused.cu) add
// dtypes, options and one-kernel forwards; these files keep only the lesson.
//
// Each kernels/smooth_l1_loss/ladder/<rung>.cu defines smooth_l1_loss_<rung>_forward and
// smooth_l1_loss_<rung>_backward with launchers.h's signatures (the one contract); they are
// built into their own extension (losslab.build.ladder: losslab_smooth_l1_loss_ladder), so
// the names do not clash with the production files'. Consecutive rungs keep the
// same identifiers and sections, so that a diff of two shows the idea alone.
#pragma once
#include "smooth_l1_loss/launchers.h"

// The rungs, in ladder order (an X-macro: the binding binds each one).
#define SMOOTH_L1_LOSS_LADDER(X) X(naive) X(shared_memory) X(warp_shuffle) X(vectorized) X(fused)
// launchers.h declares the operators' rungs; the lower rungs exist only here.
#define SMOOTH_L1_LOSS_LADDER_DECLARE(rung) \
    smooth_l1_loss_forward_fn smooth_l1_loss_##rung##_forward;                                   \
    smooth_l1_loss_backward_fn smooth_l1_loss_##rung##_backward;
SMOOTH_L1_LOSS_LADDER(SMOOTH_L1_LOSS_LADDER_DECLARE)
#undef SMOOTH_L1_LOSS_LADDER_DECLARE
