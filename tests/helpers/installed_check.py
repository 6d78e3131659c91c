"""What the wheel's gpu-tier check measures, run by the Python of an environment where losslab is
installed (tests/test_prebuilt.py and scripts/wheel_gpu.sh run it there; from a checkout it measures
the checkout's path). Prints one JSON object:

context_s          seconds to create the CUDA context (torch's first CUDA tensor)
first_call_s       per loss, seconds of its first losslab.nn.functional call after that (import of
                   losslab.nn included), to the end of its kernels
errors             the largest relative error (norm of the difference / norm of the reference) of the
                   loss and of its gradient against PyTorch in float64, per operator call and dtype
allowances         per call and dtype, the same error of the float64 results merely rounded to the
                   dtype, which no result in that dtype can beat (a float16 gradient of a mean over
                   64000 elements lies below float16's smallest normal: about 1.7 %)
host_us            host time per call of a cross_entropy forward at the seed size (median of 200)
extension          per loss, the type serving its kernels (Library: prebuilt; else the pybind build)
"""
import json
import sys
import time

start = time.perf_counter()
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

torch.zeros(1, device="cuda")
torch.cuda.synchronize()
found = {"context_s": time.perf_counter() - start, "first_call_s": {}, "errors": {}, "allowances": {}}

x = torch.randn(64, 1000, device="cuda")
t = torch.randint(0, 1000, (64,), device="cuda")
start = time.perf_counter()
import losslab  # noqa: E402
import losslab.nn.functional as LF  # noqa: E402

LF.cross_entropy(x, t)
torch.cuda.synchronize()
found["first_call_s"]["cross_entropy"] = time.perf_counter() - start
start = time.perf_counter()
LF.kl_div(x.log_softmax(-1), x.softmax(-1), reduction="batchmean")
torch.cuda.synchronize()
found["first_call_s"]["kl_div"] = time.perf_counter() - start

from losslab import build, problems  # noqa: E402
from losslab.measure.timing import single_call_host_us  # noqa: E402


def relative_error(ours, ref):
    ours, ref = ours.detach().double(), ref.detach().double()
    return float((ours - ref).norm() / ref.norm().clamp_min(1e-30))


def check(name, ours, theirs, inputs, dtype):
    """Loss and gradient of ``ours`` on ``inputs`` (the first one the leaf) in ``dtype`` against
    ``theirs`` on the same values in float64."""
    leaf = inputs[0].detach().to(dtype).clone().requires_grad_(True)  # a leaf whatever inputs[0] is
    rest = [i.to(dtype) if i.is_floating_point() else i for i in inputs[1:]]
    loss = ours(leaf, *rest)
    loss.sum().backward()
    ref_leaf = leaf.detach().double().requires_grad_(True)
    ref = theirs(ref_leaf, *[i.double() if i.is_floating_point() else i for i in rest])
    ref.sum().backward()
    key = f"{name} {str(dtype).removeprefix('torch.')}"
    found["errors"][key] = max(relative_error(loss, ref), relative_error(leaf.grad, ref_leaf.grad))
    found["allowances"][key] = max(relative_error(ref.to(dtype), ref), relative_error(ref_leaf.grad.to(dtype),
                                                                                      ref_leaf.grad))


w = torch.rand(1000, device="cuda") + 0.5
# targets as distributions of their own: softmax(x) itself would make the KL and the gradient zero
q = torch.randn_like(x).log_softmax(-1)
t_ignored = t.clone()
t_ignored[::7] = 7
calls = {
    "F.cross_entropy": (lambda x, t: LF.cross_entropy(x, t), lambda x, t: F.cross_entropy(x, t), (x, t)),
    "F.cross_entropy weight, label_smoothing, ignore_index, sum": (
        lambda x, t, w: LF.cross_entropy(x, t, weight=w, label_smoothing=0.1, ignore_index=7, reduction="sum"),
        lambda x, t, w: F.cross_entropy(x, t, weight=w, label_smoothing=0.1, ignore_index=7, reduction="sum"),
        (x, t_ignored, w)),
    "F.cross_entropy probabilities, none": (
        lambda x, q: LF.cross_entropy(x, q, reduction="none"), lambda x, q: F.cross_entropy(x, q, reduction="none"),
        (x, q.exp())),
    "nn.CrossEntropyLoss": (lambda x, t: losslab.nn.CrossEntropyLoss()(x, t),
                            lambda x, t: torch.nn.CrossEntropyLoss()(x, t), (x, t)),
    "F.kl_div batchmean": (lambda p, q: LF.kl_div(p, q, reduction="batchmean"),
                           lambda p, q: F.kl_div(p, q, reduction="batchmean"), (x.log_softmax(-1), q.exp())),
    "F.kl_div log_target, none": (
        lambda p, q: LF.kl_div(p, q, reduction="none", log_target=True),
        lambda p, q: F.kl_div(p, q, reduction="none", log_target=True), (x.log_softmax(-1), q)),
}
for dtype in (torch.float32, torch.bfloat16, torch.float16):
    for name, (ours, theirs, inputs) in calls.items():
        check(name, ours, theirs, inputs, dtype)
for problem, variant in losslab.all_variants():  # every rung's operators
    spec = problems.get(problem)
    for dtype in spec.dtypes(variant):
        inputs = spec.make_inputs((64, 1000), seed=0, dtype=torch.float32)
        check(f"losslab.variant {problem} {variant}", losslab.variant(problem, variant), spec.reference, inputs, dtype)

rows, cols = problems.get("cross_entropy").sizes["seed"]
x, t = torch.randn(rows, cols, device="cuda"), torch.randint(0, cols, (rows,), device="cuda")
found["host_us"] = single_call_host_us(lambda: LF.cross_entropy(x, t), 200)
found["extension"] = {p: type(build.load_extension(p)).__name__ for p in problems.names()}
found["losslab"] = losslab.__file__
found["torch"] = torch.__version__
json.dump(found, sys.stdout)
