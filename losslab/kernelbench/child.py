"""The child process of an evaluation: loads one solution file and runs it on the parent's commands.

    python -m losslab.kernelbench.child CONFIG.json

Run only by ``evaluate.evaluate`` (through ``supervisor``). THIS PROCESS RUNS THE SOLUTION'S
CODE, so it decides nothing: it draws the inputs each command's seed gives, calls the solution
and hands back what came out and what its clocks measured (:class:`Session`, :func:`serve`);
the parent (``parent``) checks all of it. What it finds itself (a replaced function, an input
changed in place) it reports, as far as the solution lets it.
"""
from __future__ import annotations

import importlib.util
import inspect
import json
import os
import sys
import time
import traceback
import types
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn as nn

from losslab import problems
from losslab.kernelbench import clocks, failures
from losslab.kernelbench.channel import receive_command, send
from losslab.kernelbench.clocks import WARMUP_MS, back_to_back, perf_counter, sync_overhead_ms, synchronize, timed_call
from losslab.kernelbench.failures import Captured, Stop, capture_stdout, failure, is_cuda_error
from losslab.kernelbench.inputs import make as draw
from losslab.measure import check
from losslab.measure.timing import peak_extra_memory

# --- tampering ---------------------------------------------------------------------------------------

def watched(spec: problems.Problem) -> dict[str, tuple[bool, dict[str, object]]]:
    """Every function and class that the reference, the checks and the timing look up at call time,
    as {namespace: (is_module, {name: object})}: the namespaces of time, torch, torch.cuda and
    torch.nn.functional, the problem's module, this module, ``clocks`` and ``failures``; the
    attributes (inherited ones included) of Tensor, Module, Event, Stream and the problem object."""
    spaces = {"time": time, "torch": torch, "torch.cuda": torch.cuda, "torch.nn.functional": torch.nn.functional,
              "torch.Tensor": torch.Tensor, "torch.nn.Module": nn.Module, "torch.cuda.Event": torch.cuda.Event,
              "torch.cuda.Stream": torch.cuda.Stream, "losslab.problems": problems, "losslab.measure.check": check,
              "problem": spec, type(spec).__module__: sys.modules[type(spec).__module__],
              "losslab.kernelbench.child": sys.modules[__name__], "losslab.kernelbench.clocks": clocks,
              "losslab.kernelbench.failures": failures}
    return {label: (isinstance(space, types.ModuleType), _members(space)) for label, space in spaces.items()}


def _members(space: object) -> dict[str, object]:
    """A module's own functions and classes; for a class or an object, every such attribute it
    resolves, as stored (no descriptor is called, so a bound method never counts as a change)."""
    if isinstance(space, types.ModuleType):
        members = dict(vars(space))
    else:
        members = {name: inspect.getattr_static(space, name, None) for name in dir(space)}
    return {name: value for name, value in members.items()
            if callable(value) or isinstance(value, (staticmethod, classmethod, property))}


def replaced(before: dict[str, tuple[bool, dict[str, object]]], spec: problems.Problem) -> list[str]:
    """Dotted names of ``before`` (a :func:`watched` snapshot) that now hold another object or are
    gone, and attributes new to a class or the problem object (one that shadows an inherited
    method). A module's new names are not counted: imports add them."""
    now = watched(spec)
    names = []
    for label, (is_module, members) in before.items():
        current = now[label][1]
        names += [f"{label}.{name}" for name, value in members.items() if current.get(name) is not value]
        if not is_module:
            names += [f"{label}.{name}" for name in current.keys() - members.keys()]
    return sorted(names)


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape, dtype and bytes; any dtype (bfloat16 included) on any device."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    as_bytes = lambda x: x.detach().contiguous().reshape(-1).view(torch.uint8)  # noqa: E731
    return bool(torch.equal(as_bytes(a), as_bytes(b)))


def changed(names: tuple[str, ...], before: list[torch.Tensor], after: tuple) -> list[str]:
    """The names of the inputs whose bytes differ from the copies taken before the call."""
    return [name for name, old, new in zip(names, before, after, strict=True) if not bitwise_equal(old, new)]


def describe(values) -> list[str]:
    return [f"{tuple(v.shape)} {str(v.dtype).removeprefix('torch.')}" if isinstance(v, torch.Tensor)
            else repr(v)[:80] for v in values]


class Reference(nn.Module):
    """KernelBench's ``Model`` for a losslab problem: forward is the problem's reference."""

    def __init__(self, problem: problems.Problem):
        super().__init__()
        self.problem = problem

    def forward(self, *inputs):
        return self.problem.reference(*inputs)


# --- the commands ------------------------------------------------------------------------------------

class Session:
    """One evaluation in the child: the config, the solution's model, one method per command.

    Each method takes the command's fields and returns (reply header, tensors); a failure of
    the solution raises :class:`Stop`. Each command draws the inputs its seed gives
    (``inputs.make``), calls the solution and hands back what it returned (output tensors,
    gradients) and what the clocks measured; the parent holds its own copy of every input,
    computes every reference and every comparison itself, and checks the reported times against
    its own clock (``parent``).

    What this process does find, it reports, as far as the solution lets it (code in this
    process can change anything here): the solution's build error or exception, a replaced
    function of torch, time, the problem or the evaluator's modules (``tampered``,
    :func:`replaced`), an input changed in place (a copy of each input before the call,
    compared bitwise after it).

    Defences of the timing (the parent's clock bounds them from below):

    - the clocks, events and synchronisation the timing uses are bound when ``clocks`` is
      imported, before any solution code runs;
    - every timed call gets fresh inputs from a seed the parent draws at that moment, made
      outside the timed region (:meth:`prepare`); its output goes back to the parent for checking;
    - every timed call is measured twice (``clocks.timed_call``): CUDA events on the caller's
      stream, and the host clock around the call and a device-wide synchronisation. Work left
      running on another stream shows as the difference (``hidden_work``);
    - the command that makes a timed call (:meth:`go`) also makes N back-to-back synchronised
      calls of the same forward (``clocks.back_to_back``), and the parent's clock brackets the
      command, less the same command with an empty forward (``verdict.parent_clock``).
    """

    def __init__(self, config: dict):
        self.config = config
        self.device = config.get("device", "cuda")
        self.spec = problems.get(config["problem"])
        self.names = tuple(self.spec.input_names)
        self.shape = tuple(config["shape"])
        self.dtype = getattr(torch, config["dtype"])
        self.before: dict = {}
        self.model: nn.Module | None = None
        self.flush: torch.Tensor | None = None
        self.prepared: tuple | None = None

    def inputs(self, seed: int, kind: str = "random") -> tuple:
        return draw(self.spec, self.shape, seed, kind, self.device, self.dtype)

    def call(self, stage: str, fn: Callable, *args):
        """Run the solution's code ``fn(*args)`` (its output captured); its exceptions become a Stop."""
        output = Captured()
        try:
            with capture_stdout(output):
                value = fn(*args)
                if self.device == "cuda":
                    synchronize()
            return value
        except Exception as err:  # noqa: BLE001 - the solution may raise anything
            raise failure(stage, err, output.text, Path(self.config["solution"]).read_text(errors="replace")) from err

    def check_untampered(self, when: str) -> None:
        names = replaced(self.before, self.spec)
        if names:
            shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
            raise Stop("tampered", f"{when}, the solution had replaced {shown}", "\n".join(names))

    def load(self) -> tuple[dict, list]:
        """Import the file (which may build its extension) and construct its ModelNew."""
        device = torch.cuda.get_device_name() if self.device == "cuda" else "cpu (no timing, no memory)"
        self.before = watched(self.spec)
        module_spec = importlib.util.spec_from_file_location("solution", self.config["solution"])
        solution = importlib.util.module_from_spec(module_spec)
        sys.modules["solution"] = solution
        self.call("load", module_spec.loader.exec_module, solution)
        if not isinstance(getattr(solution, "ModelNew", None), type):
            raise Stop("raised", "the file defines no class ModelNew")
        own = {}
        for name in ("get_inputs", "get_init_inputs"):  # reported, not used: the problem's inputs are
            fn = getattr(solution, name, None)
            try:
                own[name] = describe(fn()) if callable(fn) else None
            except Exception as err:  # noqa: BLE001
                own[name] = f"raised {type(err).__name__}: {err}"[:300]
        self.model = self.call("construct", lambda: solution.ModelNew().to(self.device).eval())
        self.check_untampered("after loading and constructing ModelNew")
        return {"device": device, "solution_inputs": own}, []

    def forward(self, seed: int, kind: str, shape: list[int]) -> tuple[dict, list]:
        """One forward without autograd on the inputs of (``seed``, ``kind``); the output goes back
        if it has the reference's ``shape`` (else only its type, shape and dtype)."""
        inputs = self.inputs(seed, kind)
        copies = [x.clone() for x in inputs]
        with torch.no_grad():
            got = self.call("forward", self.model, *inputs)
        header = {"changed": changed(self.names, copies, inputs), **_output_header(got)}
        return header, [got.detach()] if header.get("shape") == shape else []

    def backward(self, seed: int, kind: str, grad_loss: float) -> tuple[dict, list]:
        """Forward with autograd on the first input, then ``backward(grad_loss)``: the loss and the
        gradient, or ``supported: False`` and why there is none."""
        inputs = self.inputs(seed, kind)
        copies = [x.clone() for x in inputs]
        predictions = inputs[0].detach().clone().requires_grad_(True)
        loss = self.call("backward", self.model, predictions, *inputs[1:])
        header = {"changed": changed(self.names, copies, (predictions.detach(), *inputs[1:]))}
        if not (isinstance(loss, torch.Tensor) and loss.requires_grad):
            return {**header, "supported": False, "why": "the output does not require grad"}, []
        try:
            self.call("backward", lambda: loss.backward(torch.full_like(loss, grad_loss)))
        except Stop as stop:
            if stop.status != "raised":
                raise
            return {**header, "supported": False, "why": f"loss.backward() raised: {stop.message}"}, []
        header["changed"] = changed(self.names, copies, (predictions.detach(), *inputs[1:]))
        if predictions.grad is None:
            return {**header, "supported": False, "why": "no gradient reaches the first input"}, []
        return {**header, "supported": True}, [loss.detach(), predictions.grad]

    def repeat(self, seed: int, kind: str) -> tuple[dict, list]:
        """Three forwards on the same inputs (the parent compares them bitwise)."""
        inputs = self.inputs(seed, kind)
        with torch.no_grad():
            runs = [self.call("forward", lambda: self.model(*inputs)) for _ in range(3)]
        if not all(isinstance(r, torch.Tensor) for r in runs):
            return {"tensors_returned": False}, []
        return {"tensors_returned": True}, [r.detach().clone() for r in runs]

    def memory(self, seed: int, kind: str) -> tuple[dict, list]:
        inputs = self.inputs(seed, kind)
        with torch.no_grad():
            return {"bytes": self.call("memory", peak_extra_memory, lambda: self.model(*inputs))}, []

    def tampered(self, when: str) -> tuple[dict, list]:
        self.check_untampered(when)
        return {}, []

    def setup(self, flush_bytes: int) -> tuple[dict, list]:
        """The L2 flush buffer, and the host-clock cost of an empty timed call here."""
        self.flush = torch.empty(flush_bytes // 4, device=self.device)
        return {"overhead_ms": sync_overhead_ms(self.flush)}, []

    def warmup(self, seed: int, kind: str) -> tuple[dict, list]:
        """Calls on one set of inputs for at least WARMUP_MS and 3 calls (as Triton's do_bench)."""
        inputs = self.inputs(seed, kind)
        began, calls = perf_counter(), 0
        with torch.no_grad():
            while calls < 3 or (perf_counter() - began) * 1e3 < WARMUP_MS:
                self.call("timing", self.model, *inputs)
                calls += 1
        return {"calls": calls}, []

    def prepare(self, seed: int | None, kind: str = "random") -> tuple[dict, list]:
        """Make the next timed call's inputs (None: time an empty call), outside any timing."""
        self.prepared = None if seed is None else self.inputs(seed, kind)
        if self.device == "cuda":  # made before the parent's clock starts
            synchronize()
        return {}, []

    def go(self, shape: list[int], calls: int = 0) -> tuple[dict, list]:
        """The timed call on the prepared inputs (:func:`timed_call`), then ``calls`` back-to-back
        calls on them (:func:`back_to_back`); the timed call's output goes back. Without prepared
        inputs, the same with an empty forward: the parent's clock around this command, less
        that around the empty one, is ``calls + 1`` calls of the answer."""
        # the empty call returns a 0-d tensor too: its reply costs the parent's clock what a loss's does
        forward, inputs = (self.model, self.prepared) if self.prepared is not None else (lambda: self.flush[0], ())
        with torch.no_grad():
            event_ms, wall_ms, output = self.call("timing", timed_call, forward, inputs, self.flush)
            header = {"event_ms": event_ms, "wall_ms": wall_ms, **_output_header(output)}
            # copied as the timed call left it: a write after it returns (late_write.py) is not seen
            sent = [output.detach().to("cpu", copy=True)] if header.get("shape") == shape else []
            self.call("timing", back_to_back, forward, inputs, int(calls))
        return header, sent


def _output_header(value: object) -> dict:
    if not isinstance(value, torch.Tensor):
        return {"type": type(value).__name__}
    return {"type": "Tensor", "shape": list(value.shape), "dtype": str(value.dtype).removeprefix("torch.")}


COMMANDS = ("forward", "backward", "repeat", "memory", "tampered", "setup", "warmup", "prepare", "go")


def serve(config: dict, commands: int) -> None:
    """Answer the parent's commands on descriptor ``commands`` (standard input) until it says
    "exit" or closes the pipe. The first command, ``{"op": "start", "replies": FD}``, names the reply pipe and loads
    the solution; every reply is ``{"op": "reply", ...}`` or, at the first failure,
    ``{"op": "failed", "status", "message", "detail"}`` (the last one)."""
    session = Session(config)
    first = receive_command(commands)
    if not first or first.get("op") != "start":
        return
    replies = int(first["replies"])
    try:
        if session.device == "cuda" and not torch.cuda.is_available():
            raise Stop("no_gpu", "no CUDA GPU visible to the evaluating process")
        header, tensors = session.load()
        send(replies, {**header, "op": "reply"}, tensors)
        while (command := receive_command(commands)) is not None and command.get("op") in COMMANDS:
            fields = {k: v for k, v in command.items() if k != "op"}
            header, tensors = getattr(session, command["op"])(**fields)
            send(replies, {**header, "op": "reply"}, tensors)
    except Stop as stop:
        send(replies, {"op": "failed", "status": stop.status, "message": stop.message, "detail": stop.detail})
    except Exception as err:  # noqa: BLE001 - outside the solution's calls: the evaluator's own failure
        text = "".join(traceback.format_exception(err))
        status = "crashed" if is_cuda_error(err) else "evaluator_error"  # a CUDA error is the solution's, late
        send(replies, {"op": "failed", "status": status, "detail": text[-8000:],
                       "message": f"{type(err).__name__} in the evaluator's child: "
                                  f"{str(err).splitlines()[0][:300] if str(err) else ''}"})


def main(argv: list[str]) -> int:
    """Run as ``python -m losslab.kernelbench.child CONFIG.json``, only by the parent (through
    ``supervisor``), in a temporary working directory with its own TORCH_EXTENSIONS_DIR."""
    config = json.loads(Path(argv[0]).read_text())
    serve(config, 0)
    sys.stdout.flush()
    # Leave without running the solution's atexit hooks or destructors: the parent has its replies.
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
