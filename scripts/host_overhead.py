"""Host time and GPU time per call of the losslab operators at launch-bound sizes, against torch.compile.

    python scripts/host_overhead.py [--calls 200] [--variants vectorized,fused] [--no-compile]

For each problem, shape (128 x 4096, 2048 x 4096), dtype (float32, bfloat16), implementation
(the rungs asked for that the problem has for the dtype, ``losslab.nn.functional``'s function, and the PyTorch
definition eager and under torch.compile) and direction
(forward without autograd; forward + backward; forward + backward with the autograd engine on the
calling thread, ``torch.autograd.set_multithreading_enabled(False)``), one line:

- host1 us: how long one call takes to return on the host, each after a synchronisation
  (Python, dispatch, allocations and launches), the median of ``calls``;
- host us: the same, ``calls`` calls back to back (more where the kernels take longer than
  the host and the launch queue fills up);
- b2b us: GPU time per call, the same calls queued back to back between two events;
- call us: one call between two events after a synchronisation, the median of ``calls``
  (what a lone call costs end to end: where host time exceeds the kernels', the GPU idles
  between them and this is about the host time).

By default PyTorch's autograd engine runs a CUDA backward on a worker thread of its own, and
the calling thread waits for it: at launch-bound sizes that hand-over, not the kernels, is most of
a forward + backward call, for every implementation alike; the "1 thread" rows show how much.

Then a breakdown of one losslab forward's host time into its parts (validation, allocation,
launch, the autograd.Function), to see where the microseconds go, and what a backward written in
Python costs by itself (a sum's, with PyTorch's C++ backward node and with a Python one). Needs a
CUDA GPU.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import losslab
import losslab.nn.functional as LF
from losslab import build, ops, problems
from losslab.measure.timing import single_call_host_us
from losslab.problems import launch as launch_mod

SHAPES = ((128, 4096), (2048, 4096))
DTYPES = (torch.float32, torch.bfloat16)


def host_us(fn, calls: int) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter_ns() - start
    torch.cuda.synchronize()
    return elapsed / calls / 1e3


def back_to_back_us(fn, calls: int) -> float:
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    begin.record()
    for _ in range(calls):
        fn()
    end.record()
    torch.cuda.synchronize()
    return begin.elapsed_time(end) * 1e3 / calls


def per_call_us(fn, calls: int) -> float:
    times = []
    for _ in range(calls):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        begin.record()
        fn()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end) * 1e3)
    return statistics.median(times)


def calls_of(loss_fn, inputs):
    """(forward without autograd, forward + backward, the same on the calling thread) as
    zero-argument functions; the gradient is taken w.r.t. the first input."""
    leaf = inputs[0].clone().requires_grad_(True)
    rest = inputs[1:]

    def forward():
        loss_fn(*inputs)

    def forward_backward():
        leaf.grad = None
        loss_fn(leaf, *rest).backward()

    def forward_backward_one_thread():
        with torch.autograd.set_multithreading_enabled(False):
            forward_backward()

    return forward, forward_backward, forward_backward_one_thread


def measure(name, fns, calls):
    for fn in fns:  # warm up: builds, compiles, allocator
        for _ in range(5):
            fn()
    rows = []
    for direction, fn in zip(("forward", "fwd+bwd", "1 thread"), fns, strict=True):
        rows.append((name, direction, single_call_host_us(fn, calls), host_us(fn, calls), back_to_back_us(fn, calls),
                     per_call_us(fn, calls)))
    return rows


def table(args) -> None:
    print(f"{'problem':14} {'shape':>11} {'dtype':9} {'impl':16} {'direction':9} "
          f"{'host1 us':>8} {'host us':>8} {'b2b us':>8} {'call us':>8}")
    for problem in problems.names():
        spec = problems.get(problem)
        for shape in SHAPES:
            for dtype in DTYPES:
                inputs = spec.make_inputs(shape, seed=0, dtype=dtype)
                impls = [(v, losslab.variant(problem, v)) for v in args.variants
                         if v in spec.variants and dtype in spec.dtypes(v)]
                impls.append(("losslab.nn", LF.on_problem(problem)))  # what a user calls
                impls.append(("eager", spec.reference))  # PyTorch's own call: the host-time goal's yardstick
                if args.compile:
                    impls.append(("torch.compile", torch.compile(spec.reference)))
                for name, loss_fn in impls:
                    for row in measure(name, calls_of(loss_fn, inputs), args.calls):
                        print(f"{problem:14} {shape[0]:>5}x{shape[1]:<5} {str(dtype)[6:]:9} {row[0]:16} {row[1]:9} "
                              f"{row[2]:8.1f} {row[3]:8.1f} {row[4]:8.1f} {row[5]:8.1f}", flush=True)


def breakdown(calls: int) -> None:
    """Host us of the parts of one forward (kl_div and cross_entropy vectorized, 128 x 4096 fp32)."""
    print("\nbreakdown of one forward's host time (us per call, 128 x 4096 float32, vectorized; "
          "median of single calls, then back to back)")
    x = torch.empty(128, 4096, device="cuda")
    parts = {
        "torch.empty(128) float32": lambda: torch.empty(128, device="cuda"),
        "x.contiguous()": lambda: x.contiguous(),
        "raw stream + current device": lambda: (torch.cuda.current_device(),
                                                torch._C._cuda_getCurrentRawStream(0)),
        "tensor view x[0]": lambda: x[0],
    }
    for problem in problems.names():
        spec = problems.get(problem)
        inputs = spec.make_inputs((128, 4096), seed=0)
        rung_ops = ops.OPS[(problem, "vectorized")]
        parts[f"{problem}: validate"] = lambda spec=spec, inputs=inputs: spec.validate(*inputs)
        parts[f"{problem}: operator kernel (no autograd)"] = lambda r=rung_ops, inputs=inputs: r.forward_kernel(*inputs)
        parts[f"{problem}: infer (loss only)"] = lambda r=rung_ops, inputs=inputs: r.infer(*inputs)
        parts[f"{problem}: RungOps call (no grad)"] = lambda r=rung_ops, inputs=inputs: r(*inputs)
        loss_fn = losslab.variant(problem, "vectorized")
        parts[f"{problem}: variant call (no grad)"] = lambda f=loss_fn, inputs=inputs: f(*inputs)
        parts[f"{problem}: torch.ops operator"] = lambda r=rung_ops, inputs=inputs: r.forward(*inputs)
    # the drop-in functions (losslab.nn.functional) and PyTorch's own, no grad
    logits, labels = problems.get("cross_entropy").make_inputs((128, 4096), seed=0)
    log_p, q = problems.get("kl_div").make_inputs((128, 4096), seed=0)
    log_p = log_p.log()
    parts["nn.functional.cross_entropy (no grad)"] = lambda: LF.cross_entropy(logits, labels)
    parts["F.cross_entropy, PyTorch (no grad)"] = lambda: torch.nn.functional.cross_entropy(logits, labels)
    parts["nn.functional.kl_div batchmean (no grad)"] = lambda: LF.kl_div(log_p, q, reduction="batchmean")
    parts["F.kl_div batchmean, PyTorch (no grad)"] = lambda: torch.nn.functional.kl_div(log_p, q,
                                                                                       reduction="batchmean")
    leaf = logits.clone().requires_grad_(True)
    parts["nn.functional.cross_entropy (forward, grad)"] = lambda: LF.cross_entropy(leaf, labels)
    # a launch of the kl_div vectorized forward alone (one kernel), its buffers allocated outside
    p, t = problems.get("kl_div").make_inputs((128, 4096), seed=0)
    scratch = torch.empty(4 + 128 + 4, device="cuda")  # kl_div.forward's layout: the loss, then the partials
    kl_ext = build.load_extension("kl_div")
    parts["kl_div: launch_values() alone"] = lambda: launch_mod.launch_values(
        kl_ext.vectorized_forward, p.device, p.data_ptr(), t.data_ptr(), scratch.data_ptr() + 16, scratch.data_ptr(),
        0, 128, 4096, launch_mod.DTYPE_CODES[torch.float32])
    for name, fn in parts.items():
        for _ in range(20):
            fn()
        print(f"  {name:44} {single_call_host_us(fn, calls):7.1f} {host_us(fn, calls):7.1f}")


class PythonSum(torch.autograd.Function):
    """``x.sum()`` with its backward in Python, as losslab's eager operators have theirs."""

    @staticmethod
    def forward(ctx, x):
        ctx.shape = x.shape
        return x.sum()

    @staticmethod
    def backward(ctx, grad):
        return grad.expand(ctx.shape)


def hand_off(calls: int) -> None:
    """Host us of a sum's forward + backward (128 x 4096 float32) with PyTorch's C++ backward node
    and with a Python one, on autograd's device thread and on the calling thread: what a Python
    backward costs by itself, apart from any kernel of losslab's."""
    print("\nforward + backward of x.sum(), 128 x 4096 float32 (us per call; median of single calls, "
          "then back to back)")
    x = torch.randn(128, 4096, device="cuda")
    for name, loss_fn in (("C++ backward (SumBackward0)", torch.sum),
                          ("Python backward (autograd.Function)", PythonSum.apply)):
        _, step, one_thread = calls_of(loss_fn, (x,))
        for where, fn in (("device thread", step), ("calling thread", one_thread)):
            for _ in range(20):
                fn()
            print(f"  {name + ', ' + where:58} {single_call_host_us(fn, calls):7.1f} {host_us(fn, calls):7.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--variants", default="vectorized,fused")
    parser.add_argument("--no-compile", dest="compile", action="store_false")
    args = parser.parse_args()
    args.variants = args.variants.split(",")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    table(args)
    breakdown(args.calls)
    hand_off(args.calls)


if __name__ == "__main__":
    main()
