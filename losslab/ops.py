"""Every rung as a PyTorch operator (``torch.library``, namespace ``losslab``), and the variants on them.

    >>> kl = losslab.variant("kl_div", "vectorized")
    >>> loss = kl(predictions, targets)   # 0-d tensor, like F.kl_div(..., "batchmean")
    >>> loss.backward()                   # predictions.grad from the backward kernel

:class:`RungOps` defines one rung's operators (schemas, fake kernels, autograd: what torch.compile
traces and CUDA graphs capture; its docstring says which), :func:`variant` a rung's loss behind the
host checks, :func:`checked_loss` the host checks; ``losslab.variants`` the teaching rungs on them. No operator
waits for the host.
"""
from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping

import torch

from losslab import build, problems

NAMESPACE = "losslab"
STRICT_ENV = "LOSSLAB_STRICT_TARGETS"
_LIBRARY = torch.library.Library(NAMESPACE, "DEF")


def strict_default() -> bool:
    """Strict mode from the environment: ``LOSSLAB_STRICT_TARGETS=1`` turns it on."""
    return os.environ.get(STRICT_ENV, "").strip() not in ("", "0", "false", "False")


# --- the operators ------------------------------------------------------------------------------

def define_operator(name: str, schema: str, kernel: Callable, fake: Callable,
                    library: torch.library.Library = _LIBRARY) -> torch._ops.OpOverload:
    """Define ``losslab::<name><schema>`` in ``library`` with ``kernel`` as its CUDA
    implementation and ``fake`` as its fake (meta) one; returns the operator's default overload."""
    library.define(f"{name}{schema}")
    library.impl(name, kernel, "CUDA")
    torch.library.register_fake(f"{NAMESPACE}::{name}", fake, lib=library)
    return getattr(getattr(torch.ops, NAMESPACE), name).default


def _launchers(extension: Callable[[], object]) -> Callable[[str], Callable[..., None]]:
    """``bound(name)``: launcher ``name`` of the extension ``extension()`` returns, looked up
    once (the extension is built at the first call): no attribute lookup per call."""
    found: dict[str, Callable[..., None]] = {}

    def bound(name: str) -> Callable[..., None]:
        launcher = found.get(name)
        if launcher is None:
            launcher = found[name] = getattr(extension(), name)
        return launcher

    return bound


class RungOps:
    """The operators of one rung of one problem.

    Each rung of each problem is a set of ``torch.library`` operators in the ``losslab``
    namespace, with fake (meta) implementations for tracing and autograd registered with
    ``torch.library.register_autograd``, so that ``torch.compile(fullgraph=True)`` traces
    through a loss and CUDA graphs capture it (no operator waits for the host):

    ``losslab::<problem>_<rung>_forward(Tensor predictions, Tensor targets) -> (loss, *state)``
        the loss (0-d, the predictions' dtype) and what the backward needs besides the inputs
        (the problem's ``empty_state``: nothing for kl_div; for cross_entropy ``stats``, one
        float32 tensor holding the target counts and each row's max and log-sum). A rung that
        writes its gradient in the forward runs its inference rung's kernels here.
    ``losslab::<problem>_<rung>_backward(Tensor predictions, Tensor targets, *state, Tensor grad_loss) -> Tensor``
        dloss/dpredictions, a fresh tensor.
    ``losslab::<problem>_<rung>_forward_grad(Tensor predictions, Tensor targets) -> (Tensor, Tensor)``
        only for a rung that writes its gradient in the forward: the loss and that gradient
        (for grad_loss = 1), in a fresh tensor the operator owns.

    No operator mutates anything. The backward of ``_forward_grad`` scales its gradient by
    grad_loss: out of place when traced, in place (no work at all when grad_loss is 1) in eager
    mode, where the variants run the operators' kernels through an autograd.Function (see
    :meth:`RungOps.__call__`).

    The functions :func:`variant` returns validate their inputs on the host (raising
    TypeError/ValueError that names the argument) and call these operators. At small sizes the
    host time of a call is its whole cost, so the eager path is kept short: inputs whose
    metadata passed the checks once are not checked again (:func:`metadata_key`), a call that
    needs no gradient runs the kernels without an autograd.Function, and a call allocates only
    its outputs: scratch is the stream's own (``problems.launch.scratch``) and no launcher needs a
    memset (``kernels/common/stream_workspace.cuh``); ``scripts/host_overhead.py`` measures it.

    Out-of-range cross-entropy targets make the loss NaN and never stop the GPU;
    ``losslab.check_targets`` or strict mode raise the error naming them. It is not raised "at
    the next point where the host already waits": those points (``loss.item()``, ``print``,
    ``.cpu()``, ``torch.cuda.synchronize()``) are the caller's and none passes through losslab.
    Reaching them would take a tensor subclass for the loss (Python on every operation on it,
    and a tensor torch.compile must trace), or an asynchronous copy of the count to pinned host
    memory with an event, read at the next losslab call (host time on every call, an error one
    call late where nothing waits, and inside a CUDA graph a copy that replays with no reader).

    ``extension``: another build of the problem's kernels (a launch configuration, see
    :func:`variant`'s ``knobs``): the same host code and eager path through that build's
    launchers, and no ``torch.library`` operators of its own (so not traceable).
    """

    def __init__(self, spec: problems.Problem, rung: problems.Rung, extension: Callable[[], object] | None = None):
        self.spec, self.rung = spec, rung
        host = spec.host
        bound = _launchers(extension or functools.partial(build.load_extension, spec.name))
        prefix = f"{spec.name}_{rung.name}"
        inputs = ", ".join(f"Tensor {name}" for name in spec.input_names)
        state = [f"Tensor {name}" for name in getattr(host, "STATE_NAMES", ())]
        self.state_size = len(state)
        outputs = "Tensor" if not state else "(" + ", ".join(["Tensor"] * (1 + len(state))) + ")"
        forward_launcher, _ = rung.forward_launcher(needs_grad=False)
        backward_launcher = f"{rung.inference}_backward" if rung.writes_grad_in_forward and rung.inference \
            else rung.backward

        def forward_kernel(*args):
            loss, saved = host.forward(bound(forward_launcher), False, *args)
            return (loss, *saved[len(args):]) if self.state_size else loss

        def infer(*args):  # the loss alone: no state for a backward (one allocation, the loss)
            return host.forward(bound(forward_launcher), False, *args, state=False)[0]

        def forward_fake(*args):
            loss = args[0].new_empty(())
            state = host.empty_state(args[0])
            return (loss, *state) if state else loss

        def backward_kernel(*args):
            *saved, grad_loss = args
            saved = [x.contiguous() for x in saved]  # the inputs as the caller passed them
            return host.backward(bound(backward_launcher), False, saved, grad_loss)

        def backward_fake(*args):
            return torch.empty_like(args[0], memory_format=torch.contiguous_format)

        def launch_forward(inputs, out=None, needs_grad=False, grad_out=None):
            launcher, write_grad = rung.forward_launcher(needs_grad)
            return host.forward(bound(launcher), write_grad, *inputs, out=out, grad_out=grad_out)

        def launch_backward(saved, grad_loss, out=None):
            return host.backward(bound(rung.backward), rung.writes_grad_in_forward, saved, grad_loss, out=out)

        self.forward_kernel, self.backward_kernel, self.infer = forward_kernel, backward_kernel, infer
        # the problem launchers' interface (Problem.launch_forward/launch_backward) on this build
        self.launch_forward, self.launch_backward = launch_forward, launch_backward
        self.writes_grad = rung.writes_grad_in_forward
        self.forward = self.backward = self.forward_grad = None
        if rung.writes_grad_in_forward:
            def forward_grad_kernel(*args):
                loss, (grad,) = host.forward(bound(rung.forward), True, *args)
                return loss, grad

            def scale_kernel(grad, grad_loss):
                host.backward(bound(rung.backward), True, (grad,), grad_loss)

            self.forward_grad_kernel, self.scale_kernel = forward_grad_kernel, scale_kernel
        if extension is not None:
            return  # another build: the eager path only
        self.forward = define_operator(f"{prefix}_forward", f"({inputs}) -> {outputs}", forward_kernel, forward_fake)
        self.backward = define_operator(f"{prefix}_backward", f"({inputs}, {', '.join([*state, 'Tensor grad_loss'])})"
                                " -> Tensor", backward_kernel, backward_fake)
        torch.library.register_autograd(self.forward, self._backward, setup_context=self._setup, lib=_LIBRARY)
        if rung.writes_grad_in_forward:
            def forward_grad_fake(*args):
                return args[0].new_empty(()), torch.empty_like(args[0], memory_format=torch.contiguous_format)

            self.forward_grad = define_operator(f"{prefix}_forward_grad", f"({inputs}) -> (Tensor, Tensor)",
                                        self.forward_grad_kernel, forward_grad_fake)
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

    def _backward_scale(self, ctx, grad_loss, _unused):
        # Traced, the gradient is scaled out of place (one fused multiply): a backward that
        # mutated an output of the forward cannot be partitioned by AOTAutograd. Eager mode
        # (EagerLoss) scales in place, and not at all when grad_loss is 1.
        (grad,) = ctx.saved_tensors
        scaled = (grad.float() * grad_loss.to(device=grad.device, dtype=torch.float32)).to(grad.dtype)
        return (scaled,) + (None,) * (ctx.num_inputs - 1)

    def check_backward_once(self, ctx) -> None:
        """A backward that scales the forward's gradient in place runs once per forward: a
        second call through a retained graph would scale it twice."""
        if ctx.backward_calls:
            raise RuntimeError(f"{self.spec.name} {self.rung.name}: backward can run once per forward (it scales "
                               "the forward's gradient in place); run the forward again, or use a rung that does "
                               "not write its gradient in the forward (e.g. 'vectorized') with retain_graph")
        ctx.backward_calls += 1

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        """The 0-d loss: the forward that writes the gradient when one will be needed.

        Traced (torch.compile) it calls the operators. In eager mode it runs the same kernels
        through :class:`EagerLoss`, an autograd.Function, skipping the dispatcher's Python
        round trips: measured on CPU with the kernels stubbed out, register_autograd's
        operator path costs about 3.4x the host time of this one (83 against 24 us a call
        on a slow 2-core VM), and the host time is the whole cost of a small loss. Where no
        gradient will be needed it calls the kernels alone (:attr:`infer`): the
        autograd.Function cost 8.5 of a kl_div forward's 28 us on an H100 machine.
        """
        if torch.compiler.is_compiling():
            if self.forward is None:
                raise RuntimeError(f"{self.spec.name} {self.rung.name}: a knob build runs in eager mode only; "
                                   "trace the default build (losslab.variant without knobs)")
            if self.forward_grad is not None and torch.is_grad_enabled() and inputs[0].requires_grad:
                return self.forward_grad(*inputs)[0]
            out = self.forward(*inputs)
            return out[0] if self.state_size else out
        return self.eager(*inputs)

    def eager(self, *inputs: torch.Tensor) -> torch.Tensor:
        """:meth:`__call__` in eager mode (not traced)."""
        if torch.is_grad_enabled() and inputs[0].requires_grad:
            return EagerLoss.apply(self, self.writes_grad, *inputs)
        return self.infer(*inputs)


class EagerLoss(torch.autograd.Function):
    """One rung's loss in eager mode: the operators' kernels, autograd by hand (see RungOps.__call__)."""

    @staticmethod
    def forward(ctx, ops: RungOps, write_grad: bool, *inputs: torch.Tensor) -> torch.Tensor:
        ctx.ops, ctx.write_grad, ctx.num_inputs, ctx.backward_calls = ops, write_grad, len(inputs), 0
        if write_grad:
            loss, grad = ops.forward_grad_kernel(*inputs)
            ctx.save_for_backward(grad)
            return loss
        out = ops.forward_kernel(*inputs)
        loss, state = (out[0], out[1:]) if ops.state_size else (out, ())
        ctx.save_for_backward(*inputs, *state)
        return loss

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        grad = None
        if ctx.write_grad:
            ctx.ops.check_backward_once(ctx)
            (grad,) = ctx.saved_tensors
            ctx.ops.scale_kernel(grad, grad_loss)
        elif ctx.needs_input_grad[2]:
            grad = ctx.ops.backward_kernel(*ctx.saved_tensors, grad_loss)
        return (None, None, grad) + (None,) * (ctx.num_inputs - 1)


# --- the variant registry -----------------------------------------------------------------------

OPS: dict[tuple[str, str], RungOps] = {(p.name, r.name): RungOps(p, r) for p in problems.registered() for r in p.rungs}


_KNOB_OPS: dict[build.knobs.Config, RungOps] = {}  # other launch configurations, built on first use

MAX_VALIDATED = 64  # metadata keys remembered per variant


def metadata_key(inputs: tuple) -> tuple | None:
    """What the input checks of a problem of tensors read (type, dtype, shape, device of each, and
    whether any but the first requires grad), as a hashable key, or None for other inputs.

    The checks (``Problem.validate``, ``check_dtype``) read only these, so inputs with a key
    that passed once pass again: a call then costs a key instead of the checks (about 1
    against 3 us of host time). The values (a target's range) are not part of it.
    """
    if len(inputs) < 2:
        return None
    key = []
    for x in inputs:  # a loop, not generators: this is most of a small call's host time
        if x.__class__ is not torch.Tensor:
            return None
        key += (x.dtype, x.shape, x.device, x.requires_grad)
    key[3] = None  # the first input's requires_grad: the checks do not read it
    return tuple(key)


def variant(problem: problems.Problem | str, name: str, *, strict: bool | None = None,
            knobs: Mapping[str, int] | None = None) -> Callable[..., torch.Tensor]:
    """The loss ``problem`` (a Problem, or its name: looked up here) computed by the kernels of rung ``name``.

    Returns a function taking the reference's arguments (e.g. ``predictions``,
    ``targets``) and returning a 0-d tensor, differentiable w.r.t. the first, that calls
    the rung's operators. It never waits for the GPU: inputs whose values give no loss (a
    cross-entropy target out of range) make the loss NaN; ``strict=True`` (default:
    ``$LOSSLAB_STRICT_TARGETS``) checks those values before every launch and raises
    ValueError naming them (one host synchronisation per call: for debugging).

    ``knobs`` (knob name -> value, e.g. ``{"THREADS": 512}``; ``build.knobs``): the rung in that
    launch configuration, built as its own extension at the first call and cached by its
    compiler flags, called through the same host code and eager path as the default build (not
    traceable). The function then also has ``name`` (the configuration's label, e.g.
    ``"vectorized [THREADS=512, UNROLL=4]"``), ``dtypes`` and ``rung``: a variant object that
    ``measure.bench`` times as it times the rung.

    Raises:
        ValueError: unknown problem or variant; a knob the rung lacks or a value it does not offer.
    """
    spec = problems.get(problem)
    spec.check_variant_name(name)
    ops = OPS[(spec.name, name)]
    config = build.knobs.config(spec.name, name, knobs) if knobs is not None else None
    if config is not None and not config.is_default:
        if config not in _KNOB_OPS:
            _KNOB_OPS[config] = RungOps(spec, spec.rung(name), functools.partial(
                build.load_extension, spec.name, defines=config.defines))
        ops = _KNOB_OPS[config]
    loss = checked_loss(spec, spec.rung(name), ops, strict_default() if strict is None else strict)
    loss.__name__ = f"{spec.name}_{name}"
    loss.__doc__ = f"{spec.name} computed by the {name} kernels; same signature as the reference."
    if config is not None:
        loss.name, loss.dtypes, loss.rung = config.label, spec.dtypes(name), spec.rung(name)
        loss.launch_forward, loss.launch_backward = ops.launch_forward, ops.launch_backward  # for check.resolve
    return loss


def checked_loss(spec: problems.Problem, rung: problems.Rung, ops: RungOps, strict: bool) -> Callable:
    """``ops``' loss behind the host checks (the dtypes ``rung`` takes, ``spec.validate``, and the
    values too when ``strict``): inputs whose metadata passed once are not checked again."""
    dtypes = rung.dtypes
    validated: set = set()  # metadata_key()s of inputs that passed the checks below

    def loss(*inputs: torch.Tensor) -> torch.Tensor:
        # traced, the checks run every time (they cost nothing at run time)
        compiling = torch.compiler.is_compiling()
        key = None if compiling else metadata_key(inputs)
        if key is None or key not in validated:
            if inputs and isinstance(inputs[0], torch.Tensor) and inputs[0].dtype not in dtypes:
                allowed = ", ".join(str(d) for d in dtypes)
                raise TypeError(f"{spec.input_names[0]}: {spec.name} {rung.name} takes dtype {allowed}, "
                                f"got {inputs[0].dtype}")
            spec.validate(*inputs)
            if key is not None and len(validated) < MAX_VALIDATED:
                validated.add(key)
        if strict:
            spec.check_values(*inputs)
        return ops(*inputs) if compiling else ops.eager(*inputs)

    return loss


def all_variants() -> list[tuple[str, str]]:
    """Every (problem, variant) pair, ladder order."""
    return [(p.name, v) for p in problems.registered() for v in p.variants]
