"""Every rung as a PyTorch operator, and the variant registry built on them.

    >>> kl = losslab.variant("kl_div", "vectorized")
    >>> loss = kl(predictions, targets)   # 0-d tensor, like F.kl_div(..., "batchmean")
    >>> loss.backward()                   # predictions.grad from the backward kernel

Each rung of each problem is a set of ``torch.library`` operators in the ``losslab``
namespace, with fake (meta) implementations for tracing and autograd registered with
``torch.library.register_autograd``, so that ``torch.compile(fullgraph=True)`` traces
through a loss and CUDA graphs capture it (no operator waits for the host):

``losslab::<problem>_<rung>_forward(Tensor predictions, Tensor targets) -> (loss, *state)``
    the loss (0-d, the predictions' dtype) and what the backward needs besides the inputs
    (the problem's ``empty_state``: nothing for kl_div; row_max, row_log_sum and counts
    for cross_entropy). A rung that writes its gradient in the forward runs its
    inference rung's kernels here.
``losslab::<problem>_<rung>_backward(Tensor predictions, Tensor targets, *state, Tensor grad_loss) -> Tensor``
    dloss/dpredictions, a fresh tensor.
``losslab::<problem>_<rung>_forward_grad(Tensor predictions, Tensor targets) -> (Tensor, Tensor)``
    only for a rung that writes its gradient in the forward: the loss and that gradient
    (for grad_loss = 1), in a fresh tensor the operator owns.
``losslab::<problem>_<rung>_scale_(Tensor(a!) grad, Tensor grad_loss) -> ()``
    that gradient scaled in place by grad_loss (no work when it is 1): the backward of
    ``_forward_grad``. It mutates only that operator's output, never a caller's tensor.

The functions :func:`variant` returns validate their inputs on the host (raising
TypeError/ValueError that names the argument) and call these operators.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Callable

import torch

from losslab import build, problems

NAMESPACE = "losslab"
STRICT_ENV = "LOSSLAB_STRICT_TARGETS"
_LIBRARY = torch.library.Library(NAMESPACE, "DEF")


def strict_default() -> bool:
    """Strict mode from the environment: ``LOSSLAB_STRICT_TARGETS=1`` turns it on."""
    return os.environ.get(STRICT_ENV, "").strip() not in ("", "0", "false", "False")


# --- the operators ------------------------------------------------------------------------------

def _host(spec: problems.Problem):
    """The module holding ``spec``'s host code: ``forward``, ``backward``, ``empty_state``."""
    return sys.modules[type(spec).__module__]


def _define(name: str, schema: str, kernel: Callable, fake: Callable) -> torch._ops.OpOverload:
    _LIBRARY.define(f"{name}{schema}")
    _LIBRARY.impl(name, kernel, "CUDA")
    torch.library.register_fake(f"{NAMESPACE}::{name}", fake, lib=_LIBRARY)
    return getattr(getattr(torch.ops, NAMESPACE), name).default


def _extension(problem: str) -> Callable[[], object]:
    """The problem's built extension, looked up once (the build happens at the first call)."""
    cache: list = []

    def get():
        if not cache:
            cache.append(build.load_extension(problem))
        return cache[0]

    return get


class RungOps:
    """The operators of one rung of one problem (see the module docstring)."""

    def __init__(self, spec: problems.Problem, rung: problems.Rung):
        self.spec, self.rung = spec, rung
        host, ext = _host(spec), _extension(spec.name)
        prefix = f"{spec.name}_{rung.name}"
        inputs = ", ".join(f"Tensor {name}" for name in spec.input_names)
        state = [f"Tensor {name}" for name in getattr(host, "STATE_NAMES", ())]
        self.state_size = len(state)
        outputs = "Tensor" if not state else "(" + ", ".join(["Tensor"] * (1 + len(state))) + ")"
        forward_launcher, _ = rung.forward_launcher(needs_grad=False)
        backward_launcher = f"{rung.inference}_backward" if rung.writes_grad_in_forward and rung.inference \
            else rung.backward

        def forward_kernel(*args):
            loss, saved = host.forward(ext(), forward_launcher, False, *args)
            return (loss, *saved[len(args):]) if self.state_size else loss

        def forward_fake(*args):
            loss = args[0].new_empty(())
            state = host.empty_state(args[0])
            return (loss, *state) if state else loss

        def backward_kernel(*args):
            *saved, grad_loss = args
            saved = [x.contiguous() for x in saved]  # the inputs as the caller passed them
            return host.backward(ext(), backward_launcher, False, saved, grad_loss)

        def backward_fake(*args):
            return torch.empty_like(args[0])

        self.forward = _define(f"{prefix}_forward", f"({inputs}) -> {outputs}", forward_kernel, forward_fake)
        self.backward = _define(f"{prefix}_backward", f"({inputs}, {', '.join([*state, 'Tensor grad_loss'])})"
                                " -> Tensor", backward_kernel, backward_fake)
        torch.library.register_autograd(self.forward, self._backward, setup_context=self._setup, lib=_LIBRARY)
        self.forward_grad = None
        if rung.writes_grad_in_forward:
            def forward_grad_kernel(*args):
                loss, (grad,) = host.forward(ext(), rung.forward, True, *args)
                return loss, grad

            def forward_grad_fake(*args):
                return args[0].new_empty(()), torch.empty_like(args[0], memory_format=torch.contiguous_format)

            def scale_kernel(grad, grad_loss):
                host.backward(ext(), rung.backward, True, (grad,), grad_loss)

            def scale_fake(grad, grad_loss):
                return None

            self.forward_grad = _define(f"{prefix}_forward_grad", f"({inputs}) -> (Tensor, Tensor)",
                                        forward_grad_kernel, forward_grad_fake)
            self.scale = _define(f"{prefix}_scale_", "(Tensor(a!) grad, Tensor grad_loss) -> ()", scale_kernel,
                                 scale_fake)
            torch.library.register_autograd(self.forward_grad, self._backward_scale,
                                            setup_context=self._setup_grad, lib=_LIBRARY)

    # autograd of the forward: the backward operator on the inputs and the state
    def _setup(self, ctx, inputs, output):
        state = output[1:] if isinstance(output, tuple) else ()
        ctx.save_for_backward(*inputs, *state)

    def _backward(self, ctx, grad_loss, *unused_state_grads):
        saved = ctx.saved_tensors
        grad = self.backward(*saved, grad_loss) if ctx.needs_input_grad[0] else None
        return (grad,) + (None,) * (len(saved) - self.state_size - 1)

    # autograd of the forward that wrote the gradient: scale it in place, once
    def _setup_grad(self, ctx, inputs, output):
        ctx.mark_non_differentiable(output[1])
        ctx.save_for_backward(output[1])
        ctx.num_inputs = len(inputs)
        ctx.backward_calls = 0

    def _backward_scale(self, ctx, grad_loss, _unused):
        if ctx.backward_calls:
            # it scales the forward's gradient buffer in place: a second call through a
            # retained graph would scale it twice
            raise RuntimeError(f"{self.spec.name} {self.rung.name}: backward can run once per forward (it scales "
                               "the forward's gradient in place); run the forward again, or use a rung that does "
                               "not write its gradient in the forward (e.g. 'vectorized') with retain_graph")
        ctx.backward_calls += 1
        (grad,) = ctx.saved_tensors
        self.scale(grad, grad_loss)
        return (grad,) + (None,) * (ctx.num_inputs - 1)

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        """The 0-d loss: the forward that writes the gradient when one will be needed."""
        if self.forward_grad is not None and torch.is_grad_enabled() and inputs[0].requires_grad:
            return self.forward_grad(*inputs)[0]
        out = self.forward(*inputs)
        return out[0] if self.state_size else out


# --- the variant registry -----------------------------------------------------------------------

OPS: dict[tuple[str, str], RungOps] = {(p, r.name): RungOps(problems.get(p), r)
                                       for p in problems.names() for r in problems.get(p).rungs}


def variant(problem: str, name: str, *, strict: bool | None = None) -> Callable[..., torch.Tensor]:
    """The loss ``problem`` computed by the kernels of rung ``name``.

    Returns a function taking the reference's arguments (e.g. ``predictions``,
    ``targets``) and returning a 0-d tensor, differentiable w.r.t. the first, that calls
    the rung's operators. It never waits for the GPU: inputs whose values give no loss (a
    cross-entropy target out of range) make the loss NaN; ``strict=True`` (default:
    ``$LOSSLAB_STRICT_TARGETS``) checks those values before every launch and raises
    ValueError naming them (one host synchronisation per call: for debugging).

    Raises:
        ValueError: unknown problem or variant.
    """
    spec = problems.get(problem)
    spec.check_variant_name(name)
    ops = OPS[(problem, name)]
    strict = strict_default() if strict is None else strict

    def loss(*inputs: torch.Tensor) -> torch.Tensor:
        if inputs and isinstance(inputs[0], torch.Tensor):
            spec.check_dtype(name, inputs[0])
        spec.validate(*inputs)
        if strict:
            spec.check_values(*inputs)
        return ops(*inputs)

    loss.__name__ = f"{problem}_{name}"
    loss.__doc__ = f"{problem} computed by the {name} kernels; same signature as the reference."
    return loss


def all_variants() -> list[tuple[str, str]]:
    """Every (problem, variant) pair, ladder order."""
    return [(p, v) for p in problems.names() for v in problems.get(p).variants]
