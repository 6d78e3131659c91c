"""The child process of ``losslab.kernelbench.evaluate``: runs one solution file and measures it.

    python -m losslab.kernelbench.child CONFIG.json

Run only by ``evaluate.evaluate``, in a temporary working directory with its own
TORCH_EXTENSIONS_DIR. THIS PROCESS RUNS THE SOLUTION'S CODE. It writes its findings to
``config["result"]`` as JSON after every stage, so that the parent knows how far it got if
the solution hangs or kills the process. The child decides what needs the solution's objects
(build, correctness, gradient, repeatability, tampering); the parent judges the measured
times (``verdict.judge_timing``).

Defences against a solution that games the measurement:

- the clocks, events and synchronisation the timing uses are bound when this module is
  imported, before any solution code runs, so patching ``torch.cuda.Event``,
  ``time.perf_counter`` and the like changes no measurement; a replaced function of torch,
  time, the problem or this module is reported as ``tampered`` (:func:`replaced`);
- every timed call gets fresh inputs, made outside the timed region, and its output is
  checked against the reference afterwards: a cached answer is ``wrong_values``, and a cache
  keyed on the input objects never hits;
- every timed call is measured twice: CUDA events on the caller's stream, and the host clock
  around the call and a device-wide synchronisation. The device-wide time is the one judged;
  work left running on another stream shows as the difference (``hidden_work``).
"""
from __future__ import annotations

import contextlib
import importlib.util
import inspect
import json
import os
import re
import statistics
import sys
import tempfile
import time
import traceback
import types
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn as nn

from losslab import problems
from losslab.measure import check
from losslab.measure.check import GRAD_LOSS, TOLERANCES, relative_error
from losslab.measure.timing import peak_extra_memory

# Bound before any solution code runs: a solution that patches these later cannot change a measurement.
_perf_counter = time.perf_counter
_synchronize = torch.cuda.synchronize
_Event = torch.cuda.Event
_record = torch.cuda.Event.record
_elapsed_time = torch.cuda.Event.elapsed_time

# KernelBench's torch.allclose tolerances (atol = rtol) per output dtype
ALLCLOSE_TOL = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 1e-2}
BUILD_FAILURE_SIGNS = ("Error building extension", "undefined symbol")
WARMUP_MS = 50.0  # warm-up calls run at least this long (and at least 3), as Triton's do_bench does
TIMING_SEED_OFFSET = 1000  # timed calls use seeds the trials never use
# a compiler's diagnostic: nvcc "file.cu(12): error: ...", gcc/clang "file.cpp:12:5: error: ..."
_DIAGNOSTIC = re.compile(r"(\(\d+\)|:\d+(:\d+)?):\s*(fatal )?error\b")
_BUILD_NOISE = re.compile(r"^(\[\d+/\d+\] |FAILED: |ninja: )|-DTORCH_EXTENSION_NAME=")


class Stop(Exception):
    """Ends the evaluation with ``status`` and ``message`` (and optional ``detail``)."""

    def __init__(self, status: str, message: str, detail: str = ""):
        super().__init__(message)
        self.status, self.message, self.detail = status, message, detail


# --- what the solution printed, and what a failure means -------------------------------------------

class Captured:
    """Text written to file descriptor 1 inside :func:`capture_stdout` (filled when the block ends)."""

    text: str = ""


@contextlib.contextmanager
def capture_stdout(into: Captured):
    """Send file descriptor 1 to a temporary file while the block runs, then copy it into
    ``into.text`` and on to the real stdout.

    ``load_inline(..., verbose=True)`` runs ninja with its output on descriptor 1 and raises
    only "Error building extension 'name'": the compiler's message is in what this captures.
    Descriptor 2 is left alone, so that a crash's last words still reach the parent.
    """
    sys.stdout.flush()
    saved = os.dup(1)
    with tempfile.TemporaryFile() as log:
        os.dup2(log.fileno(), 1)
        try:
            yield into
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)
            log.seek(0)
            data = log.read()
            into.text = data.decode(errors="replace")
            if data:
                os.write(1, data)


def compiler_error(text: str, solution: str = "") -> tuple[str, str]:
    """The first compiler error in a build's output, and the output without ninja's command lines.

    Returns (message, detail): message is the first diagnostic ("cuda.cu(6): error: expected a
    \";\"") with the source line nvcc or gcc prints under it, paths shortened to the file name,
    and where that line occurs once in ``solution`` (the solution file's text), its line number
    there (load_inline's cuda.cu and main.cpp number lines their own way); detail is the build
    output with the long compiler command lines dropped (at most 8000 chars).
    """
    lines = [re.sub(r"\S*/(?=[^/\s]+(\(\d+\)|:\d+))", "", line) for line in text.splitlines()
             if not _BUILD_NOISE.search(line)]
    lines = [re.sub(r"^(Error building extension '[^']*'):.*$", r"\1", line) for line in lines]
    at = next((i for i, line in enumerate(lines) if _DIAGNOSTIC.search(line)), None)
    if at is None:
        at = next((i for i, line in enumerate(lines) if re.search(r"\berror\b|undefined symbol", line, re.I)
                   and not line.startswith("Error building extension")), None)
    if at is None:
        first = next((line for line in lines if line.strip()), "the build failed with no compiler message")
        return first.strip()[:300], "\n".join(lines)[:8000]
    message = lines[at].strip()
    source = next((line.strip() for line in lines[at + 1:at + 2] if line.strip() and "error" not in line), "")
    source = re.sub(r"^\d+ \| ", "", source)  # gcc's "  4 | code"
    if source:
        found = [n for n, line in enumerate(solution.splitlines(), 1) if line.strip() == source]
        message += f" (at: {source})" + (f" [line {found[0]} of the solution file]" if len(found) == 1 else "")
    return message[:400], "\n".join(lines)[:8000]


def is_cuda_error(err: BaseException) -> bool:
    return isinstance(err, getattr(torch, "AcceleratorError", ())) or "CUDA error" in str(err)


def failure(stage: str, err: BaseException, output: str = "", solution: str = "") -> Stop:
    """What an exception raised by the solution's code means for the verdict; ``output`` is what
    it printed meanwhile (a verbose build's compiler output), ``solution`` the file's text."""
    text = "".join(traceback.format_exception(err))
    first = str(err).splitlines()[0][:300] if str(err) else ""
    if any(sign in str(err) for sign in BUILD_FAILURE_SIGNS):
        message, detail = compiler_error(f"{output}\n{err}", solution)
        return Stop("compile_error", message, detail)
    if is_cuda_error(err):
        return Stop("crashed", f"a CUDA error in {stage}: {first}", text[-8000:])
    return Stop("raised", f"{type(err).__name__} in {stage}: {first}", text[-8000:])


# --- tampering ---------------------------------------------------------------------------------------

def watched(spec: problems.Problem) -> dict[str, tuple[bool, dict[str, object]]]:
    """Every function and class that the reference, the checks and the timing look up at call time,
    as {namespace: (is_module, {name: object})}: the namespaces of time, torch, torch.cuda and
    torch.nn.functional, the problem's module and this module; the attributes (inherited ones
    included) of Tensor, Module, Event, Stream and the problem object."""
    spaces = {"time": time, "torch": torch, "torch.cuda": torch.cuda, "torch.nn.functional": torch.nn.functional,
              "torch.Tensor": torch.Tensor, "torch.nn.Module": nn.Module, "torch.cuda.Event": torch.cuda.Event,
              "torch.cuda.Stream": torch.cuda.Stream, "losslab.problems": problems, "losslab.measure.check": check,
              "problem": spec, type(spec).__module__: sys.modules[type(spec).__module__],
              "losslab.kernelbench.child": sys.modules[__name__]}
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


# --- timing ------------------------------------------------------------------------------------------

def timed_call(forward: Callable, inputs: tuple, flush: torch.Tensor) -> tuple[float, float, object]:
    """One call of ``forward(*inputs)`` with L2 flushed and the device idle before it.

    Returns (event_ms, wall_ms, output): CUDA events on the caller's stream around the call, and
    the host clock around the call plus a device-wide synchronisation (which waits for every
    stream). Both clocks were bound before the solution loaded.
    """
    flush.zero_()  # evicts the inputs from L2
    _synchronize()
    start, end = _Event(enable_timing=True), _Event(enable_timing=True)
    began = _perf_counter()
    _record(start)
    output = forward(*inputs)
    _record(end)
    _synchronize()
    wall_ms = (_perf_counter() - began) * 1e3
    return _elapsed_time(start, end), wall_ms, output


def time_forward(forward: Callable, make_inputs: Callable[[int], tuple], seeds: list[int], flush: torch.Tensor,
                 reference: Callable | None = None) -> dict:
    """Time ``forward`` once per seed, each call on fresh inputs ``make_inputs(seed)`` made untimed.

    After warm-up calls (at least WARMUP_MS and 3 calls, on the first seed's inputs), each timed
    call runs through :func:`timed_call`. Returns {"event_ms": [...], "wall_ms": [...],
    "mismatched": [indices of timed calls whose output differs from ``reference`` on the same
    inputs, beyond ALLCLOSE_TOL]} (no check without ``reference``).
    """
    inputs = make_inputs(seeds[0])
    began, calls = _perf_counter(), 0
    while calls < 3 or (_perf_counter() - began) * 1e3 < WARMUP_MS:
        forward(*inputs)
        calls += 1
    _synchronize()
    times: dict = {"event_ms": [], "wall_ms": [], "mismatched": []}
    pairs = []
    for seed in seeds:
        inputs = make_inputs(seed)
        expected = reference(*inputs) if reference else None
        event_ms, wall_ms, output = timed_call(forward, inputs, flush)
        times["event_ms"].append(event_ms)
        times["wall_ms"].append(wall_ms)
        if reference:  # a copy: a solution may rightly write every answer into one buffer
            pairs.append((output.detach().clone() if isinstance(output, torch.Tensor) else output, expected))
    if reference:
        times["mismatched"] = [i for i, (got, want) in enumerate(pairs) if not matches(got, want)]
    return times


def sync_overhead_ms(flush: torch.Tensor, calls: int = 20) -> float:
    """Median host-clock cost of an empty timed call: what the wall clock adds to any call."""
    small = flush[:1]
    return statistics.median(timed_call(lambda: None, (), small)[1] for _ in range(calls))


def summarize(times: dict, overhead_ms: float) -> dict:
    """Medians and p10/p90 (ms) of one implementation's timed calls. Each call's judged time is the
    larger of its event time and its wall time less ``overhead_ms``: the device-wide time."""
    judged = sorted(max(e, w - overhead_ms) for e, w in zip(times["event_ms"], times["wall_ms"], strict=True))
    quantile = lambda q: judged[min(len(judged) - 1, round(q * (len(judged) - 1)))]  # noqa: E731
    return {"ms": statistics.median(judged), "p10_ms": quantile(0.1), "p90_ms": quantile(0.9),
            "event_ms": statistics.median(times["event_ms"]), "wall_ms": statistics.median(times["wall_ms"])}


# --- comparisons and serialisation -------------------------------------------------------------------

def matches(got: object, expected: torch.Tensor) -> bool:
    """``got`` is a tensor of ``expected``'s shape, allclose at KernelBench's tolerance for its dtype."""
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
        return False
    tol = ALLCLOSE_TOL.get(expected.dtype, 1e-4)
    return bool(torch.allclose(got.detach().to(expected.dtype), expected, atol=tol, rtol=tol))


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape, dtype and bytes; any dtype (bfloat16 included) on any device."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    as_bytes = lambda x: x.detach().contiguous().reshape(-1).view(torch.uint8)  # noqa: E731
    return bool(torch.equal(as_bytes(a), as_bytes(b)))


def jsonable(value: object) -> object:
    """``value`` with tensors, dtypes, tuples and paths made JSON-friendly (a tensor of any dtype
    becomes a float or a nested list of floats)."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        return value.double().tolist() if value.is_floating_point() else value.tolist()
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value).removeprefix("torch.")


def write_json(path: Path, result: dict) -> None:
    """Write ``result`` atomically (a reader never sees half a file)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(jsonable(result)))
    os.replace(tmp, path)


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


# --- the protocol ------------------------------------------------------------------------------------

class Session:
    """One evaluation: the config, the result so far, and one method per stage."""

    def __init__(self, config: dict):
        self.config = config
        self.device = config.get("device", "cuda")
        self.spec = problems.get(config["problem"])
        self.shape = tuple(config["shape"])
        self.dtype = getattr(torch, config["dtype"])
        self.result: dict = {"status": "running", "stage": "start", "message": "", "detail": ""}
        self.before: dict[str, object] = {}

    def save(self, stage: str | None = None) -> None:
        if stage:
            self.result["stage"] = stage
        write_json(Path(self.config["result"]), self.result)

    def inputs(self, seed: int) -> tuple:
        return self.spec.make_inputs(self.shape, seed=seed, device=self.device, dtype=self.dtype)

    def call(self, stage: str, fn: Callable, *args):
        """Run the solution's code ``fn(*args)`` (its output captured); its exceptions become a Stop."""
        output = Captured()
        try:
            with capture_stdout(output):
                value = fn(*args)
                if self.device == "cuda":
                    _synchronize()
            return value
        except Exception as err:  # noqa: BLE001 - the solution may raise anything
            raise failure(stage, err, output.text, Path(self.config["solution"]).read_text(errors="replace")) from err

    def check_untampered(self, when: str) -> None:
        names = replaced(self.before, self.spec)
        if names:
            shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
            raise Stop("tampered", f"{when}, the solution had replaced {shown}", "\n".join(names))

    def load(self) -> nn.Module:
        """Import the file (which may build its extension) and construct its ModelNew."""
        self.result["device"] = torch.cuda.get_device_name() if self.device == "cuda" else "cpu (no timing, no memory)"
        self.before = watched(self.spec)
        self.save("load")
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
        self.result["solution_inputs"] = own
        self.save("construct")
        return self.call("construct", lambda: solution.ModelNew().to(self.device).eval())

    def correctness(self, model: nn.Module, reference: nn.Module) -> None:
        """``trials`` forwards on fresh seeded inputs against the reference (shape, allclose, float64)."""
        self.save("correctness")
        tol = ALLCLOSE_TOL[self.dtype]
        self.result["trials"] = trials = []
        for trial in range(self.config["trials"]):
            seed = self.config["seed"] + trial
            inputs = self.inputs(seed)
            with torch.no_grad():
                expected = reference(*inputs)
                got = self.call("forward", model, *inputs)
            record = {"trial": trial, "seed": seed}
            trials.append(record)
            if not isinstance(got, torch.Tensor):
                raise Stop("wrong_shape", f"trial {trial}: forward returned {type(got).__name__}, expected a tensor "
                           f"of shape {tuple(expected.shape)}")
            record.update(shape=list(got.shape), dtype=str(got.dtype).removeprefix("torch."))
            if got.shape != expected.shape:
                raise Stop("wrong_shape", f"trial {trial}: output shape {tuple(got.shape)}, reference "
                           f"{tuple(expected.shape)}")
            loss64, _ = self.spec.reference_float64(*inputs)
            got_cmp = got.detach().to(expected.dtype)
            record.update(
                value=got_cmp.double().flatten()[:1].item(), reference=expected.double().flatten()[:1].item(),
                max_abs_diff=(got_cmp.double() - expected.double()).abs().max().item(),
                allclose=matches(got_cmp, expected), rel_error_fp64=relative_error(got_cmp, loss64)[0])
            self.save()
            if not record["allclose"]:
                raise Stop("wrong_values", f"trial {trial} (seed {seed}): got {record['value']:.8g}, reference "
                           f"{record['reference']:.8g}; |diff| {record['max_abs_diff']:.3g} exceeds "
                           f"atol + rtol * |reference| with atol = rtol = {tol:g}")

    def backward(self, model: nn.Module) -> None:
        """If the output carries autograd, its gradient w.r.t. the first input against float64."""
        self.save("backward")
        inputs = self.inputs(self.config["seed"] + self.config["trials"])
        predictions = inputs[0].detach().clone().requires_grad_(True)
        loss = self.call("backward", model, predictions, *inputs[1:])
        backward = {"supported": bool(isinstance(loss, torch.Tensor) and loss.requires_grad)}
        self.result["backward"] = backward
        if not backward["supported"]:
            return
        grad_loss = torch.tensor(GRAD_LOSS, device=self.device, dtype=loss.dtype)
        self.call("backward", lambda: loss.backward(grad_loss))
        _, grad64 = self.spec.reference_float64(*inputs)
        tolerance = TOLERANCES[self.dtype][1]
        if predictions.grad is None or predictions.grad.shape != predictions.shape:
            backward.update(passed=False, detail="no gradient of predictions' shape")
        else:
            error, found = relative_error(predictions.grad, grad64 * GRAD_LOSS)
            backward.update(rel_error=error, tolerance=tolerance, passed=error <= tolerance and not found,
                            detail=found)
        if not backward["passed"]:
            raise Stop("wrong_values", f"backward: gradient relative error {backward.get('rel_error', 'n/a')} "
                       f"against float64 exceeds {tolerance:g} {backward['detail']}".strip())

    def repeatability(self, model: nn.Module) -> None:
        self.save("repeatability")
        inputs = self.inputs(self.config["seed"])
        with torch.no_grad():
            runs = [self.call("forward", lambda: model(*inputs).detach().clone()) for _ in range(3)]
        self.result["repeatable"] = all(bitwise_equal(runs[0], r) for r in runs[1:])

    def memory(self, model: nn.Module, reference: nn.Module) -> None:
        self.save("memory")
        inputs = self.inputs(self.config["seed"])
        with torch.no_grad():
            self.result["memory"] = {
                "solution_bytes": self.call("memory", peak_extra_memory, lambda: model(*inputs)),
                "eager_bytes": peak_extra_memory(lambda: reference(*inputs))}

    def timing(self, model: nn.Module, reference: nn.Module) -> None:
        """The solution, eager and torch.compile, each on the same fresh inputs per timed call."""
        self.save("timing")
        seeds = [self.config["seed"] + TIMING_SEED_OFFSET + i for i in range(self.config["repeats"])]
        flush = torch.empty(self.config["flush_bytes"] // 4, device="cuda")
        timing: dict = {"repeats": self.config["repeats"], "overhead_ms": sync_overhead_ms(flush)}
        self.result["timing"] = timing
        with torch.no_grad():
            times = self.call("timing", time_forward, model, self.inputs, seeds, flush, reference)
            self.check_untampered("while it was timed")
            if times["mismatched"]:
                i = times["mismatched"][0]
                raise Stop("wrong_values", f"timed call {i} (seed {seeds[i]}): the output does not match the "
                           f"reference on that call's inputs ({len(times['mismatched'])} of {len(seeds)} timed "
                           "calls differ); was a result cached from earlier inputs?")
            peers = {"solution": times, "eager": time_forward(reference, self.inputs, seeds, flush)}
            if self.config["compile"]:
                try:
                    compiled = torch.compile(reference)
                    peers["compile"] = time_forward(compiled, self.inputs, seeds, flush)
                except Exception as err:  # noqa: BLE001 - a peer failing is reported, not fatal
                    timing["compile_error"] = f"{type(err).__name__}: {err}"[:300]
        for name, measured in peers.items():
            timing.update({f"{name}_{key}": value for key, value in summarize(measured, timing["overhead_ms"]).items()})
        for name in ("eager", "compile"):
            if f"{name}_ms" in timing:
                timing[f"speedup_{name}"] = timing[f"{name}_ms"] / timing["solution_ms"]


def run(config: dict) -> dict:
    """Every stage in order; the first failure ends the run. Returns (and writes) the result."""
    session = Session(config)
    try:
        if session.device == "cuda" and not torch.cuda.is_available():
            raise Stop("no_gpu", "no CUDA GPU visible to the evaluating process")
        model = session.load()
        session.check_untampered("after loading and constructing ModelNew")
        reference = Reference(session.spec).to(session.device).eval()
        session.correctness(model, reference)
        session.backward(model)
        session.repeatability(model)
        session.check_untampered("after the correctness checks")
        if session.device == "cuda":  # the CPU dry run (tests of the evaluator) measures nothing
            session.memory(model, reference)
            session.timing(model, reference)
        session.result["status"] = "passed"
        session.save("done")
    except Stop as stop:
        session.result.update(status=stop.status, message=stop.message, detail=stop.detail)
        session.save()
    except Exception as err:  # noqa: BLE001 - outside the solution's calls: the evaluator's own failure
        text = "".join(traceback.format_exception(err))
        status = "crashed" if is_cuda_error(err) else "evaluator_error"  # a CUDA error is the solution's, late
        session.result.update(status=status, message=f"{type(err).__name__} in the evaluator at stage "
                              f"{session.result['stage']!r}: {str(err).splitlines()[0][:300] if str(err) else ''}",
                              detail=text[-8000:])
        session.save()
    return session.result


def main(argv: list[str]) -> int:
    config = json.loads(Path(argv[0]).read_text())
    run(config)
    sys.stdout.flush()
    # Leave without running the solution's atexit hooks or destructors: the parent has the JSON.
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
