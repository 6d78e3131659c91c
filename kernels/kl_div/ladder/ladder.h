// The teaching ladder of kl_div: one idea per step, float32 and PyTorch's default
// options (batchmean) only, in the spirit of cuda-samples' reduce0..reduce7 and
// llm.c's dev/cuda kernels. The production rungs (kernels/kl_div/<rung>.cu) add
// dtypes, options and one-kernel forwards; these files keep only the lesson.
//
// Each kernels/kl_div/ladder/<rung>.cu defines kl_div_<rung>_forward and
// kl_div_<rung>_backward with launchers.h's signatures (the one contract); they are
// built into their own extension (losslab.build.ladder: losslab_kl_div_ladder), so
// the names do not clash with the production files'. Consecutive rungs keep the
// same identifiers and sections, so that a diff of two shows the idea alone.
#pragma once
#include "kl_div/launchers.h"

// The rungs, in ladder order (an X-macro: the binding binds each one).
#define KL_DIV_LADDER(X) X(naive) X(shared_memory) X(warp_shuffle) X(vectorized) X(fused)
