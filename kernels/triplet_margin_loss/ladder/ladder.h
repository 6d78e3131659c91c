// The triplet_margin_loss teaching ladder: one idea per file, apart from the operators one folder
// up (which add dtypes, options, the three gradients and one-kernel forwards). Each file defines
// triplet_margin_loss_<rung>_forward and _backward with launchers.h's signatures (float32 only,
// PyTorch's defaults, the anchor's gradient); the ladder is built into an extension of its own
// (losslab/build/ladder.py), so the names do not clash with the operators'.
//
//   naive          one thread per row, looping over its D elements of the three inputs (uncoalesced)
//   shared_memory  one block per row, coalesced; the two squared distances by a tree in shared memory
//   warp_shuffle   the block's reduction with __shfl_xor_sync, one slot per warp
//   vectorized     float4 loads and stores where the rows are 16-byte aligned
//   fused          the forward writes the gradient too: the backward reads nothing again
#pragma once
#include "triplet_margin_loss/launchers.h"

#define TRIPLET_MARGIN_LOSS_LADDER(X) X(naive) X(shared_memory) X(warp_shuffle) X(vectorized) X(fused)
// The operators declare only their own rungs (launchers.h): the ladder declares all of its, the same types.
#define TRIPLET_MARGIN_LOSS_LADDER_DECLARE(rung)                            \
    triplet_margin_loss_forward_fn triplet_margin_loss_##rung##_forward;    \
    triplet_margin_loss_backward_fn triplet_margin_loss_##rung##_backward;
TRIPLET_MARGIN_LOSS_LADDER(TRIPLET_MARGIN_LOSS_LADDER_DECLARE)
#undef TRIPLET_MARGIN_LOSS_LADDER_DECLARE
