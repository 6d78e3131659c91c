"""losslab: a workbook for how loss kernels get fast on a GPU.

The ladder of hand-written CUDA variants of each loss (naive -> shared_memory
-> warp_shuffle -> vectorized), checked against PyTorch and placed on a
roofline. See README.md and notebooks/.
"""
from losslab.ops import all_variants, variant

__all__ = ["variant", "all_variants"]
