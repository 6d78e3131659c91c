"""Read and copy bandwidth against the bytes moved: how much of the large-size ceiling any
kernel reaches at the sizes of the sweep, per call with L2 flushed (the record's method).

    python scripts/bandwidth_by_size.py [--mib 64,128,256,512,1024,2048]

One line per size: GB/s of each method of ``measure.ceilings.measure_bandwidth_methods``
(torch.sum, the two-stream read kernel, Tensor.copy_) and the best read and copy as a
fraction of the best at the largest size. A loss kernel that reads B bytes is compared with
the read ceiling at the same B: where even a plain read falls short of the large-size
ceiling, the shortfall is the memory system's ramp (launch, first bytes, last block), not
the kernel's. E.g. kl_div 2048 x 16384 bf16 reads 128 MiB, cross_entropy 32768 x 4096 bf16
256 MiB. Needs a CUDA GPU.
"""
from __future__ import annotations

import argparse

import torch

from losslab.measure.ceilings import best_bandwidth, measure_bandwidth_methods


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", default="64,128,256,512,1024,2048", help="comma-separated sizes in MiB")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    sizes = sorted(int(s) for s in args.mib.split(","))
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; GB/s per call, L2 flushed")
    rows = [(mib, measure_bandwidth_methods(mib * 2**20, args.repeats)) for mib in sizes]
    largest = best_bandwidth(rows[-1][1])
    methods = list(rows[-1][1])
    print(f"{'MiB':>6} " + " ".join(f"{m:>22}" for m in methods) + f" {'read/largest':>13} {'copy/largest':>13}")
    for mib, by_method in rows:
        best = best_bandwidth(by_method)
        print(f"{mib:>6} " + " ".join(f"{by_method[m]:>22.0f}" for m in methods)
              + f" {best['read'] / largest['read']:>13.0%} {best['copy'] / largest['copy']:>13.0%}")


if __name__ == "__main__":
    main()
