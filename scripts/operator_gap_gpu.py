"""Where the public operator (losslab.nn) loses time against the fused rung it runs: one GPU call.

For each problem named (default: every one) at its seed size, float32 and bfloat16: the median of
20 forward+backward calls (CUDA events, ms) of ``losslab.nn.functional.on_problem(problem)`` and of
``losslab.variant(problem, "fused")``, then one call of each under torch.profiler, listing every
CUDA kernel, copy and memset it ran with its time (us). A kernel, copy or memset the operator runs
and the rung does not is the gap. Prints a table per problem; records nothing.
    usage: python scripts/operator_gap_gpu.py [problem ...]
"""
from __future__ import annotations

import sys

import torch

import losslab
from losslab import problems
from losslab.nn import functional


def step(fn, inputs):
    """One forward+backward, the first input requiring grad (as the records time it)."""
    first = inputs[0].detach().requires_grad_(True)
    fn(first, *inputs[1:]).backward()


def median_ms(fn, inputs, repeats: int = 20) -> float:
    step(fn, inputs)  # warm: builds, allocator
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step(fn, inputs)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def gpu_work(fn, inputs) -> list[tuple[str, float]]:
    """(name, us) of each kernel, copy and memset one forward+backward runs, in order."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        step(fn, inputs)
        torch.cuda.synchronize()
    cuda = torch.autograd.DeviceType.CUDA
    return [(e.name, getattr(e, "device_time", None) or getattr(e, "cuda_time", 0.0))
            for e in prof.events() if e.device_type == cuda]


def main(names: list[str]) -> int:
    if not torch.cuda.is_available():
        print("operator_gap_gpu: no CUDA GPU visible here", file=sys.stderr)
        return 2
    for name in names or problems.names():
        problem = problems.get(name)
        for dtype in (torch.float32, torch.bfloat16):
            inputs = problem.make_inputs(problem.sizes["seed"], seed=0, device="cuda", dtype=dtype)
            shape = "x".join(map(str, inputs[0].shape))
            print(f"== {name} {shape} {str(dtype).removeprefix('torch.')}: forward+backward")
            implementations = (("losslab.nn", functional.on_problem(name)),
                               ("fused", losslab.variant(problem, "fused")))
            for label, fn in implementations:
                print(f"  {label:<11} median {median_ms(fn, inputs):.3f} ms")
                for kernel, us in gpu_work(fn, inputs):
                    print(f"      {us:9.1f} us  {kernel[:110]}")
            del inputs
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
