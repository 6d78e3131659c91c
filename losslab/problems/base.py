"""What every loss problem has: the :class:`Problem` base class, its :class:`Rung` table rows
and :class:`Cost` model (the problems themselves are the sibling modules; see
:mod:`losslab.problems`)."""
from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch

from losslab import build

DIRECTIONS = ("forward", "backward", "forward_backward")
FLOAT32 = (torch.float32,)
HALF_AND_FLOAT = (torch.float32, torch.bfloat16, torch.float16)
HEAVY_EVERY = 64  # structured inputs: about one row in this many carries most of the loss


def heavy_rows(rows: int, generator: torch.Generator, device: str | torch.device) -> torch.Tensor:
    """The rows that carry most of a structured input's loss: rows // HEAVY_EVERY (at least one)
    distinct row indices drawn from ``generator``."""
    return torch.randperm(rows, generator=generator, device=device)[:max(1, rows // HEAVY_EVERY)]


@dataclass(frozen=True)
class Rung:
    """One rung of a problem's ladder: the only place rungs are told apart.

    Attributes:
        name: the rung's name; its kernels are ``kernels/<problem>/<name>.cu`` and its
            launchers ``<problem>_<name>_forward``/``_backward`` (bound without the prefix).
        dtypes: input dtypes its kernels take (the teaching rungs float32 only; the
            templated ones also bfloat16 and float16, with fp32 math).
        writes_grad_in_forward: the forward also writes the gradient (for grad_loss = 1)
            when one will be needed, and the backward only scales it in place, so it runs
            once per forward.
        inference: the rung whose forward runs when no gradient will be needed (a rung
            that writes its gradient in the forward needs a buffer for it; inference
            should not pay for one). None: its own.
        falls_back_to: the rung whose launchers this rung's call where its kernels do not
            apply (cross_entropy's cluster on a device without clusters runs fused's):
            its ``.cu`` is linked with this rung's wherever the rung is built alone.
    """

    name: str
    dtypes: tuple[torch.dtype, ...] = FLOAT32
    writes_grad_in_forward: bool = False
    inference: str | None = None
    falls_back_to: str | None = None

    @property
    def forward(self) -> str:
        """The bound name of its forward launcher."""
        return f"{self.name}_forward"

    def forward_launcher(self, needs_grad: bool) -> tuple[str, bool]:
        """The bound forward launcher to run, and whether it writes the gradient: this rung's
        when a gradient will be needed (or it writes none), else its ``inference`` rung's."""
        if self.writes_grad_in_forward and not needs_grad:
            return f"{self.inference or self.name}_forward", self.inference is None
        return self.forward, self.writes_grad_in_forward

    @property
    def backward(self) -> str:
        """The bound name of its backward launcher."""
        return f"{self.name}_backward"


# The ladder both problems climb; each rung fixes one named flaw of the one below.
LADDER = (
    Rung("naive"),
    Rung("shared_memory"),
    Rung("warp_shuffle"),
    Rung("vectorized", dtypes=HALF_AND_FLOAT),
    Rung("fused", dtypes=HALF_AND_FLOAT, writes_grad_in_forward=True, inference="vectorized"),
)


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
    host: ModuleType  # the package's ``host`` module: validate_inputs, forward and backward of every rung
    rungs: tuple[Rung, ...] = LADDER
    sizes: dict[str, tuple[int, int]]  # size name -> (rows, columns); "seed" is the default
    sweep_shapes: tuple[tuple[int, int], ...] = ()  # from launch-bound (128 rows) to LLM-sized, the seed among them
    # What the notebooks claim of this loss's ladder, checked on every record (losslab.present.evidence):
    # the rung whose scalar loads already reach the bandwidth, as (rung, direction, least fraction of it) ...
    saturates: tuple[str, str, float] = ("warp_shuffle", "forward", 0.95)
    # ... and steps as (key, lower rung, upper rung, direction, least, most x rung below, why)
    step_claims: tuple[tuple[str, str, str, str, float, float, str], ...] = ()
    # (peer, direction) -> why that peer's kernels for the direction do no work of their own
    peer_notes: dict[tuple[str, str], str] = {}

    @property
    def kernelbench_file(self) -> Path:
        """KernelBench's problem file (``Model``, ``get_inputs``, ``get_init_inputs``) as KernelBench
        writes it: ``kernelbench.py`` of the loss's package."""
        return Path(sys.modules[type(self).__module__].__file__).with_name("kernelbench.py")

    @property
    def variants(self) -> tuple[str, ...]:
        """The rungs' names, in ladder order."""
        return tuple(r.name for r in self.rungs)

    def rung(self, variant: str) -> Rung:
        """The row of the rung table called ``variant``.

        Raises:
            ValueError: no rung of that name (naming the ones there are).
        """
        for r in self.rungs:
            if r.name == variant:
                return r
        raise ValueError(f"variant: {self.name} has no variant {variant!r}; "
                         f"expected one of {', '.join(self.variants)}")

    def reference(self, *inputs: torch.Tensor) -> torch.Tensor:
        """The PyTorch definition of the loss (a 0-d tensor)."""
        raise NotImplementedError

    def make_inputs(self, shape: tuple[int, int], *, seed: int, device: str | torch.device = "cuda",
                    dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, ...]:
        """Random inputs of ``shape`` drawn from a generator seeded with ``seed``."""
        raise NotImplementedError

    def structured_inputs(self, shape: tuple[int, int], *, seed: int, device: str | torch.device = "cuda",
                          dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, ...]:
        """Inputs of ``shape`` drawn from ``seed`` whose rows differ in scale by orders of magnitude
        and whose loss sits in a few rows (about one in :data:`HEAVY_EVERY`, at random positions):
        an answer that computes the loss from a sample of the rows is off by a large fraction
        (the evaluator draws them beside :meth:`make_inputs`).

        Raises:
            NotImplementedError: the problem has none.
        """
        raise NotImplementedError(f"problem: {self.name} has no structured inputs")

    def cancelled_gradient_scale(self, *inputs: torch.Tensor) -> float | None:
        """The size of the gradient's terms (for grad_loss = 1) where its float64 value is exactly 0
        although they are not: ``measure.check`` divides such a gradient's absolute error by it.
        None (the absolute error stands) unless a problem's exact zeros are sums of large terms
        that cancel (``cosine_similarity_loss``: rows of one element)."""
        return None

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

    def liger_op(self) -> Callable[..., torch.Tensor]:
        """Liger-Kernel's op for this loss, with the reference's signature (a peer).

        Raises:
            ImportError: Liger-Kernel is not installed.
            LookupError: Liger-Kernel has no such loss (the message says so).
        """
        raise LookupError(f"Liger-Kernel has no {self.name}")

    def quack_op(self) -> Callable[..., torch.Tensor]:
        """quack's op for this loss (Dao-AILab's quack-kernels), with the reference's signature.

        Raises:
            ImportError: quack-kernels is not installed.
            LookupError: quack has no such loss, or this GPU cannot run it (the message says which).
        """
        raise LookupError(f"quack-kernels has no {self.name}")

    def check_values(self, *inputs: torch.Tensor) -> None:
        """Raise ValueError if the inputs' values cannot give a loss (e.g. a class index out of
        range). It reads values back, so it waits for the GPU: the launches never call it;
        strict mode (:func:`losslab.variant`) does, before every launch. None by default."""

    def launch_forward(self, variant: str, inputs: Sequence[torch.Tensor], out: torch.Tensor | None = None,
                       needs_grad: bool = False, grad_out: torch.Tensor | None = None,
                       ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """Run ``variant``'s forward kernels on validated inputs, through the host's ``forward``.

        Returns the 0-d loss (written into ``out`` if given) and the tensors the
        backward needs. ``needs_grad`` says a backward will follow: a rung that
        ``writes_grad_in_forward`` then also writes the gradient (into ``grad_out``
        if given); without it, inference pays nothing for the gradient. Never waits
        for the GPU.
        """
        launcher, write_grad = self.rung(variant).forward_launcher(needs_grad)
        return self.host.forward(getattr(build.load_extension(self.name), launcher), write_grad, *inputs, out=out,
                                 grad_out=grad_out)

    def launch_backward(self, variant: str, saved: Sequence[torch.Tensor], grad_loss: torch.Tensor,
                        out: torch.Tensor | None = None) -> torch.Tensor:
        """Run ``variant``'s backward kernels through the host's ``backward``: the gradient
        w.r.t. the first input (written into ``out`` if given), scaled by the 0-d ``grad_loss``."""
        rung = self.rung(variant)
        return self.host.backward(getattr(build.load_extension(self.name), rung.backward),
                                  rung.writes_grad_in_forward, saved, grad_loss, out=out)

    def condition_parts(self, *inputs64: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(sum of |a_i| + |b_i|, sum of a_i - b_i) for the terms a_i - b_i the loss sums, from float64
        inputs: the condition number the evaluator's tolerance follows
        (``losslab.kernelbench.verdict.condition_number``; Higham, *Accuracy and Stability of Numerical
        Algorithms*, 2nd ed., section 4.2).

        Raises:
            NotImplementedError: the problem does not say (its condition is taken as 1).
        """
        raise NotImplementedError(f"problem: {self.name} has no condition terms")

    def reference_float64(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Loss and gradient w.r.t. the first input from the reference in float64, with
        autograd; the yardstick every variant is checked against."""
        upcast = [x.detach().double() if x.is_floating_point() else x for x in inputs]
        upcast[0].requires_grad_(True)
        loss = self.reference(*upcast)
        (grad,) = torch.autograd.grad(loss, upcast[0])
        return loss.detach(), grad

    def dtypes(self, variant: str) -> tuple[torch.dtype, ...]:
        """Input dtypes ``variant`` accepts (from the rung table)."""
        return self.rung(variant).dtypes

    def check_dtype(self, variant: str, predictions: torch.Tensor) -> None:
        """Raise TypeError if ``variant`` has no kernels for ``predictions``' dtype."""
        if predictions.dtype not in self.dtypes(variant):
            allowed = ", ".join(str(d) for d in self.dtypes(variant))
            raise TypeError(f"{self.input_names[0]}: {self.name} {variant} takes dtype {allowed}, "
                            f"got {predictions.dtype}")

    def check_variant_name(self, variant: str) -> None:
        """Raise ValueError unless ``variant`` names a rung."""
        self.rung(variant)


def misaligned_view(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """A contiguous (rows, cols) view of ``x``'s storage starting one element in, so that
    no row is 16-byte aligned and vector loads must take their slow path (an edge case).
    ``x`` must hold at least rows * cols + 1 elements."""
    return x.reshape(-1)[1:1 + rows * cols].view(rows, cols)
