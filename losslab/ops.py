"""The variant registry: (problem, variant) -> a function with the reference's signature.

    >>> kl = losslab.variant("kl_div", "vectorized")
    >>> loss = kl(predictions, targets)   # 0-d tensor, like F.kl_div(..., "batchmean")
    >>> loss.backward()                   # predictions.grad from the backward kernel

Each function validates its inputs on the host (raising TypeError/ValueError
that names the argument), then runs the variant's forward kernels inside a
``torch.autograd.Function`` whose backward runs the variant's backward kernels.
"""
from __future__ import annotations

from typing import Callable

import torch

from losslab import problems


class LossFunction(torch.autograd.Function):
    """Autograd glue shared by every problem: forward/backward delegate to the problem's launchers."""

    @staticmethod
    def forward(ctx, problem: problems.Problem, variant: str, needs_grad: bool,
                *inputs: torch.Tensor) -> torch.Tensor:
        loss, saved = problem.launch_forward(variant, inputs, needs_grad=needs_grad)
        ctx.save_for_backward(*saved)
        ctx.problem, ctx.variant, ctx.num_inputs = problem, variant, len(inputs)
        ctx.backward_calls = 0
        return loss

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        if ctx.variant == "fused" and ctx.backward_calls:
            # its backward scales the forward's gradient buffer in place: a second
            # call through a retained graph would scale it twice
            raise RuntimeError(f"{ctx.problem.name} fused: backward can run once per forward; "
                               "run the forward again, or use the 'vectorized' variant with retain_graph")
        ctx.backward_calls += 1
        grad = None
        if ctx.needs_input_grad[3]:
            grad = ctx.problem.launch_backward(ctx.variant, ctx.saved_tensors, grad_loss)
        return (None, None, None, grad) + (None,) * (ctx.num_inputs - 1)


def variant(problem: str, name: str) -> Callable[..., torch.Tensor]:
    """The loss ``problem`` computed by the kernels of rung ``name``.

    Returns a function taking the reference's arguments (e.g. ``predictions``,
    ``targets``) and returning a 0-d tensor, differentiable w.r.t. the first.

    Raises:
        ValueError: unknown problem or variant.
    """
    spec = problems.get(problem)
    spec.check_variant_name(name)

    def loss(*inputs: torch.Tensor) -> torch.Tensor:
        if inputs and isinstance(inputs[0], torch.Tensor):
            spec.check_dtype(name, inputs[0])
        spec.validate(*inputs)
        # inside the Function grad mode is off, so decide here whether a gradient will be needed
        needs_grad = torch.is_grad_enabled() and inputs[0].requires_grad
        return LossFunction.apply(spec, name, needs_grad, *inputs)

    loss.__name__ = f"{problem}_{name}"
    loss.__doc__ = f"{problem} computed by the {name} kernels; same signature as the reference."
    return loss


def all_variants() -> list[tuple[str, str]]:
    """Every (problem, variant) pair, ladder order."""
    return [(p, v) for p in problems.names() for v in problems.get(p).variants]
