// The cosine_similarity_loss teaching ladder: one idea per step, float32, eps = 1e-8
// and dL/dpredictions only; the production rungs (kernels/cosine_similarity_loss/
// <rung>.cu) add dtypes, the targets' gradient and one-kernel forwards.
//
// Each kernels/cosine_similarity_loss/ladder/<rung>.cu defines
// cosine_similarity_loss_<rung>_forward and _backward with launchers.h's signatures; they
// are built into their own extension (losslab.build.ladder), so the names do not clash
// with the production files'. A row's work is three dot products (p.t, p.p, t.t), as
// cross_entropy's is a log-sum-exp: the same ladder of per-row reductions.
//
//   naive          one thread per row (uncoalesced)
//   shared_memory  one block per row, coalesced; a tree of the three sums in shared memory
//   warp_shuffle   the block's three sums with __shfl_xor_sync, one slot per warp
//   vectorized     float4 loads and stores, a scalar head and tail
//   fused          the forward writes the gradient too, from registers: rows of up to 8192
//                  floats read once
#pragma once
#include "cosine_similarity_loss/launchers.h"

#define COSINE_SIMILARITY_LOSS_LADDER(X) X(naive) X(shared_memory) X(warp_shuffle) X(vectorized) X(fused)
