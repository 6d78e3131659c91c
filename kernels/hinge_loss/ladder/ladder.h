// The teaching ladder of hinge_loss: one idea per step, float32 only, in the spirit of
// cuda-samples' reduce0..reduce7. The loss is an element-wise mean over all B x D
// elements, so the ladder is about the grid-wide reduction and bandwidth; the (D,)
// targets, shared by every row, are what distinguishes it from a plain sum. The
// production rungs (kernels/hinge_loss/<rung>.cu) add dtypes, options and one-kernel
// forwards; these files keep only the lesson.
//
// Each kernels/hinge_loss/ladder/<rung>.cu defines hinge_loss_<rung>_forward and
// hinge_loss_<rung>_backward with launchers.h's signatures (the one contract); they are
// built into their own extension (losslab.build.ladder: losslab_hinge_loss_ladder), so
// the names do not clash with the production files'. Consecutive rungs keep the same
// identifiers and sections, so that a diff of two shows the idea alone.
#pragma once
#include "hinge_loss/launchers.h"

// The rungs, in ladder order (an X-macro: the binding binds each one).
#define HINGE_LOSS_LADDER(X) X(naive) X(shared_memory) X(warp_shuffle) X(vectorized) X(fused)
