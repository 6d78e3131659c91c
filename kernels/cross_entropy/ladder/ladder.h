// The cross_entropy teaching ladder: one idea per file, apart from the production
// rungs one folder up (which add dtypes, options, tickets and tuning). Each file
// defines cross_entropy_<rung>_forward and _backward with launchers.h's signatures
// (float32 only, mean reduction, ignore_index = -100); the ladder is built into an
// extension of its own (losslab/build/ladder.py), so the names do not clash.
//
//   naive          one thread per row, an online log-sum-exp (uncoalesced)
//   shared_memory  one block per row, coalesced; tree reductions in shared memory
//   warp_shuffle   the block's reduction with __shfl_xor_sync, one slot per warp
//   vectorized     float4 loads and stores, a scalar head and tail
//   fused          the forward writes the gradient too: the logits read once
//   cluster        a long row split over a thread-block cluster (sm_90), held in
//                  shared memory, the CTAs combining through distributed shared memory
#pragma once
#include "cross_entropy/launchers.h"

#define CROSS_ENTROPY_LADDER(X) X(naive) X(shared_memory) X(warp_shuffle) X(vectorized) X(fused) X(cluster)
