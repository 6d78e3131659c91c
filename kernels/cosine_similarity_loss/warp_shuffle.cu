// warp_shuffle: the teaching ladder's rung (ladder/warp_shuffle.cu) as the operator, unchanged: float32,
// dL/dp only. Its idea and its flaw are in that file's header; the operators' own work
// starts at vectorized (every dtype, the targets' gradient, one-kernel forwards).
#include "cosine_similarity_loss/ladder/warp_shuffle.cu"
