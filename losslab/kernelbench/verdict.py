"""What an evaluation found: the :class:`Verdict`, its statuses and advice, and the timing rules.

The child process (``losslab.kernelbench.child``) measures; the rules that turn its measured
times into a verdict are pure functions here, so they can be checked without a GPU:

- :func:`speed_of_light` -- the least time the problem's minimum bytes take at the device's
  datasheet peak bandwidth (no kernel that reads its inputs from device memory is faster);
- :func:`judge_timing` -- ``hidden_work``, ``impossible_time`` or ``too_slow`` from the times.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from losslab import problems
from losslab.measure.ceilings import PhysicalFloor, physical_floor

STATUSES = ("passed", "compile_error", "raised", "wrong_shape", "wrong_values", "tampered", "hidden_work",
            "impossible_time", "too_slow", "timed_out", "crashed", "no_gpu", "evaluator_error")
# What a person can do about each failure.
ADVICE = {
    "compile_error": "Fix the build error shown below (nvcc/g++ output from load_inline).",
    "raised": "The solution raised; the traceback below shows where.",
    "wrong_shape": "Return exactly the reference's shape: a 0-d tensor for a mean loss "
                   "(e.g. out.reshape(()) rather than a (1,) buffer).",
    "wrong_values": "Compare with the definition (the problem module's docstring); replay the failing trial "
                    "with problem.make_inputs(shape, seed=SEED). For kl_div, batchmean divides by the batch "
                    "size B only, not B * D. A timed call that differs returned an answer for other inputs "
                    "(a cache): every call must compute from the inputs it is given.",
    "tampered": "A solution may not replace functions of torch, time or losslab: the ones listed below are "
                "what the reference, the checks or the timing use. Remove the assignments.",
    "hidden_work": "Join your side streams before forward returns (torch.cuda.current_stream().wait_stream(side), "
                   "or record an event on the side stream and wait for it): otherwise the caller can read the "
                   "output before it is written.",
    "impossible_time": "No kernel moves the problem's minimum bytes that fast from device memory: the "
                       "measurement was fooled (work skipped or cached, or done outside the timed region). "
                       "Check what forward really computes for fresh inputs.",
    "too_slow": "Correct, but slower than required against PyTorch eager; see the times below.",
    "timed_out": "The solution did not finish in time. Look for an infinite loop or a kernel that never "
                 "exits; a first build with torch headers can also take minutes (raise timeout_s).",
    "crashed": "The process died. An illegal memory access usually means an out-of-bounds index: run "
               "the solution under compute-sanitizer; the stderr tail is below.",
    "no_gpu": "Evaluation runs the solution's kernels and needs a CUDA GPU; run it on a GPU machine.",
    "evaluator_error": "A bug in losslab's evaluator, not in the solution: report it with the traceback below.",
}
# Work outside the caller's stream is flagged when the device-wide time exceeds the event time by
# more than both of these (an honest call differs by the host clock's jitter, a few microseconds).
HIDDEN_MIN_MS = 0.05
HIDDEN_FRACTION = 0.25


def speed_of_light(problem: str, shape: tuple[int, int], dtype: str, device: str) -> PhysicalFloor | None:
    """The physical floor of ``problem``'s forward at ``shape`` and ``dtype`` (a name such as
    "bfloat16") on ``device`` (a CUDA device name): its minimum bytes at the datasheet's peak
    bandwidth, in ms; None for a device without datasheet figures."""
    nbytes = problems.get(problem).cost(tuple(shape), "forward", getattr(torch, dtype)).bytes
    return physical_floor(nbytes, device)


def describe_floor(floor: PhysicalFloor) -> str:
    return (f"{floor.nbytes / 1e6:.4g} MB at the {floor.sheet.product} datasheet peak "
            f"{floor.sheet.memory_gbps:g} GB/s = {floor.ms:.4g} ms")


def judge_timing(timing: dict, floor: PhysicalFloor | None = None, min_speedup: float | None = None
                 ) -> tuple[str, str] | None:
    """The verdict the measured times alone give, as (status, message), or None if they pass.

    ``timing`` holds medians in ms: ``solution_ms`` (device-wide: events or host clock around a
    device-wide synchronisation, whichever is longer), ``solution_event_ms`` (CUDA events on the
    caller's stream only) and ``speedup_eager``. In order: ``hidden_work`` if the device-wide time
    exceeds the event time by more than HIDDEN_MIN_MS and HIDDEN_FRACTION of it;
    ``impossible_time`` if it is below ``floor``; ``too_slow`` below ``min_speedup``.
    """
    solution_ms = timing["solution_ms"]
    event_ms = timing.get("solution_event_ms", solution_ms)
    hidden_ms = solution_ms - event_ms
    if hidden_ms > max(HIDDEN_MIN_MS, HIDDEN_FRACTION * solution_ms):
        return "hidden_work", (f"forward returned with about {hidden_ms:.3g} ms of GPU work still running outside "
                               f"the caller's stream: CUDA events on that stream saw {event_ms:.3g} ms, a "
                               f"device-wide synchronisation {solution_ms:.3g} ms")
    if floor is not None and solution_ms < floor.ms:
        return "impossible_time", (f"{solution_ms:.3g} ms is below the speed-of-light floor ({describe_floor(floor)}); "
                                   "a measurement artifact, not a speedup")
    if min_speedup is not None:
        speedup = timing.get("speedup_eager", 0.0)
        if speedup < min_speedup:
            return "too_slow", f"speedup over eager {speedup:.2f}x is below the required {min_speedup:g}x"
    return None


@dataclass
class Verdict:
    """The outcome of one evaluation.

    Attributes:
        status: one of STATUSES; ``passed`` only if every check passed.
        message: one line saying why (empty when passed).
        detail: the compiler's output, the traceback, the replaced names or the child's stderr tail.
        stage: how far the child got (load, construct, correctness, backward, repeatability,
            memory, timing, done).
        trials: per correctness trial: seed, output shape, value, reference, max_abs_diff,
            allclose, rel_error_fp64 (against the float64 reference).
        backward: {"supported": bool, "rel_error", "tolerance", "passed"} or None if not reached.
        timing: milliseconds per implementation (``solution``, ``eager``, ``compile``): ``<name>_ms``
            (median device-wide time), ``<name>_p10_ms``/``_p90_ms``, ``<name>_event_ms`` (events
            on the caller's stream), ``<name>_wall_ms`` (host clock); ``overhead_ms`` (host clock of
            an empty call), ``floor_ms`` (speed of light, if the device has a datasheet entry), and
            ``speedup_eager``/``speedup_compile`` (peer time over solution time; absent when the
            time is impossible).
        memory: peak extra bytes of one forward: ``solution_bytes``, ``eager_bytes``.
        repeatable: three forwards on the same inputs gave bitwise the same output.
        solution_inputs: what the file's own get_inputs()/get_init_inputs() return (not used).
    """

    status: str
    problem: str
    solution: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    message: str = ""
    detail: str = ""
    stage: str = ""
    seconds: float = 0.0
    device: str = ""
    trials: list[dict] = field(default_factory=list)
    backward: dict | None = None
    timing: dict | None = None
    memory: dict | None = None
    repeatable: bool | None = None
    solution_inputs: dict | None = None

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_child(cls, result: dict, **fields) -> Verdict:
        """A verdict from the child's JSON ``result`` plus ``fields`` (problem, solution, shape, ...)."""
        known = {k: v for k, v in result.items() if k in cls.__dataclass_fields__}
        return cls(**{**known, **fields})

    def format(self) -> str:
        """A human-readable report: the verdict, the reason and what to do, then the measurements."""
        rows, cols = self.shape
        lines = [f"{self.solution}: {self.status.upper().replace('_', ' ')} "
                 f"({self.problem} {rows}x{cols} {self.dtype}{', ' + self.device if self.device else ''})"]
        if not self.passed:
            lines.append(f"  reason: {self.message or 'see below'}" + (f" [stage: {self.stage}]" if self.stage else ""))
            lines.append(f"  what to do: {ADVICE.get(self.status, '')}")
        lines += _check_lines(self)
        if self.timing:
            lines.append(_timing_line(self.timing))
        if self.solution_inputs:
            for name, value in self.solution_inputs.items():
                shown = "absent" if value is None else (", ".join(value) if isinstance(value, list) else value)
                lines.append(f"  file's {name}(): {shown or '[]'} (reported; the problem's inputs were used)")
        if self.detail and not self.passed:
            detail = self.detail.strip().splitlines()
            # a compiler's first errors matter most; a traceback's last lines
            shown = detail[:40] if self.status in ("compile_error", "tampered") else detail[-40:]
            lines.append("  details:\n" + "\n".join("    " + line for line in shown))
        return "\n".join(lines)


def _check_lines(verdict: Verdict) -> list[str]:
    """Correctness, backward, repeatability and memory, one line each where measured."""
    lines = []
    compared = [t for t in verdict.trials if "allclose" in t]
    if compared:
        ok = sum(bool(t["allclose"]) for t in compared)
        errors = [t["rel_error_fp64"] for t in compared]
        lines.append(f"  correctness: {ok}/{len(compared)} trials match (torch.allclose); "
                     f"max |diff| {max(t['max_abs_diff'] for t in compared):.3g}; "
                     f"relative error vs float64 up to {max(errors):.2g}")
    b = verdict.backward
    if b is not None and not b.get("supported"):
        lines.append("  backward: not supported (the output does not require grad)")
    elif b is not None:
        lines.append(f"  backward: relative error vs float64 {b.get('rel_error', float('nan')):.2g} "
                     f"(tolerance {b.get('tolerance', float('nan')):g}) "
                     f"{'ok' if b.get('passed') else 'FAILED ' + str(b.get('detail', ''))}".rstrip())
    if verdict.repeatable is not None:
        lines.append(f"  bitwise repeatable: {'yes' if verdict.repeatable else 'NO (outputs differ between runs)'}")
    if verdict.memory:
        lines.append(f"  peak extra memory: {format_bytes(verdict.memory['solution_bytes'])} "
                     f"(eager {format_bytes(verdict.memory['eager_bytes'])})")
    return lines


def _timing_line(t: dict) -> str:
    if "solution_ms" not in t:
        return "  time: not measured"
    parts = [f"{t['solution_ms']:.4g} ms (median of {t.get('repeats')}, fresh inputs each call, "
             f"p10-p90 {t['solution_p10_ms']:.4g}-{t['solution_p90_ms']:.4g}; "
             f"events on the caller's stream {t.get('solution_event_ms', float('nan')):.4g})"]
    if "floor_ms" in t:
        parts.append(f"speed-of-light floor {t['floor_ms']:.4g} ms")
    for peer, label in (("eager", "eager"), ("compile", "torch.compile")):
        if f"{peer}_ms" in t:
            speedup = f", speedup {t[f'speedup_{peer}']:.2f}x" if f"speedup_{peer}" in t else ""
            parts.append(f"{label} {t[f'{peer}_ms']:.4g} ms{speedup}")
    if "compile_error" in t:
        parts.append(f"torch.compile failed: {t['compile_error']}")
    return "  time: " + "; ".join(parts)


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"
