"""The parent's side of one evaluation: runs the child (``child``) through each stage, under the
supervisor, and checks every reply against its own inputs, references and clock.

The parent holds the verdict: it draws every seed, makes its own copy of every input and
computes every reference and comparison (:class:`Plan`); the child only runs the solution and
hands back what came out (:func:`run_child`). ``evaluate`` checks the arguments and settles
the verdict from what this module found.
"""
from __future__ import annotations

import json
import math
import os
import secrets
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch

from losslab import problems
from losslab.kernelbench import supervisor
from losslab.kernelbench.channel import ChannelClosed, ChannelError, ChannelTimeout, receive, send_command
from losslab.kernelbench.child import Reference, bitwise_equal
from losslab.kernelbench.clocks import summarize, sync_overhead_ms, time_forward
from losslab.kernelbench.failures import Stop
from losslab.kernelbench.inputs import KINDS
from losslab.kernelbench.inputs import make as draw
from losslab.kernelbench.verdict import back_to_back_calls, compare, condition_number, parent_clock
from losslab.measure.check import GRAD_LOSS, TOLERANCES, relative_error, rounding_allowance
from losslab.measure.timing import FLUSH_BYTES, peak_extra_memory

CHILD_STATUSES = ("compile_error", "raised", "crashed", "tampered", "evaluator_error", "no_gpu")  # it may report
EXIT_PATIENCE_S = 5.0  # for a child told to exit (or dead) to end by itself before it is killed


def child_env(build_dir: Path) -> dict[str, str]:
    """The child's environment: the caller's, with its own build cache and losslab importable."""
    env = dict(os.environ)
    env["TORCH_EXTENSIONS_DIR"] = str(build_dir)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                         *filter(None, [os.environ.get("PYTHONPATH")])])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if "CUDA_HOME" not in env:  # torch guesses wrong next to an nvcc wrapper script
        try:
            from losslab.build import find_cuda_home

            env["CUDA_HOME"] = str(find_cuda_home())
        except Exception:  # noqa: BLE001 - no toolkit: the solution's build says so itself
            pass
    return env


# --- the parent's side of the protocol -------------------------------------------------------------

@dataclass
class Plan:
    """What to evaluate, and the parent's own inputs and references."""

    problem: problems.Problem
    shape: tuple[int, int]
    dtype: torch.dtype
    device: str
    trials: int
    repeats: int
    seed: int | None
    compare_compile: bool
    timed: bool = True  # False: stop after the checks (no memory, no timing)

    @property
    def terms(self) -> int:
        return math.prod(self.shape)

    def seed_for(self, index: int) -> int:
        """``seed + index`` when a seed was given (replayable), else a fresh secret one."""
        return self.seed + index if self.seed is not None else secrets.randbelow(2**31)

    def inputs(self, seed: int, kind: str = "random") -> tuple:
        return draw(self.problem, self.shape, seed, kind, self.device, self.dtype)

    def references(self, inputs: tuple) -> tuple[torch.Tensor, torch.Tensor, float]:
        """(eager in the inputs' dtype, the loss in float64, the loss's condition number at these
        inputs (``verdict.condition_number``)), from the parent's own inputs and float64 copies."""
        with torch.no_grad():
            eager = self.problem.reference(*inputs)
            upcast = [x.double() if x.is_floating_point() else x for x in inputs]
            loss64 = self.problem.reference(*upcast)
            condition = condition_number(self.problem, tuple(upcast))
            del upcast
        if self.device == "cuda":  # done before the child's next call: none of it overlaps a timed call
            torch.cuda.synchronize()
        return eager, loss64, condition

    def differentiable(self) -> bool:
        """Whether the reference has a gradient w.r.t. its first input."""
        tiny = self.problem.make_inputs((2, 8), seed=0, device="cpu")
        return self.problem.reference(tiny[0].clone().requires_grad_(True), *tiny[1:]).requires_grad


class ChildGone(Exception):
    """The child closed its end of the channel: it exited or died."""


class ChildTimedOut(Exception):
    """No reply before the evaluation's deadline."""


class Child:
    """The running child, seen from the parent: one command, one reply, before the deadline."""

    def __init__(self, supervised: supervisor.Supervised, deadline: float, limit: int):
        self.supervised, self.deadline, self.limit = supervised, deadline, limit
        self.stage = "load"

    def ask(self, stage: str, op: str, **fields) -> tuple[dict, list[torch.Tensor]]:
        """Send one command; return the reply (header, tensors on the host).

        Raises:
            Stop: the child reported a failure, or replied with something it never writes (tampered).
            ChildGone, ChildTimedOut: no reply.
        """
        self.stage = stage
        try:
            send_command(self.supervised.commands, {"op": op, **fields})
            header, tensors = receive(self.supervised.replies, self.deadline, self.limit)
        except (BrokenPipeError, ChannelClosed) as err:
            raise ChildGone(str(err)) from None
        except ChannelTimeout as err:
            raise ChildTimedOut(str(err)) from None
        except ChannelError as err:
            raise Stop("tampered", f"in stage {stage!r} the reply was not one the evaluator's child writes ({err}): "
                       "something in the solution's process wrote into the evaluator's channel") from None
        if header.get("op") == "failed" and header.get("status") in CHILD_STATUSES:
            raise Stop(header["status"], str(header.get("message", ""))[:2000], str(header.get("detail", ""))[-8000:])
        if header.get("op") != "reply":
            raise Stop("tampered", f"in stage {stage!r} the child replied {str(header)[:200]}, which it never "
                       "writes: something in the solution's process wrote into the evaluator's channel")
        return header, tensors


def _field(header: dict, name: str, kind: type | tuple[type, ...]):
    """``header[name]`` if it is a ``kind``; anything else was not written by the child's code."""
    value = header.get(name)
    if not isinstance(value, kind) or (kind in (float, (int, float)) and isinstance(value, bool)):
        raise Stop("tampered", f"the child's reply has {name} = {str(value)[:80]}, which it never writes: something "
                   "in the solution's process wrote into the evaluator's channel")
    return value


def _unchanged(header: dict, where: str) -> None:
    names = _field(header, "changed", list)
    if names:
        raise Stop("mutated_inputs", f"{where}: forward changed its input(s) {', '.join(map(str, names))} in place "
                   "(a copy taken before the call differs bitwise from the input after it)")


def _output(header: dict, tensors: list, expected: torch.Tensor, where: str) -> torch.Tensor:
    """The one output tensor of a reply, of ``expected``'s shape (else ``wrong_shape``)."""
    if header.get("type") != "Tensor":
        raise Stop("wrong_shape", f"{where}: forward returned {str(header.get('type'))[:40]}, expected a tensor of "
                   f"shape {tuple(expected.shape)}")
    shape = _field(header, "shape", list)
    if shape != list(expected.shape):
        raise Stop("wrong_shape", f"{where}: output shape {tuple(shape)}, reference {tuple(expected.shape)}")
    if len(tensors) != 1 or list(tensors[0].shape) != shape:
        raise Stop("tampered", f"{where}: the reply does not hold the output it describes")
    return tensors[0].to(expected.device)


def _correctness(child: Child, plan: Plan, result: dict) -> None:
    result["trials"] = trials = []
    for trial in range(plan.trials):
        seed = plan.seed_for(trial)
        for kind in KINDS:
            where = f"trial {trial} ({kind} inputs, seed {seed})"
            eager, loss64, condition = plan.references(plan.inputs(seed, kind))
            header, tensors = child.ask("correctness", "forward", seed=seed, kind=kind, shape=list(eager.shape))
            record = {"trial": trial, "kind": kind, "seed": seed}
            trials.append(record)
            _unchanged(header, where)
            got = _output(header, tensors, eager, where)
            record.update(shape=list(got.shape), dtype=str(got.dtype).removeprefix("torch."),
                          **compare(got, eager, loss64, plan.terms, condition))
            if not record["passed"]:
                raise Stop("wrong_values", f"{where}: got {record['value']:.8g}, float64 reference "
                           f"{record['reference']:.8g}; relative error {record['rel_error_fp64']:.3g} exceeds "
                           f"{record['tolerance']:.2g}, what an honest {str(plan.dtype).removeprefix('torch.')} "
                           f"kernel reaches over {plan.terms:.3g} terms at condition number {condition:.3g} "
                           f"{record['detail']}".rstrip())


def _backward(child: Child, plan: Plan, result: dict) -> None:
    """The gradient w.r.t. the first input on both kinds of inputs, against float64."""
    seed = plan.seed_for(plan.trials)
    worst: dict = {}
    for kind in KINDS:
        where = f"backward ({kind} inputs, seed {seed})"
        header, tensors = child.ask("backward", "backward", seed=seed, kind=kind, grad_loss=GRAD_LOSS)
        _unchanged(header, where)
        if not _field(header, "supported", bool):
            result["backward"] = {"supported": False, "why": str(header.get("why", ""))[:300]}
            return
        inputs = plan.inputs(seed, kind)
        if len(tensors) != 2 or tensors[1].shape != inputs[0].shape:
            raise Stop("tampered", f"{where}: the reply does not hold a loss and a gradient of the input's shape")
        eager, loss64, condition = plan.references(inputs)
        if tensors[0].shape != eager.shape:
            raise Stop("wrong_shape", f"{where}: with autograd, output shape {tuple(tensors[0].shape)}, reference "
                       f"{tuple(eager.shape)}")
        loss = compare(tensors[0], eager, loss64, plan.terms, condition)
        if not loss["passed"]:  # a training step would see this loss, not the one checked without autograd
            raise Stop("wrong_values", f"{where}: the loss computed with autograd, {loss['value']:.8g}, is off the "
                       f"float64 reference {loss['reference']:.8g} by {loss['rel_error_fp64']:.3g} (relative; "
                       f"at most {loss['tolerance']:.2g})")
        _, grad64 = plan.problem.reference_float64(*inputs)
        # exp(x) has condition number |x|: rounding the logits to the dtype moves an honest kernel's
        # softmax-based gradient by about u·max|x| (structured inputs reach |x| of 70)
        tolerance = TOLERANCES[plan.dtype][1] * max(1.0, float(inputs[0].abs().max()))
        if plan.dtype != torch.float32:  # 16-bit: the best a gradient in that dtype can do, rounded once or twice
            tolerance += rounding_allowance(loss64, grad64 * GRAD_LOSS, plan.dtype)[1]
        error, found = relative_error(tensors[1].to(plan.device), grad64 * GRAD_LOSS)
        if error >= worst.get("rel_error", -1.0):
            worst = {"supported": True, "kind": kind, "seed": seed, "rel_error": error, "tolerance": tolerance,
                     "passed": error <= tolerance and not found, "detail": found}
        result["backward"] = worst
        if error > tolerance or found:
            raise Stop("wrong_values", f"{where}: gradient relative error {error:.3g} against float64 exceeds "
                       f"{tolerance:g} {found}".strip())


def _repeatability(child: Child, plan: Plan, result: dict) -> None:
    header, tensors = child.ask("repeatability", "repeat", seed=plan.seed_for(0), kind="random")
    result["repeatable"] = len(tensors) == 3 and all(bitwise_equal(tensors[0], t) for t in tensors[1:])


def _clocked(child: Child, seed: int | None, shape: list[int], calls: int) -> tuple[float, dict, list]:
    """One timed command in the child on the parent's clock: the timed call and ``calls``
    back-to-back calls on the inputs of ``seed`` (None: an empty forward), made before the
    clock starts."""
    child.ask("timing", "prepare", seed=seed)
    began = time.perf_counter()
    header, tensors = child.ask("timing", "go", shape=shape, calls=calls)
    return (time.perf_counter() - began) * 1e3, header, tensors


def _timing(child: Child, plan: Plan, result: dict) -> list[int]:
    """The solution's timed calls, each on fresh secret inputs; returns their seeds.

    The child reports each call's time (``summarize``); the parent checks it against its own
    clock (``verdict.parent_clock``): each timed command also makes ``calls`` back-to-back
    synchronised calls of the answer, and is followed by the same command with an empty
    forward, which the parent brackets too: both hold the same fixed costs, measured at the
    same point of the run (the H100 run's empty calls, made once before the warm-up, lacked
    0.1 to 0.45 ms of them). ``calls`` follows from the parent's clock around the warm-up.
    """
    header, _ = child.ask("timing", "setup", flush_bytes=FLUSH_BYTES)
    timing = result["timing"] = {"repeats": plan.repeats, "overhead_ms": _field(header, "overhead_ms", (int, float))}
    began = time.perf_counter()
    header, _ = child.ask("timing", "warmup", seed=secrets.randbelow(2**31), kind="random")
    calls = back_to_back_calls((time.perf_counter() - began) * 1e3, _field(header, "calls", int))
    seeds = [secrets.randbelow(2**31) for _ in range(plan.repeats)]  # never predictable, even with `seed`
    times: dict = {"event_ms": [], "wall_ms": []}
    answer_ms, empty_ms = [], []
    for i, seed in enumerate(seeds):
        eager, loss64, condition = plan.references(plan.inputs(seed))
        ms, header, tensors = _clocked(child, seed, list(eager.shape), calls)
        got = tensors[0].to(plan.device) if header.get("shape") == list(eager.shape) and len(tensors) == 1 else None
        if got is None or not compare(got, eager, loss64, plan.terms, condition)["passed"]:
            raise Stop("wrong_values", f"timed call {i} (seed {seed}): the output does not match the reference on "
                       "that call's inputs; was a result cached from earlier inputs, or written after forward "
                       "returned?")
        answer_ms.append(ms)
        empty_ms.append(_clocked(child, None, [], calls)[0])
        for key in times:
            times[key].append(_field(header, key, (int, float)))
    timing.update({f"solution_{key}": value for key, value in summarize(times, timing["overhead_ms"]).items()})
    timing.update(parent_clock(answer_ms, empty_ms, calls))
    return seeds


def _judge(child: Child, plan: Plan, result: dict, replies_fd: int) -> list[int]:
    """The child's stages in order (the first failure raises Stop); returns the timed seeds."""
    header, _ = child.ask("load", "start", replies=replies_fd)
    result["device"] = str(header.get("device", ""))[:200]
    result["solution_inputs"] = _field(header, "solution_inputs", dict)
    _correctness(child, plan, result)
    if plan.differentiable():
        _backward(child, plan, result)
    _repeatability(child, plan, result)
    child.ask("repeatability", "tampered", when="after the correctness checks")
    if plan.device != "cuda" or not plan.timed:  # the CPU dry run, and a correctness pass, measure nothing
        return []
    header, _ = child.ask("memory", "memory", seed=plan.seed_for(0), kind="random")
    result["memory"] = {"solution_bytes": _field(header, "bytes", int)}
    seeds = _timing(child, plan, result)
    child.ask("timing", "tampered", when="while it was timed")
    return seeds


def time_peers(plan: Plan, result: dict, seeds: list[int]) -> None:
    """Eager and torch.compile timed here, on the solution's inputs, once the child is gone."""
    timing = result["timing"]
    flush = torch.empty(FLUSH_BYTES // 4, device="cuda")
    overhead_ms = sync_overhead_ms(flush)
    reference = Reference(plan.problem).to("cuda").eval()
    with torch.no_grad():
        peers = {"eager": time_forward(reference, plan.inputs, seeds, flush)}
        if plan.compare_compile:
            try:
                peers["compile"] = time_forward(torch.compile(reference), plan.inputs, seeds, flush)
            except Exception as err:  # noqa: BLE001 - a peer failing is reported, not fatal
                timing["compile_error"] = f"{type(err).__name__}: {err}"[:300]
        inputs = plan.inputs(seeds[0])
        result["memory"]["eager_bytes"] = peak_extra_memory(lambda: reference(*inputs))
    for name, measured in peers.items():
        timing.update({f"{name}_{key}": value for key, value in summarize(measured, overhead_ms).items()})
        timing[f"speedup_{name}"] = timing[f"{name}_ms"] / timing["solution_ms"]


def evaluator_error(result: dict, err: BaseException, where: str) -> None:
    first = str(err).splitlines()[0][:300] if str(err) else ""
    result.update(status="evaluator_error", detail="".join(traceback.format_exception(err))[-8000:],
                  message=f"{type(err).__name__} in the evaluator {where}: {first}")


def run_child(plan: Plan, solution: Path, work: Path, build_dir: Path, timeout_s: float
              ) -> tuple[dict, str, int | None, list[int]]:
    """Run the child on ``solution`` in ``work`` through every stage; returns (the result so far,
    the child's stderr, its exit code (None: killed at ``timeout_s``), the timed seeds). The child
    and every process it started are gone when this returns (``result["processes"]`` says how)."""
    started = time.monotonic()
    config = dict(solution=str(solution), problem=plan.problem.name, shape=list(plan.shape),
                  dtype=str(plan.dtype).removeprefix("torch."), device=plan.device)
    (work / "config.json").write_text(json.dumps(config))
    result: dict = {"status": "running", "stage": "load", "message": "", "detail": ""}
    supervised = supervisor.start([sys.executable, "-m", "losslab.kernelbench.child", str(work / "config.json")],
                                  cwd=work, env=child_env(build_dir), stdout=work / "stdout.txt",
                                  stderr=work / "stderr.txt")
    child = Child(supervised, started + timeout_s, limit=3 * plan.terms * 8 + 2**20)
    seeds, timed_out, patience = [], False, EXIT_PATIENCE_S
    try:
        seeds = _judge(child, plan, result, supervised.child_fd)
        result["stage"] = "peers"
    except Stop as stop:
        result.update(status=stop.status, message=stop.message, detail=stop.detail)
    except ChildGone:
        pass  # result["status"] stays "running": conclude() says how it ended
    except ChildTimedOut:
        timed_out, patience = True, 0.0
    except Exception as err:  # noqa: BLE001 - the parent's own failure
        evaluator_error(result, err, f"at stage {child.stage!r}")
    finally:
        if result["stage"] != "peers":
            result["stage"] = child.stage
        try:
            send_command(supervised.commands, {"op": "exit"})
        except OSError:
            pass
        report = supervised.stop(patience)
    result["processes"] = {key: report.get(key) for key in ("contained", "how", "survivors")}
    stderr = (work / "stderr.txt").read_bytes().decode(errors="replace")
    returncode = report.get("returncode")
    if timed_out:
        returncode = None
    elif returncode is None:  # it closed its channel and was killed
        returncode = -signal.SIGKILL
    return result, stderr, returncode, seeds
