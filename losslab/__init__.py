"""losslab: a workbook for how loss kernels get fast on a GPU.

The ladder of hand-written CUDA variants of each loss (naive -> shared_memory
-> warp_shuffle -> vectorized -> fused, and cross_entropy's cluster for rows too long
for one SM), checked against PyTorch and placed on a roofline. See README.md and notebooks/.

    loss = losslab.variant("cross_entropy", "fused")(logits, targets)
    losslab.check_targets(targets, logits.shape[1])   # the target-range error, on request
"""
from losslab.ops import all_variants, variant
from losslab.problems.cross_entropy import check_targets

__all__ = ["all_variants", "check_targets", "variant"]
