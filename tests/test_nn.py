"""losslab.nn: drop-in kl_div / cross_entropy with PyTorch's options.

cpu tier: argument errors of the same kind as PyTorch's (checked against it on CPU tensors),
the modules' constructor signatures, which cross_entropy calls take the canonical path (the
cluster rung) and which the options kernels, the operators' schemas and fake shapes (meta
tensors, autograd through them), the options' cost model.
compile tier: the option kernels compile without spills for sm_80 and sm_90 and are bound.
gpu tier: every option against PyTorch in float64 (forward and backward, both rungs, odd
shapes), bf16/fp16 within their tolerances, opcheck, no host wait, and a
torch.compile(fullgraph=True) training step captured in a CUDA graph; the canonical case on
the cluster rung's kernels (against float64 and bitwise against losslab.variant's cluster, long
rows, non-contiguous, NaN cases, compiled, captured, the kernels it runs) and as fast as the
rung at 8192 x 32768 bfloat16; kl_div's ``log_input=False`` (probabilities) on the fused rung for
the ladder's problem (bitwise, its kernels, compiled) and as fast as it at 2048 x 131072 bfloat16,
on the options kernels after ``torch.log`` otherwise.
"""
import inspect
import statistics
import warnings

import pytest
import torch
import torch.nn.functional as F

import losslab
import losslab.nn as lnn
import losslab.nn.functional as LF
from losslab import build
from losslab.measure.check import TOLERANCES
from losslab.measure.timing import flush_buffer, time_cuda
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

    assert params(ours)[:len(params(theirs))] == params(theirs)
    assert params(ours)[len(params(theirs)):] == LOSSLAB_PARAMETERS.get(ours.__name__, [])
    module = ours()
    assert module.reduction == theirs().reduction


# losslab's parameters after PyTorch's, with defaults that keep PyTorch's behaviour
LOSSLAB_PARAMETERS = {"KLDivLoss": [("log_input", True)], "kl_div": [("log_input", True)]}


def test_functions_have_pytorchs_parameters():
    for ours, theirs in ((LF.cross_entropy, F.cross_entropy), (LF.kl_div, F.kl_div)):
        names = [(p.name, p.default) for p in inspect.signature(ours).parameters.values()]
        pytorchs = [(p.name, p.default) for p in inspect.signature(theirs).parameters.values()]
        assert names == pytorchs + LOSSLAB_PARAMETERS.get(ours.__name__, [])


# --- cpu tier: which calls take the canonical path -----------------------------------------------------

def _canonical_args(**change):
    """canonical_case's arguments for the defaults (X, T, as checked by cross_entropy), with ``change``."""
    args = dict(input=X, target=T, weight=None, ignore_index=-100, label_smoothing=0.0, reduction="mean")
    return {**args, **change}


CANONICAL_CASES = {
    # name: (canonical_case's arguments, canonical?)
    "defaults": (_canonical_args(), True),
    "bfloat16 logits": (_canonical_args(input=X.bfloat16()), True),
    "float16 logits": (_canonical_args(input=X.half()), True),
    "non-contiguous logits and targets": (_canonical_args(input=X.t().contiguous().t(), target=T[::1]), True),
    "weight": (_canonical_args(weight=torch.ones(5)), False),
    "ignore_index 3": (_canonical_args(ignore_index=3), False),
    "ignore_index -1": (_canonical_args(ignore_index=-1), False),
    "label_smoothing 0.1": (_canonical_args(label_smoothing=0.1), False),
    "reduction sum": (_canonical_args(reduction="sum"), False),
    "reduction none": (_canonical_args(reduction="none"), False),
    "uint8 class indices": (_canonical_args(target=T.to(torch.uint8)), False),
    "class probabilities": (_canonical_args(target=torch.rand(4, 5)), False),
    "unbatched (C,) logits": (_canonical_args(input=X[0], target=T[0]), False),
    "spatial (N, C, d) logits": (_canonical_args(input=torch.randn(4, 5, 3), target=torch.randint(0, 5, (4, 3))),
                                 False),
}


@pytest.mark.parametrize("case", CANONICAL_CASES)
def test_canonical_case_is_the_ladders_problem_and_nothing_else(case):
    args, expected = CANONICAL_CASES[case]
    assert LF.canonical_case(**args) is expected


W5 = torch.ones(5)
DISPATCH = {
    # name: (a call of the public function or module on CPU tensors, canonical?)
    "defaults": (lambda: LF.cross_entropy(X, T), True),
    "bfloat16": (lambda: LF.cross_entropy(X.bfloat16(), T), True),
    "reduction='mean', ignore_index=-100, label_smoothing=0.0 given": (
        lambda: LF.cross_entropy(X, T, reduction="mean", ignore_index=-100, label_smoothing=0.0), True),
    "size_average=True (legacy: mean)": (lambda: LF.cross_entropy(X, T, size_average=True), True),
    "reduce=True (legacy: mean)": (lambda: LF.cross_entropy(X, T, reduce=True), True),
    "size_average=True, reduce=True (legacy: mean)": (
        lambda: LF.cross_entropy(X, T, size_average=True, reduce=True), True),
    "size_average=False (legacy: sum)": (lambda: LF.cross_entropy(X, T, size_average=False), False),
    "reduce=False (legacy: none)": (lambda: LF.cross_entropy(X, T, reduce=False), False),
    "label_smoothing -0.1 (none, as in PyTorch)": (lambda: LF.cross_entropy(X, T, label_smoothing=-0.1), True),
    "non-contiguous logits": (lambda: LF.cross_entropy(torch.randn(5, 4).t(), T), True),
    "module, defaults": (lambda: lnn.CrossEntropyLoss()(X, T), True),
    "reduction sum": (lambda: LF.cross_entropy(X, T, reduction="sum"), False),
    "reduction none": (lambda: LF.cross_entropy(X, T, reduction="none"), False),
    "weight": (lambda: LF.cross_entropy(X, T, weight=W5), False),
    "ignore_index 3": (lambda: LF.cross_entropy(X, T, ignore_index=3), False),
    "label_smoothing 0.1": (lambda: LF.cross_entropy(X, T, label_smoothing=0.1), False),
    "uint8 class indices": (lambda: LF.cross_entropy(X, T.to(torch.uint8)), False),
    "class probabilities": (lambda: LF.cross_entropy(X, X.softmax(-1)), False),
    "unbatched": (lambda: LF.cross_entropy(X[0], T[0]), False),
    "spatial": (lambda: LF.cross_entropy(torch.randn(4, 5, 3), torch.randint(0, 5, (4, 3))), False),
    "module, weight": (lambda: lnn.CrossEntropyLoss(weight=W5)(X, T), False),
    "module, label_smoothing": (lambda: lnn.CrossEntropyLoss(label_smoothing=0.1)(X, T), False),
    "module, ignore_index": (lambda: lnn.CrossEntropyLoss(ignore_index=0)(X, T), False),
}


@pytest.fixture
def dispatched(monkeypatch):
    """cross_entropy on CPU tensors with the device check and both backends stubbed out: a
    list of (path, args) each call appends to."""
    calls = []

    def canonical(*args):
        calls.append(("canonical", args))
        return torch.zeros(())

    def options(*args):
        calls.append(("options", args))
        return torch.zeros(args[2].shape[0]) if args[-1] == ce_host.REDUCTIONS["none"] else torch.zeros(())

    monkeypatch.setattr(LF, "_require_cuda", lambda *named: None)
    monkeypatch.setattr(O, "cross_entropy_canonical", canonical)
    monkeypatch.setattr(O, "cross_entropy", options)
    return calls


@pytest.mark.parametrize("case", DISPATCH)
def test_cross_entropy_takes_the_canonical_path_only_in_the_canonical_case(dispatched, case):
    call, canonical = DISPATCH[case]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy arguments' deprecation warning
        call()
    assert [path for path, _ in dispatched] == ["canonical" if canonical else "options"]


def test_the_canonical_path_gets_the_callers_tensors_and_which_forward(dispatched, monkeypatch):
    """No copy or conversion before the rung's host code (which makes them contiguous itself),
    and the forward that writes the gradient exactly when one will be needed and PREFER_FUSED."""
    leaf = X.clone().requires_grad_(True)
    LF.cross_entropy(X, T)
    LF.cross_entropy(leaf, T)
    with torch.no_grad():
        LF.cross_entropy(leaf, T)
    monkeypatch.setattr(LF, "PREFER_FUSED", False)
    LF.cross_entropy(leaf, T)
    assert [path for path, _ in dispatched] == ["canonical"] * 4
    assert [args[:2] for _, args in dispatched] == [(False, False), (True, True), (False, False), (False, True)]
    assert dispatched[0][1][2] is X and dispatched[1][1][2] is leaf and all(args[3] is T for _, args in dispatched)


P = X.softmax(-1)
KL_DISPATCH = {
    # name: (a call of kl_div or KLDivLoss on CPU tensors, the path it takes)
    "probabilities, batchmean": (lambda: LF.kl_div(P, P, reduction="batchmean", log_input=False), "canonical"),
    "bfloat16 probabilities": (lambda: LF.kl_div(P.bfloat16(), P, reduction="batchmean", log_input=False),
                               "canonical"),
    "module, probabilities": (lambda: lnn.KLDivLoss(reduction="batchmean", log_input=False)(P, P), "canonical"),
    "probabilities, a broadcast target": (lambda: LF.kl_div(P, P[:1], reduction="batchmean", log_input=False),
                                          "canonical"),
    "log-probabilities (PyTorch's default)": (lambda: LF.kl_div(P.log(), P, reduction="batchmean"), "options"),
    "probabilities, sum": (lambda: LF.kl_div(P, P, reduction="sum", log_input=False), "options"),
    "probabilities, none": (lambda: LF.kl_div(P, P, reduction="none", log_input=False), "options"),
    "probabilities, log_target": (lambda: LF.kl_div(P, P.log(), reduction="batchmean", log_target=True,
                                                    log_input=False), "options"),
    "probabilities, 3-D": (lambda: LF.kl_div(P[None], P[None], reduction="batchmean", log_input=False), "options"),
}


@pytest.mark.parametrize("case", KL_DISPATCH)
def test_kl_div_takes_the_fused_rung_only_for_the_ladders_problem(monkeypatch, case):
    """The fused rung for the ladder's problem, the options kernels otherwise, each given the
    caller's input as it is (the options told whether it holds probabilities)."""
    calls = []
    monkeypatch.setattr(LF, "_require_cuda", lambda *named: None)
    monkeypatch.setattr(O, "kl_div_canonical", lambda *args: calls.append(("canonical", args)) or torch.zeros(()))
    monkeypatch.setattr(O, "kl_div", lambda *args: calls.append(("options", args)) or torch.zeros(()))
    call, path = KL_DISPATCH[case]
    call()
    assert [p for p, _ in calls] == [path]
    args = calls[0][1]
    probabilities = "log-probabilities" not in case
    assert torch.equal(args[2], (P if probabilities else P.log()).to(args[2].dtype).expand_as(args[2]))
    if path == "options":
        assert args[-1] is (not probabilities)  # log_input


def test_the_canonical_kl_div_runs_the_fused_rung():
    assert O.KL_CANONICAL is losslab.ops.OPS[("kl_div", "fused")]
    assert O.KL_CANONICAL.writes_grad and O.KL_CANONICAL.rung.inference == "vectorized"
    assert O.KL_CANONICAL.forward_grad.name() == "losslab::kl_div_fused_forward_grad"


def test_the_canonical_path_runs_the_cluster_rung():
    assert O.CANONICAL is losslab.ops.OPS[("cross_entropy", "cluster")]
    assert O.CANONICAL.writes_grad and O.CANONICAL.rung.inference == "vectorized"
    assert O.CANONICAL.forward_grad.name() == "losslab::cross_entropy_cluster_forward_grad"


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
    for log_input in (True, False):
        loss = O.kl_forward(x, x.detach(), code, False, log_input)
        assert loss.shape == (x.shape if reduction == "none" else ())
        assert torch.autograd.grad(loss.sum(), x)[0].shape == x.shape
        if reduction != "none":
            loss, grad = O.kl_forward_grad(x, x.detach(), code, True, log_input)
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
    assert kl_host.options_cost(n, "backward", log_input=False).bytes_read == 2 * n * 4 + 4  # -t * scale / p
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
@pytest.mark.parametrize("log_input", [True, False], ids=["log-probabilities", "probabilities"])
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "vectorized"])
@pytest.mark.parametrize("log_target", [False, True])
@pytest.mark.parametrize("reduction", list(kl_host.REDUCTIONS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", KL_SHAPES)
def test_kl_div_matches_pytorch_in_float64(monkeypatch, shape, dtype, reduction, log_target, fused, log_input):
    """Every option against F.kl_div in float64; ``log_input=False`` against
    ``F.kl_div(torch.log(p), t)`` on the same probabilities (the fused rung for batchmean (N, D)
    rows without log_target, the options kernels on their log otherwise)."""
    monkeypatch.setattr(LF, "PREFER_FUSED", fused)
    gen = torch.Generator(device="cuda").manual_seed(1)
    dims = KL_SHAPES[shape]
    x = torch.randn(dims, generator=gen, device="cuda").log_softmax(-1) if dims else torch.tensor(-0.3, device="cuda")
    t = torch.randn(dims, generator=gen, device="cuda").softmax(-1) if dims else torch.tensor(0.4, device="cuda")
    if dims:
        t.view(-1)[::7] = 0.0  # xlogy(0, 0) = 0
    if log_target:
        t = t.clamp_min(1e-30).log() if dims else t.log()
    x, t = (x if log_input else x.exp()).to(dtype), t.to(dtype)
    ref_x = x.double().requires_grad_(True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = F.kl_div(ref_x if log_input else torch.log(ref_x), t.double(), reduction=reduction,
                       log_target=log_target)
        ours_x = x.clone().requires_grad_(True)
        loss = LF.kl_div(ours_x, t, reduction=reduction, log_target=log_target, log_input=log_input)
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
        for x, log_input in ((p, True), (p.exp(), False)):
            torch.library.opcheck(O.kl_forward, (x.clone().requires_grad_(True), q, code, False, log_input))
            grad_loss = torch.randn_like(p) if code == 0 else torch.tensor(0.5, device="cuda")
            torch.library.opcheck(O.kl_backward, (None if log_input else x, q, grad_loss, code, True, log_input))
            if code:
                torch.library.opcheck(O.kl_forward_grad, (x.clone().requires_grad_(True), q, code, True, log_input))


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
    for name in ("forward", "forward_grad", "backward"):  # the canonical case's: the cluster rung's
        monkeypatch.setattr(O.CANONICAL, name, lambda *args, name=name: pytest.fail(f"eager mode called {name}"))
    for fused in (True, False):
        monkeypatch.setattr(LF, "PREFER_FUSED", fused)
        LF.cross_entropy(leaf, labels, label_smoothing=0.1).backward()
        LF.cross_entropy(leaf, labels).backward()
        LF.kl_div(log_p.clone().requires_grad_(True), q, reduction="sum").backward()
    measured = {name: quiet_host_us(ours, theirs) for name, (ours, theirs) in calls.items()}  # in turns
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


# --- gpu tier: the canonical case on the cluster rung -------------------------------------------------

CANONICAL_SHAPES = {"small": (128, 4096), "odd": (257, 4099), "long rows": (4, 262144)}
CLUSTER = "cross_entropy_cluster_forward_kernel"
DTYPE_ID = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}.get


def _canonical_inputs(shape, dtype, seed=0):
    """Logits randn * 3 in ``dtype``, int64 targets with every fifth ignored (-100)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = (torch.randn(shape, generator=gen, device="cuda") * 3).to(dtype)
    t = torch.randint(0, shape[1], (shape[0],), generator=gen, device="cuda")
    t[::5] = -100
    return x, t


def _has_clusters() -> bool:
    return torch.cuda.get_device_capability()[0] >= 9


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=DTYPE_ID)
@pytest.mark.parametrize("shape", CANONICAL_SHAPES)
def test_canonical_cross_entropy_matches_pytorch_in_float64_and_the_cluster_rung(shape, dtype):
    """Value, 0-d shape, dtype (the input's, as PyTorch's and the options path's) and gradient
    against PyTorch in float64; bitwise the cluster rung's loss and gradient (the same kernels);
    inference (vectorized's forward) and the module too. Long rows split over a cluster on sm_90."""
    dims = CANONICAL_SHAPES[shape]
    x, t = _canonical_inputs(dims, dtype)
    if shape == "long rows" and _has_clusters():
        assert ce_host.cluster_plan(x)[0] > 1, "4 x 262144 should run the cluster kernel on sm_90"
    ref_x = x.double().requires_grad_(True)
    ref = F.cross_entropy(ref_x, t)
    ref.backward(torch.tensor(0.75, device="cuda", dtype=torch.float64))
    ours_x = x.clone().requires_grad_(True)
    loss = LF.cross_entropy(ours_x, t)
    assert loss.shape == () and loss.dtype == dtype == F.cross_entropy(x, t).dtype
    loss.backward(torch.tensor(0.75, device="cuda", dtype=dtype))
    assert _relative_error(loss, ref) <= _tolerance(dtype, ref), f"loss {loss} vs {ref}"
    assert _relative_error(ours_x.grad, ref_x.grad) <= _tolerance(dtype, ref_x.grad, 2)
    rung_x = x.clone().requires_grad_(True)
    rung_loss = losslab.variant("cross_entropy", "cluster")(rung_x, t)
    rung_loss.backward(torch.tensor(0.75, device="cuda", dtype=dtype))
    assert torch.equal(loss, rung_loss) and torch.equal(ours_x.grad, rung_x.grad)
    with torch.no_grad():
        inference = LF.cross_entropy(ours_x, t)
    module = lnn.CrossEntropyLoss()(x, t)
    assert inference.dtype == module.dtype == dtype and inference.shape == module.shape == ()
    assert _relative_error(inference, ref) <= _tolerance(dtype, ref)
    assert torch.equal(inference, module)


@pytest.mark.gpu
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "vectorized"])
def test_canonical_cross_entropy_non_contiguous_misaligned_and_nan_cases(monkeypatch, fused):
    """Strided and misaligned logits (the fused fallback), strided targets; NaN where every row
    is ignored (zero gradient, as PyTorch's) and where a target is out of range (documented:
    PyTorch stops with a device-side assert instead), in training and in inference."""
    monkeypatch.setattr(LF, "PREFER_FUSED", fused)
    wide, t = _canonical_inputs((9, 2002), torch.float32)
    t = t % 1001
    cases = {"every other column and target": (wide[:, ::2], t.repeat_interleave(2)[::2]),
             "storage offset breaks 16-byte alignment": (misaligned_view(wide, 8, 1000), t[:8] % 1000)}
    strided, misaligned = cases.values()
    assert not strided[0].is_contiguous() and not strided[1].is_contiguous() and misaligned[0].storage_offset() == 1
    for name, (x, target) in cases.items():
        ours_x, ref_x = x.detach().requires_grad_(True), x.detach().double().requires_grad_(True)
        loss, ref = LF.cross_entropy(ours_x, target), F.cross_entropy(ref_x, target)
        loss.backward()
        ref.backward()
        assert _relative_error(loss, ref) <= 1e-5 and _relative_error(ours_x.grad, ref_x.grad) <= 1e-5, name
    x, _ = _canonical_inputs((8, 1000), torch.bfloat16)
    ignored = torch.full((8,), -100, device="cuda")
    leaf = x.clone().requires_grad_(True)
    loss = LF.cross_entropy(leaf, ignored)
    loss.backward()
    assert torch.isnan(loss) and torch.isnan(F.cross_entropy(x, ignored))
    assert torch.equal(leaf.grad, torch.zeros_like(x))
    for bad in (1000, -5):
        out_of_range = torch.randint(0, 1000, (8,), device="cuda")
        out_of_range[3] = bad
        assert torch.isnan(LF.cross_entropy(x.clone().requires_grad_(True), out_of_range))
        assert torch.isnan(LF.cross_entropy(x, out_of_range))


@pytest.mark.gpu
def test_canonical_backward_runs_once_per_forward_as_the_options_path():
    x, t = _canonical_inputs((37, 1001), torch.float32)
    for call in (lambda leaf: LF.cross_entropy(leaf, t), lambda leaf: LF.cross_entropy(leaf, t, reduction="sum")):
        loss = call(x.clone().requires_grad_(True))
        loss.backward(retain_graph=True)
        with pytest.raises(RuntimeError, match="losslab cross_entropy: backward can run once per forward"):
            loss.backward()


@pytest.mark.gpu
def test_canonical_vectorized_allows_retain_graph(monkeypatch):
    monkeypatch.setattr(LF, "PREFER_FUSED", False)
    x, t = _canonical_inputs((37, 1001), torch.float32)
    leaf, ref_x = x.clone().requires_grad_(True), x.double().requires_grad_(True)
    loss = LF.cross_entropy(leaf, t)
    loss.backward(retain_graph=True)
    loss.backward()
    F.cross_entropy(ref_x, t).mul(2).backward()
    assert _relative_error(leaf.grad, ref_x.grad) <= 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=DTYPE_ID)
@pytest.mark.parametrize("shape", ["odd", "long rows"])
def test_canonical_call_runs_the_cluster_rungs_kernels(shape, dtype, gpu_activity):
    """Training: the cluster kernel where cluster_plan splits a row (sm_90, long rows), fused's
    elsewhere; inference: vectorized's forward; never an options kernel."""
    x, t = _canonical_inputs(CANONICAL_SHAPES[shape], dtype)
    leaf = x.clone().requires_grad_(True)
    expected = CLUSTER if ce_host.cluster_plan(x)[0] else "cross_entropy_fused_forward_kernel"
    if shape == "long rows" and _has_clusters():
        assert expected == CLUSTER
    training, _ = gpu_activity(lambda: LF.cross_entropy(leaf, t))
    inference, _ = gpu_activity(lambda: LF.cross_entropy(x, t))
    assert any(expected in k for k in training), training
    assert any("cross_entropy_vectorized_forward_kernel" in k for k in inference), inference
    assert not any("options" in k for k in training + inference), (training, inference)


@pytest.mark.gpu
def test_canonical_call_compiles_to_the_cluster_operators_without_a_graph_break():
    """torch.compile(fullgraph=True) (a graph break raises) traces the canonical call to the
    cluster rung's operators, never the options operators; the result matches float64."""
    torch._dynamo.reset()
    graphs = []

    def recording(gm, example_inputs):
        graphs.append(gm.code)
        return gm.forward

    compiled = torch.compile(lambda x, y: LF.cross_entropy(x, y) * 2.0, fullgraph=True, backend=recording)
    x, t = _canonical_inputs((4, 262144), torch.bfloat16)
    leaf, ref_x = x.clone().requires_grad_(True), x.double().requires_grad_(True)
    loss = compiled(leaf, t)
    loss.backward()
    with torch.no_grad():
        inference = compiled(x, t)
    (F.cross_entropy(ref_x, t) * 2.0).backward()
    assert len(graphs) == 2  # training and inference: one graph each
    assert "cross_entropy_cluster_forward_grad" in graphs[0]
    assert "cross_entropy_cluster_forward(" in graphs[1] or "cross_entropy_cluster_forward.default" in graphs[1]
    assert not any("nn_cross_entropy" in code or "cluster_forward_grad" in code for code in graphs[1:])
    assert not any("nn_cross_entropy" in code for code in graphs)
    ref = F.cross_entropy(x.double(), t) * 2.0
    assert _relative_error(loss, ref) <= _tolerance(torch.bfloat16, ref)
    assert _relative_error(inference, ref) <= _tolerance(torch.bfloat16, ref)
    assert _relative_error(leaf.grad, ref_x.grad) <= _tolerance(torch.bfloat16, ref_x.grad, 2)


def _capture_step(step, warm_leaf):
    """Run ``step()`` twice on a side stream (builds, allocator), then capture it in a CUDA graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            warm_leaf.grad = None
            step()
    torch.cuda.current_stream().wait_stream(side)
    warm_leaf.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    return graph, out


@pytest.mark.gpu
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("shape", ["odd", "long rows"])
def test_canonical_training_step_captures_in_a_cuda_graph(shape, compiled):
    """Forward and backward of the canonical call (eager: the rung's kernels without the
    dispatcher; compiled: its operators under inductor) captured once, replayed on new values."""
    torch._dynamo.reset()
    dims = CANONICAL_SHAPES[shape]
    x, t = _canonical_inputs(dims, torch.float32)
    leaf = x.clone().requires_grad_(True)
    loss_of = torch.compile(LF.cross_entropy, fullgraph=True) if compiled else LF.cross_entropy

    def step():
        loss = loss_of(leaf, t)
        loss.backward()
        return loss

    graph, static_loss = _capture_step(step, leaf)
    for seed in (1, 2):
        fresh_x, fresh_t = _canonical_inputs(dims, torch.float32, seed=seed)
        with torch.no_grad():
            leaf.copy_(fresh_x)
        t.copy_(fresh_t)
        graph.replay()
        torch.cuda.synchronize()
        ref_x = fresh_x.double().requires_grad_(True)
        ref = F.cross_entropy(ref_x, fresh_t)
        ref.backward()
        assert _relative_error(static_loss, ref) <= 1e-5
        assert _relative_error(leaf.grad, ref_x.grad) <= 1e-5


def _kl_canonical_inputs(dims, dtype, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    p, t = (torch.randn(dims, generator=gen, device="cuda").softmax(-1).to(dtype) for _ in range(2))
    return p, t


# name: (the public call, the rung it runs, its inputs); the sizes of the sweep where the gap was largest
AS_FAST_CASES = {
    "cross_entropy": (lambda x, t: LF.cross_entropy(x, t), ("cross_entropy", "cluster"),
                      lambda: _canonical_inputs((8192, 32768), torch.bfloat16)),
    "kl_div": (lambda p, t: LF.kl_div(p, t, reduction="batchmean", log_input=False), ("kl_div", "fused"),
               lambda: _kl_canonical_inputs((2048, 131072), torch.bfloat16)),
}


@pytest.mark.gpu
@pytest.mark.parametrize("case", AS_FAST_CASES)
def test_canonical_call_is_as_fast_as_its_rung(case, capsys):
    """The public function's forward (inference) and forward+backward medians (CUDA events, L2
    flushed) are within max(3 %, 1 us) of losslab.variant's rung it runs, timed interleaved in
    this process (rounds alternate which goes first)."""
    public, (problem, rung_name), make_inputs = AS_FAST_CASES[case]
    x, t = make_inputs()
    leaf = x.clone().requires_grad_(True)
    one = torch.ones((), device="cuda", dtype=x.dtype)
    rung = losslab.variant(problem, rung_name)
    calls = {
        "forward": {"public": lambda: public(x, t), rung_name: lambda: rung(x, t)},
        "forward+backward": {
            "public": lambda: torch.autograd.grad(public(leaf, t), leaf, one),
            rung_name: lambda: torch.autograd.grad(rung(leaf, t), leaf, one)},
    }
    flush = flush_buffer()
    medians = {(direction, name): [] for direction, pair in calls.items() for name in pair}
    for round_ in range(6):
        for direction, pair in calls.items():
            for name, fn in (pair.items() if round_ % 2 == 0 else reversed(pair.items())):
                timing = time_cuda(fn, repeats=20, warmup_ms=20.0, flush=flush, back_to_back=False)
                medians[(direction, name)].append(timing.median_ms)
    failures = []
    size = " x ".join(map(str, x.shape))
    for direction in calls:
        ours = statistics.median(medians[(direction, "public")])
        theirs = statistics.median(medians[(direction, rung_name)])
        with capsys.disabled():
            print(f"\n{size} {str(x.dtype).removeprefix('torch.')} {direction}: LF.{problem} {ours * 1e3:.1f} us, "
                  f"variant({problem!r}, {rung_name!r}) {theirs * 1e3:.1f} us ({ours / theirs - 1:+.1%})")
        if abs(ours - theirs) > max(0.03 * theirs, 1e-3):
            failures.append(f"{direction}: {ours:.4f} ms against {theirs:.4f} ms")
    assert not failures, failures


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=DTYPE_ID)
def test_canonical_kl_div_is_the_fused_rung(dtype, gpu_activity):
    """``log_input=False``, batchmean, (N, D): bitwise the fused rung's loss and gradient (the
    same kernels: fused's in training, vectorized's forward in inference, never an options
    kernel), the module too; with PREFER_FUSED off, vectorized's backward; compiled
    (fullgraph) to the fused rung's operators."""
    p, t = _kl_canonical_inputs((37, 1001), dtype)
    leaf, rung_leaf = p.clone().requires_grad_(True), p.clone().requires_grad_(True)
    loss = LF.kl_div(leaf, t, reduction="batchmean", log_input=False)
    rung_loss = losslab.variant("kl_div", "fused")(rung_leaf, t)
    loss.backward()
    rung_loss.backward()
    assert loss.dtype == dtype and torch.equal(loss, rung_loss) and torch.equal(leaf.grad, rung_leaf.grad)
    assert torch.equal(lnn.KLDivLoss(reduction="batchmean", log_input=False)(p, t),
                       losslab.variant("kl_div", "vectorized")(p, t))
    training, _ = gpu_activity(lambda: LF.kl_div(leaf, t, reduction="batchmean", log_input=False))
    inference, _ = gpu_activity(lambda: LF.kl_div(p, t, reduction="batchmean", log_input=False))
    assert any("kl_div_fused" in k for k in training), training
    assert any("kl_div_vectorized" in k for k in inference), inference
    assert not any("options" in k for k in training + inference), (training, inference)
    torch._dynamo.reset()
    compiled = torch.compile(lambda a, b: LF.kl_div(a, b, reduction="batchmean", log_input=False), fullgraph=True)
    compiled_leaf = p.clone().requires_grad_(True)
    compiled(compiled_leaf, t).backward()
    ref_p = p.double().requires_grad_(True)
    F.kl_div(torch.log(ref_p), t.double(), reduction="batchmean").backward()
    assert _relative_error(compiled_leaf.grad, ref_p.grad) <= _tolerance(dtype, ref_p.grad, 2)
