"""Loss problems: one module per problem, each defining one :class:`Problem`.

A problem bundles what every part of losslab needs to know about a loss: the
PyTorch reference, a seeded input generator, named sizes, the input checks,
the cost model and the launchers of its kernel ladder. Adding a problem means
adding a module here (registered in ``_MODULES``), a ``kernels/<name>/`` folder
and a binding ``losslab/csrc/<name>.cpp``; nothing else changes.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Sequence

import torch

DIRECTIONS = ("forward", "backward", "forward_backward")
LADDER = ("naive", "shared_memory", "warp_shuffle", "vectorized")
_MODULES = ("kl_div", "cross_entropy")


@dataclass(frozen=True)
class Cost:
    """The least work a kernel must do: each input read once, each output written once.

    Attributes:
        bytes_read, bytes_written: device-memory traffic in bytes.
        flops: floating-point adds, multiplies and divides.
        transcendentals: calls of log/exp (counted apart: they run on the
            special-function units, not the FMA pipes).
    """

    bytes_read: int
    bytes_written: int
    flops: int
    transcendentals: int

    @property
    def bytes(self) -> int:
        return self.bytes_read + self.bytes_written

    @property
    def arithmetic_intensity(self) -> float:
        """FLOP per byte of minimum traffic."""
        return self.flops / self.bytes


class Problem:
    """Base class of a loss problem; subclasses fill in the loss-specific parts.

    Inputs are a tuple of tensors in the reference's argument order; the
    gradient is taken with respect to the first one (``predictions``).
    """

    name: str
    input_names: tuple[str, ...]
    variants: tuple[str, ...] = LADDER
    sizes: dict[str, tuple[int, int]]  # size name -> (rows, columns); "seed" is the default

    def reference(self, *inputs: torch.Tensor) -> torch.Tensor:
        """The PyTorch definition of the loss (a 0-d tensor)."""
        raise NotImplementedError

    def make_inputs(self, shape: tuple[int, int], *, seed: int, device: str | torch.device = "cuda",
                    dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, ...]:
        """Random inputs of ``shape`` drawn from a generator seeded with ``seed``."""
        raise NotImplementedError

    def validate(self, *inputs: object) -> None:
        """Raise TypeError/ValueError naming the argument if the inputs cannot run on a kernel."""
        raise NotImplementedError

    def cost(self, shape: tuple[int, int], direction: str,
             dtype: torch.dtype = torch.float32) -> Cost:
        """Minimum traffic and arithmetic of ``direction`` (one of DIRECTIONS) at ``shape``."""
        raise NotImplementedError

    def edge_cases(self, device: str | torch.device = "cuda") -> dict[str, tuple[torch.Tensor, ...]]:
        """Named inputs where hand-written kernels usually go wrong, each with a one-line reason
        as the key."""
        raise NotImplementedError

    def launch_forward(self, variant: str, inputs: Sequence[torch.Tensor], out: torch.Tensor | None = None,
                       needs_grad: bool = False, grad_out: torch.Tensor | None = None,
                       ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """Run ``variant``'s forward kernels on validated inputs.

        Returns the 0-d loss (written into ``out`` if given) and the tensors the
        backward needs. ``needs_grad`` says a backward will follow: the ``fused``
        rung then also writes the gradient (into ``grad_out`` if given); without
        it, inference pays nothing for the gradient.
        """
        raise NotImplementedError

    def launch_backward(self, variant: str, saved: Sequence[torch.Tensor], grad_loss: torch.Tensor,
                        out: torch.Tensor | None = None) -> torch.Tensor:
        """Run ``variant``'s backward kernels: the gradient w.r.t. the first input
        (written into ``out`` if given), scaled by the 0-d ``grad_loss``."""
        raise NotImplementedError

    def reference_float64(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Loss and gradient w.r.t. the first input from the reference in float64, with
        autograd; the yardstick every variant is checked against."""
        upcast = [x.detach().double() if x.is_floating_point() else x for x in inputs]
        upcast[0].requires_grad_(True)
        loss = self.reference(*upcast)
        (grad,) = torch.autograd.grad(loss, upcast[0])
        return loss.detach(), grad

    def dtypes(self, variant: str) -> tuple[torch.dtype, ...]:
        """Input dtypes ``variant`` accepts (float32 unless a problem says more)."""
        return (torch.float32,)

    def check_dtype(self, variant: str, predictions: torch.Tensor) -> None:
        """Raise TypeError if ``variant`` has no kernels for ``predictions``' dtype."""
        if predictions.dtype not in self.dtypes(variant):
            allowed = ", ".join(str(d) for d in self.dtypes(variant))
            raise TypeError(f"predictions: {self.name} {variant} takes dtype {allowed}, got {predictions.dtype}")

    def check_variant_name(self, variant: str) -> None:
        if variant not in self.variants:
            raise ValueError(f"variant: {self.name} has no variant {variant!r}; "
                             f"expected one of {', '.join(self.variants)}")


def misaligned_view(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """A contiguous (rows, cols) view of ``x``'s storage starting one element in, so that
    no row is 16-byte aligned and vector loads must take their slow path (an edge case).
    ``x`` must hold at least rows * cols + 1 elements."""
    return x.reshape(-1)[1:1 + rows * cols].view(rows, cols)


def names() -> tuple[str, ...]:
    """Names of all problems, in the order the workbook presents them."""
    return _MODULES


def get(name: str) -> Problem:
    """The problem called ``name``. Raises ValueError for an unknown name."""
    if name not in _MODULES:
        raise ValueError(f"problem: no problem {name!r}; expected one of {', '.join(_MODULES)}")
    return importlib.import_module(f"{__name__}.{name}").PROBLEM
