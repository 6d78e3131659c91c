"""losslab.nn: drop-in kl_div / cross_entropy with PyTorch's options.

cpu tier: argument errors of the same kind as PyTorch's (checked against it on CPU tensors),
the modules' constructor signatures, the operators' schemas and fake shapes (meta tensors,
autograd through them), the options' cost model.
compile tier: the option kernels compile without spills for sm_80 and sm_90 and are bound.
gpu tier: every option against PyTorch in float64 (forward and backward, both rungs, odd
shapes), bf16/fp16 within their tolerances, opcheck, no host wait, and a
torch.compile(fullgraph=True) training step captured in a CUDA graph.
"""
import inspect
import warnings

import pytest
import torch
import torch.nn.functional as F

import losslab.nn as lnn
import losslab.nn.functional as LF
from losslab import build
from losslab.measure.check import TOLERANCES
from losslab.nn import operators as O
from losslab.problems import cross_entropy as ce_host
from losslab.problems import kl_div as kl_host
from losslab.problems.base import misaligned_view

# --- cpu tier: errors as PyTorch's -----------------------------------------------------------------

X, T = torch.randn(4, 5), torch.randint(0, 5, (4,))
CE_ERRORS = {
    "unknown reduction": lambda f: f(X, T, reduction="avg"),
    "label_smoothing above 1": lambda f: f(X, T, label_smoothing=1.5),
    "int32 class indices": lambda f: f(X, T.int()),
    "bool class indices": lambda f: f(X, T.bool()),
    "batch sizes differ": lambda f: f(X, T[:3]),
    "weight of the wrong length": lambda f: f(X, T, weight=torch.ones(3)),
    "weight not 1-D": lambda f: f(X, T, weight=torch.ones(5, 1)),
    "weight of another dtype": lambda f: f(X, T, weight=torch.ones(5, dtype=torch.float64)),
    "ignore_index with probabilities": lambda f: f(X, torch.rand(4, 5), ignore_index=1),
    "2-D class indices for 2-D input": lambda f: f(X, T[:, None]),
    "spatial target of the wrong size": lambda f: f(torch.randn(2, 5, 3), torch.randint(0, 5, (2, 4))),
    "input not a tensor": lambda f: f([1.0], T),
    "integer logits": lambda f: f(X.long(), T),
}
KL_ERRORS = {
    "unknown reduction": lambda f: f(X, X, reduction="avg"),
    "shapes that do not broadcast": lambda f: f(X, torch.rand(3, 5)),
    "integer inputs": lambda f: f(X.long(), X.long()),
    "input not a tensor": lambda f: f(1.0, X),
}


def _error_type(call):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            call()
    except Exception as err:  # noqa: BLE001 - the kind of error is what is compared
        return type(err)
    return None


@pytest.mark.parametrize("case", CE_ERRORS)
def test_cross_entropy_raises_pytorchs_kind_of_error(case):
    expected = _error_type(lambda: CE_ERRORS[case](F.cross_entropy))
    assert expected is not None
    assert _error_type(lambda: CE_ERRORS[case](LF.cross_entropy)) is expected


@pytest.mark.parametrize("case", KL_ERRORS)
def test_kl_div_raises_pytorchs_kind_of_error(case):
    expected = _error_type(lambda: KL_ERRORS[case](F.kl_div))
    assert expected is not None
    assert _error_type(lambda: KL_ERRORS[case](LF.kl_div)) is expected


def test_what_pytorch_accepts_but_losslab_cannot_run_is_named():
    with pytest.raises(ValueError, match="input: losslab's kernels need a CUDA tensor"):
        LF.cross_entropy(X, T)
    with pytest.raises(TypeError, match="float64"):
        LF.cross_entropy(X.double(), T)
    with pytest.raises(NotImplementedError, match="target"):
        LF.kl_div(X, torch.rand(4, 5, requires_grad=True), reduction="sum")


def test_kl_div_mean_warns_as_pytorch_does():
    with pytest.warns(UserWarning, match="'mean' divides the total loss by both the batch size and the support"):
        with pytest.raises(ValueError):  # a CPU tensor: the warning comes first, as in PyTorch
            LF.kl_div(X, X.softmax(-1), reduction="mean")


@pytest.mark.parametrize("ours, theirs", [(lnn.CrossEntropyLoss, torch.nn.CrossEntropyLoss),
                                          (lnn.KLDivLoss, torch.nn.KLDivLoss)])
def test_modules_have_pytorchs_constructors(ours, theirs):
    def params(cls):
        return [(p.name, p.default) for p in inspect.signature(cls).parameters.values()]

    assert params(ours) == params(theirs)
    module = ours()
    assert module.reduction == theirs().reduction


def test_functions_have_pytorchs_parameters():
    for ours, theirs in ((LF.cross_entropy, F.cross_entropy), (LF.kl_div, F.kl_div)):
        names = [(p.name, p.default) for p in inspect.signature(ours).parameters.values()]
        assert names == [(p.name, p.default) for p in inspect.signature(theirs).parameters.values()]


# --- cpu tier: operators on meta tensors ------------------------------------------------------------

OPERATORS = [O.ce_forward, O.ce_forward_grad, O.ce_backward, O.kl_forward, O.kl_forward_grad, O.kl_backward]


@pytest.mark.parametrize("op", OPERATORS, ids=lambda op: op.name())
def test_operators_mutate_nothing(op):
    assert op.name().startswith("losslab::nn_")
    assert not op._schema.is_mutable and all(a.alias_info is None for a in op._schema.arguments)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("probs", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cross_entropy_fakes_give_the_kernels_shapes(reduction, probs, dtype):
    x = torch.empty(8, 16, device="meta", dtype=dtype, requires_grad=True)
    t = torch.empty(8, 16, device="meta", dtype=dtype) if probs else torch.empty(8, device="meta", dtype=torch.int64)
    w = torch.empty(16, device="meta")
    args = (None, t, w) if probs else (t, None, w)
    code = ce_host.REDUCTIONS[reduction]
    loss, *state = O.ce_forward(x, *args, -100, 0.1, code)
    assert loss.shape == ((8,) if reduction == "none" else ()) and loss.dtype == dtype
    assert [s.shape for s in state] == [(8,), (8,), (8,), (2,)]
    (grad,) = torch.autograd.grad(loss.sum(), x)
    assert grad.shape == x.shape and grad.dtype == dtype
    if reduction != "none":
        loss, grad = O.ce_forward_grad(x, *args, -100, 0.1, code)
        assert loss.shape == () and grad.shape == x.shape and grad.is_contiguous()
        (grad,) = torch.autograd.grad(loss, x)
        assert grad.shape == x.shape


@pytest.mark.parametrize("reduction", list(kl_host.REDUCTIONS))
def test_kl_div_fakes_give_the_kernels_shapes(reduction):
    x = torch.empty(5, 13, 7, device="meta", requires_grad=True)
    code = kl_host.REDUCTIONS[reduction]
    loss = O.kl_forward(x, x.detach(), code, False)
    assert loss.shape == (x.shape if reduction == "none" else ())
    assert torch.autograd.grad(loss.sum(), x)[0].shape == x.shape
    if reduction != "none":
        loss, grad = O.kl_forward_grad(x, x.detach(), code, True)
        assert loss.shape == () and grad.shape == x.shape


# --- cpu tier: cost model -----------------------------------------------------------------------------

def test_cross_entropy_cost_counts_each_options_bytes():
    shape, size = (1000, 4096), 2
    base = ce_host.options_cost(shape, "forward", torch.bfloat16)
    assert base.bytes_read == 1000 * 4096 * size + 1000 * 8 and base.bytes_written == size
    weighted = ce_host.options_cost(shape, "forward", torch.bfloat16, weight=True)
    assert weighted.bytes_read - base.bytes_read == 4096 * 4 + 1000 * 4  # the weights once, w[t] per row
    probs = ce_host.options_cost(shape, "forward", torch.bfloat16, probs=True)
    assert probs.bytes_read - base.bytes_read == 1000 * 4096 * size - 1000 * 8  # N x C probabilities, no indices
    none = ce_host.options_cost(shape, "forward", torch.bfloat16, reduction="none")
    assert none.bytes_written == 1000 * size
    smooth = ce_host.options_cost(shape, "forward", torch.bfloat16, label_smoothing=0.1)
    assert smooth.bytes == base.bytes and smooth.flops > base.flops
    assert ce_host.options_cost(shape, "forward_backward", torch.bfloat16).bytes_written == 1000 * 4096 * size + size
    with pytest.raises(ValueError, match="direction"):
        ce_host.options_cost(shape, "sideways")


def test_kl_div_cost_counts_each_options_bytes():
    n = 5 * 13 * 7
    forward = kl_host.options_cost(n, "forward")
    assert forward.bytes_read == 2 * n * 4 and forward.bytes_written == 4
    assert kl_host.options_cost(n, "forward", reduction="none").bytes_written == n * 4
    assert kl_host.options_cost(n, "backward").bytes_read == n * 4 + 4  # the target only: -t * scale
    assert kl_host.options_cost(n, "backward", reduction="none").bytes_read == 2 * n * 4
    assert kl_host.options_cost(n, "forward_backward").bytes_written == n * 4 + 4
    with pytest.raises(ValueError, match="fused"):
        kl_host.options_cost(n, "forward_backward", reduction="none")


def test_kl_div_divisors_are_pytorchs():
    assert kl_host.options_divisor((5, 13, 7), kl_host.REDUCTIONS["mean"]) == 5 * 13 * 7
    assert kl_host.options_divisor((5, 13, 7), kl_host.REDUCTIONS["batchmean"]) == 5
    assert kl_host.options_divisor((), kl_host.REDUCTIONS["batchmean"]) == 1
    assert kl_host.options_divisor((5, 13), kl_host.REDUCTIONS["sum"]) == 1


# --- compile tier -------------------------------------------------------------------------------------

OPTION_SOURCES = [(p, r) for p in ("kl_div", "cross_entropy") for r in ("vectorized", "fused")]


@pytest.mark.compile
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("problem, rung", OPTION_SOURCES)
def test_option_kernels_compile_without_spills(tmp_path, problem, rung, arch):
    _, report = build.compile_cubin(build.KERNELS / problem / f"{rung}.cu", arch, tmp_path)
    kernels = [k for k in build.resource_usage(report, arch) if "options" in k.kernel]
    assert len(kernels) >= 3, f"expected the options kernels (one per dtype) in {problem}/{rung}.cu"
    for k in kernels:
        assert k.spill_store_bytes == k.spill_load_bytes == k.stack_bytes == 0, f"{k.kernel} spills on {arch}"


@pytest.mark.compile
@pytest.mark.parametrize("problem", ["kl_div", "cross_entropy"])
def test_option_launchers_are_bound(problem):
    ext = build.load_extension(problem)
    names = ["vectorized_options_forward", "vectorized_options_backward", "fused_options_forward"]
    for name in names:
        assert callable(getattr(ext, name))


# --- gpu tier -----------------------------------------------------------------------------------------

def _relative_error(ours: torch.Tensor, ref: torch.Tensor) -> float:
    ours, ref = ours.detach().double(), ref.detach().double()
    both_nan = torch.isnan(ours) & torch.isnan(ref)
    ours, ref = torch.where(both_nan, 0, ours), torch.where(both_nan, 0, ref)
    return float((ours - ref).norm() / ref.norm().clamp_min(1e-30))


def _tolerance(dtype: torch.dtype, ref: torch.Tensor, roundings: int = 1) -> float:
    """float32: 1e-5; 16-bit: the dtype's epsilon plus ``roundings`` times the rounding of the
    exact result to it (fused rounds its gradient for grad_loss = 1 to the dtype, then scales
    it by grad_loss and rounds again: two roundings, which matter where the gradient's
    elements are 16-bit subnormals, e.g. a mean over 37 x 1001 float16 elements)."""
    if dtype == torch.float32:
        return 1e-5
    return TOLERANCES[dtype][0] + roundings * _relative_error(ref.to(dtype), ref)


CE_CASES = {
    # name: (input shape, class probabilities, weight, ignore_index, label_smoothing)
    "indices": ((37, 1001), False, False, -100, 0.0),
    "indices, ignore_index 3": ((37, 1001), False, False, 3, 0.0),
    "indices, weight": ((37, 1001), False, True, -100, 0.0),
    "indices, smoothing": ((37, 1001), False, False, -100, 0.1),
    "indices, weight, smoothing, ignore_index 7": ((37, 1001), False, True, 7, 0.25),
    "probabilities": ((37, 1001), True, False, -100, 0.0),
    "probabilities, weight, smoothing": ((37, 1001), True, True, -100, 0.1),
    "spatial indices, weight, smoothing": ((5, 13, 7, 3), False, True, -100, 0.1),
    "spatial probabilities": ((5, 13, 7, 3), True, False, -100, 0.0),
    "unbatched": ((1001,), False, True, -100, 0.1),
    "C = 1": ((64, 1), False, False, -100, 0.1),
}


def _ce_inputs(case, dtype, seed=0):
    shape, probs, weighted, ignore_index, smoothing = CE_CASES[case]
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = (torch.randn(shape, generator=gen, device="cuda") * 3).to(dtype)
    classes = shape[0] if len(shape) == 1 else shape[1]
    if probs:
        t = torch.randn(shape, generator=gen, device="cuda").softmax(0 if len(shape) == 1 else 1).to(dtype)
    else:
        t_shape = () if len(shape) == 1 else (shape[0], *shape[2:])
        t = torch.randint(0, classes, t_shape, generator=gen, device="cuda")
        if t.dim():
            t.view(-1)[::5] = ignore_index  # every fifth target ignored
    w = (torch.rand(classes, generator=gen, device="cuda") + 0.5).to(dtype) if weighted else None
    return x, t, w, dict(ignore_index=ignore_index, label_smoothing=smoothing)


@pytest.mark.gpu
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "vectorized"])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", CE_CASES)
def test_cross_entropy_matches_pytorch_in_float64(monkeypatch, case, dtype, reduction, fused):
    monkeypatch.setattr(LF, "PREFER_FUSED", fused)
    x, t, w, options = _ce_inputs(case, dtype)
    ref_x = x.double().requires_grad_(True)
    ref = F.cross_entropy(ref_x, t.double() if t.is_floating_point() else t,
                          weight=None if w is None else w.double(), reduction=reduction, **options)
    upstream = torch.randn_like(ref) if reduction == "none" else torch.tensor(0.75, device="cuda", dtype=ref.dtype)
    ref.backward(upstream)
    ours_x = x.clone().requires_grad_(True)
    loss = LF.cross_entropy(ours_x, t, weight=w, reduction=reduction, **options)
    assert loss.shape == ref.shape and loss.dtype == dtype
    loss.backward(upstream.to(dtype))
    assert _relative_error(loss, ref) <= _tolerance(dtype, ref), f"loss {loss} vs {ref}"
    assert _relative_error(ours_x.grad, ref_x.grad) <= _tolerance(dtype, ref_x.grad, 1 + fused)
    with torch.no_grad():  # inference: vectorized's forward
        inference = LF.cross_entropy(x, t, weight=w, reduction=reduction, **options)
        assert _relative_error(inference, ref) <= _tolerance(dtype, ref)


@pytest.mark.gpu
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "vectorized"])
def test_cross_entropy_misaligned_rows_and_all_ignored(monkeypatch, fused):
    monkeypatch.setattr(LF, "PREFER_FUSED", fused)
    x = misaligned_view(torch.randn(9 * 1000 + 1, device="cuda"), 8, 1000)
    t = torch.randint(0, 1000, (8,), device="cuda")
    ours_x, ref_x = x.detach().requires_grad_(True), x.detach().double().requires_grad_(True)
    w = torch.rand(1000, device="cuda")
    loss = LF.cross_entropy(ours_x, t, weight=w, label_smoothing=0.2)
    ref = F.cross_entropy(ref_x, t, weight=w.double(), label_smoothing=0.2)
    loss.backward()
    ref.backward()
    assert _relative_error(loss, ref) <= 1e-5 and _relative_error(ours_x.grad, ref_x.grad) <= 1e-5
    ignored = torch.full((8,), -100, device="cuda")
    all_ignored = LF.cross_entropy(x.detach().requires_grad_(True), ignored, label_smoothing=0.1)
    assert torch.isnan(all_ignored) and torch.isnan(F.cross_entropy(x, ignored, label_smoothing=0.1))


KL_SHAPES = {"37 x 1001": (37, 1001), "(5, 13, 7, 3)": (5, 13, 7, 3), "1-D": (1001,), "0-d": ()}


@pytest.mark.gpu
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "vectorized"])
@pytest.mark.parametrize("log_target", [False, True])
@pytest.mark.parametrize("reduction", list(kl_host.REDUCTIONS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", KL_SHAPES)
def test_kl_div_matches_pytorch_in_float64(monkeypatch, shape, dtype, reduction, log_target, fused):
    monkeypatch.setattr(LF, "PREFER_FUSED", fused)
    gen = torch.Generator(device="cuda").manual_seed(1)
    dims = KL_SHAPES[shape]
    x = torch.randn(dims, generator=gen, device="cuda").log_softmax(-1) if dims else torch.tensor(-0.3, device="cuda")
    t = torch.randn(dims, generator=gen, device="cuda").softmax(-1) if dims else torch.tensor(0.4, device="cuda")
    if dims:
        t.view(-1)[::7] = 0.0  # xlogy(0, 0) = 0
    if log_target:
        t = t.clamp_min(1e-30).log() if dims else t.log()
    x, t = x.to(dtype), t.to(dtype)
    ref_x = x.double().requires_grad_(True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = F.kl_div(ref_x, t.double(), reduction=reduction, log_target=log_target)
        ours_x = x.clone().requires_grad_(True)
        loss = LF.kl_div(ours_x, t, reduction=reduction, log_target=log_target)
    upstream = torch.randn_like(ref) if reduction == "none" else torch.tensor(0.75, device="cuda", dtype=ref.dtype)
    ref.backward(upstream)
    loss.backward(upstream.to(dtype))
    assert loss.shape == ref.shape and loss.dtype == dtype
    assert _relative_error(loss, ref) <= _tolerance(dtype, ref), f"loss {loss} vs {ref}"
    assert _relative_error(ours_x.grad, ref_x.grad) <= _tolerance(dtype, ref_x.grad, 1 + fused)


@pytest.mark.gpu
def test_modules_match_pytorchs():
    x, t, w, options = _ce_inputs("spatial indices, weight, smoothing", torch.float32)
    ours = lnn.CrossEntropyLoss(weight=w, reduction="sum", **options)(x, t)
    torch.testing.assert_close(ours, torch.nn.CrossEntropyLoss(weight=w, reduction="sum", **options)(x, t))
    p, q = torch.randn(6, 50, device="cuda").log_softmax(-1), torch.randn(6, 50, device="cuda").log_softmax(-1)
    torch.testing.assert_close(lnn.KLDivLoss(reduction="batchmean", log_target=True)(p, q),
                               torch.nn.KLDivLoss(reduction="batchmean", log_target=True)(p, q))


@pytest.mark.gpu
def test_opcheck_every_operator():
    x, t, w, _ = _ce_inputs("indices, weight, smoothing, ignore_index 7", torch.float32)
    probs = torch.randn(37, 1001, device="cuda").softmax(-1)
    for args in ((x, t, None, w.float(), 7, 0.1, 1), (x, None, probs, None, -100, 0.0, 0)):
        torch.library.opcheck(O.ce_forward, (x.clone().requires_grad_(True), *args[1:]))
        loss, *state = O.ce_forward(*args)
        grad_loss = torch.randn_like(loss) if args[-1] == 0 else torch.tensor(0.5, device="cuda")
        torch.library.opcheck(O.ce_backward, (*args[:4], *state, grad_loss, *args[4:]))
    torch.library.opcheck(O.ce_forward_grad, (x.clone().requires_grad_(True), t, None, w.float(), 7, 0.1, 2))
    p, q = torch.randn(37, 1001, device="cuda").log_softmax(-1), torch.rand(37, 1001, device="cuda")
    for code in kl_host.REDUCTIONS.values():
        torch.library.opcheck(O.kl_forward, (p.clone().requires_grad_(True), q, code, False))
        grad_loss = torch.randn_like(p) if code == 0 else torch.tensor(0.5, device="cuda")
        torch.library.opcheck(O.kl_backward, (q, grad_loss, code, True))
        if code:
            torch.library.opcheck(O.kl_forward_grad, (p.clone().requires_grad_(True), q, code, True))


@pytest.mark.gpu
def test_eager_calls_capture_in_a_cuda_graph_and_the_fused_backward_runs_once():
    """Not traced, the functions call the kernels without the dispatcher (EagerCrossEntropy):
    forward+backward still captures in a CUDA graph, and a second backward through the
    fused forward (which scales its gradient in place) raises."""
    x, t, w, options = _ce_inputs("indices, weight, smoothing, ignore_index 7", torch.float32)
    leaf = x.clone().requires_grad_(True)
    loss = LF.cross_entropy(leaf, t, weight=w, **options)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="once per forward"):
        loss.backward()
    leaf = x.clone().requires_grad_(True)  # first used on the side stream, as its gradient will be
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            leaf.grad = None
            LF.cross_entropy(leaf, t, weight=w, **options).backward()
    torch.cuda.current_stream().wait_stream(side)
    leaf.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_loss = LF.cross_entropy(leaf, t, weight=w, **options)
        static_loss.backward()
    ref_x = x.double().requires_grad_(True)
    ref = F.cross_entropy(ref_x, t, weight=w.double(), **options)
    ref.backward()
    for _ in range(2):
        graph.replay()
        torch.cuda.synchronize()
        assert _relative_error(static_loss, ref) <= _tolerance(torch.float32, ref)
        assert _relative_error(leaf.grad, ref_x.grad) <= _tolerance(torch.float32, ref_x.grad, 2)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_eager_calls_reach_the_kernels_without_the_dispatcher(monkeypatch, dtype, quiet_host_us, capsys):
    """Not traced, a drop-in call (forward and backward, with and without autograd) calls no
    torch.library operator: each would cost the dispatcher's round trips into Python. The
    host time of a call at 128 x 4096 is printed beside PyTorch's own."""
    logits = torch.randn(128, 4096, device="cuda", dtype=dtype)
    labels = torch.randint(0, 4096, (128,), device="cuda")
    log_p, q = logits.float().log_softmax(-1).to(dtype), logits.float().softmax(-1).to(dtype)
    leaf = logits.clone().requires_grad_(True)
    calls = {
        "cross_entropy": (lambda: LF.cross_entropy(logits, labels), lambda: F.cross_entropy(logits, labels)),
        "cross_entropy, grad": (lambda: LF.cross_entropy(leaf, labels), lambda: F.cross_entropy(leaf, labels)),
        "kl_div": (lambda: LF.kl_div(log_p, q, reduction="batchmean"),
                   lambda: F.kl_div(log_p, q, reduction="batchmean")),
    }
    for name in ("ce_forward", "ce_forward_grad", "ce_backward", "kl_forward", "kl_forward_grad", "kl_backward"):
        monkeypatch.setattr(O, name, lambda *args, name=name: pytest.fail(f"eager mode called the operator {name}"))
    for fused in (True, False):
        monkeypatch.setattr(LF, "PREFER_FUSED", fused)
        LF.cross_entropy(leaf, labels, label_smoothing=0.1).backward()
        LF.kl_div(log_p.clone().requires_grad_(True), q, reduction="sum").backward()
    measured = {name: (quiet_host_us(ours), quiet_host_us(theirs)) for name, (ours, theirs) in calls.items()}
    with capsys.disabled():
        for name, (ours, theirs) in measured.items():
            print(f"\nhost time per call LF.{name} {str(dtype)[6:]}: {ours:.1f} us, PyTorch's {theirs:.1f} us")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_drop_in_forwards_launch_one_kernel_per_stage(dtype, gpu_activity):
    """Host time is the cost of a small loss, and each launch costs some: without weights an
    inference forward is one kernel (each block counts the rows the mean divides by, the last
    block writes the loss), no memset and no conversion; weights add a prepare stage (the
    smoothed loss needs their sum before the rows), and so does the fused forward (its
    gradient needs the mean's denominator before the rows). The kernels read float32 weights:
    16-bit ones (PyTorch's weight has the input's dtype) are converted first, one kernel more."""
    x, t, w, options = _ce_inputs("indices, weight, smoothing, ignore_index 7", dtype)
    probs = x.float().softmax(-1).to(dtype)
    log_p = x.float().log_softmax(-1).to(dtype)
    leaf = x.clone().requires_grad_(True)
    calls = {
        "cross_entropy": (lambda: LF.cross_entropy(x, t, **options), 1),
        "cross_entropy, probabilities": (lambda: LF.cross_entropy(x, probs, label_smoothing=0.1), 1),
        "cross_entropy, weight": (lambda: LF.cross_entropy(x, t, weight=w, **options),
                                  2 if dtype == torch.float32 else 3),
        "cross_entropy, fused forward": (lambda: LF.cross_entropy(leaf, t, **options), 2),
        "kl_div": (lambda: LF.kl_div(log_p, probs, reduction="batchmean"), 1),
    }
    for name, (call, expected) in calls.items():
        kernels, memsets = gpu_activity(call)
        assert (len(kernels), memsets) == (expected, 0), (name, kernels, memsets)


@pytest.mark.gpu
def test_the_host_returns_before_the_kernels_end():
    x, t, w, options = _ce_inputs("indices, weight, smoothing, ignore_index 7", torch.float32)
    x.requires_grad_(True)
    LF.cross_entropy(x, t, weight=w, **options).backward()  # built and warm
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)
    done = torch.cuda.Event()
    loss = LF.cross_entropy(x, t, weight=w, **options)
    loss.backward()
    LF.kl_div(x.detach().log_softmax(-1), x.detach().softmax(-1), reduction="batchmean")
    done.record()
    assert not done.query(), "the host waited for the GPU"
    torch.cuda.synchronize()


@pytest.mark.gpu
def test_compiled_training_step_in_a_cuda_graph_matches_pytorch():
    """The issue's "done when": cross_entropy(logits, labels, label_smoothing=0.1) in a
    torch.compile(fullgraph=True) step, forward and backward captured in one CUDA graph."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 1001).cuda()
    reference = torch.nn.Linear(64, 1001).cuda().double()
    reference.load_state_dict(model.state_dict())

    def loss_of(x, y):
        return LF.cross_entropy(model(x), y, label_smoothing=0.1)

    compiled = torch.compile(loss_of, fullgraph=True)
    x, y = torch.randn(37, 64, device="cuda"), torch.randint(0, 1001, (37,), device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            model.zero_grad(set_to_none=True)
            compiled(x, y).backward()
    torch.cuda.current_stream().wait_stream(side)
    model.zero_grad(set_to_none=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_loss = compiled(x, y)
        static_loss.backward()
    for seed in range(3):
        gen = torch.Generator(device="cuda").manual_seed(seed)
        x.copy_(torch.randn(37, 64, device="cuda", generator=gen))
        y.copy_(torch.randint(0, 1001, (37,), device="cuda", generator=gen))
        graph.replay()
        reference.zero_grad()
        ref = F.cross_entropy(reference(x.double()), y, label_smoothing=0.1)
        ref.backward()
        assert _relative_error(static_loss, ref) <= 1e-5
        assert _relative_error(model.weight.grad, reference.weight.grad) <= 1e-5
        assert _relative_error(model.bias.grad, reference.bias.grad) <= 1e-5
