"""What an evaluation found: the :class:`Verdict`, its statuses and advice, and the rules that
turn outputs and times into it, as pure functions checkable without a GPU.

The parent (``evaluate``, ``parent``) compares and the child (``child``) measures; the rules:
:func:`tolerance`, :func:`condition_number`, :func:`compare` (correctness), :func:`speed_of_light`,
:func:`back_to_back_calls`, :func:`parent_clock` and :func:`judge_timing` (timing).

One module: a status, its rule, its advice and its line in the report change together.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field

import torch

from losslab import problems
from losslab.measure.ceilings import PhysicalFloor, physical_floor
from losslab.measure.check import relative_error

STATUSES = ("passed", "compile_error", "raised", "wrong_shape", "wrong_values", "mutated_inputs", "tampered",
            "time_mismatch", "hidden_work", "impossible_time", "too_slow", "timed_out", "crashed", "no_gpu",
            "evaluator_error")
# What a person can do about each failure.
ADVICE = {
    "compile_error": "Fix the build error shown below (nvcc/g++ output from load_inline).",
    "raised": "The solution raised; the traceback below shows where.",
    "wrong_shape": "Return exactly the reference's shape: a 0-d tensor for a mean loss "
                   "(e.g. out.reshape(()) rather than a (1,) buffer).",
    "wrong_values": "Compare with the definition (the problem module's docstring); replay the failing trial "
                    "with losslab.kernelbench.inputs.make(problem, shape, SEED, KIND, 'cuda', dtype). For kl_div, "
                    "batchmean divides by the batch size B only, not B * D. Every row counts: structured "
                    "inputs put most of the loss in a few rows. A timed call that differs returned an answer "
                    "for other inputs (a cache): every call must compute from the inputs it is given.",
    "mutated_inputs": "forward must leave its inputs as it found them: compute into new tensors (or buffers of "
                      "your own). The caller still needs its inputs (a training step reuses them).",
    "tampered": "A solution may not replace functions of torch, time or losslab (the ones listed below are "
                "what the checks or the timing use), nor write into the evaluator's channel. Remove that code.",
    "time_mismatch": "The times measured inside the evaluating process are well below the evaluator's own clock "
                     "around the same calls: something in that process changed how it is timed. Remove it.",
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
# KernelBench's torch.allclose tolerances (atol = rtol) per output dtype
ALLCLOSE_TOL = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 1e-2}
TREE_SAFETY = 2  # see tolerance()
TERM_ROUNDINGS = 4
# A reported time below the evaluator's own clock by more than both of these is flagged.
CLOCK_FRACTION = 0.2
CLOCK_SLACK_MS = 0.1  # the jitter of two processes' host clocks and a pipe round trip, with room
# The back-to-back calls of each timed command (see parent_clock): about this long, within these bounds.
BACK_TO_BACK_MS = 50.0
BACK_TO_BACK_CALLS = (10, 500)
# Work outside the caller's stream is flagged when the device-wide time exceeds the event time by
# more than both of these (an honest call differs by the host clock's jitter, a few microseconds).
HIDDEN_MIN_MS = 0.05
HIDDEN_FRACTION = 0.25


def unit_roundoff(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps / 2


def tolerance(dtype: torch.dtype, n: int, condition: float = 1.0) -> float:
    """The relative error against float64 within which an honest kernel computes a loss whose
    reduction runs over ``n`` terms, whose output has ``dtype`` and whose inputs give the
    condition number ``condition`` (:func:`condition_number`; 1 for a sum of terms of one sign)::

        rtol = u(dtype) + 2 * (ceil(log2 n) + 4 * condition) * u(float32),    u(t) = finfo(t).eps / 2

    Source: N. J. Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., SIAM 2002.
    A GPU reduction is a pairwise (tree) summation (threads, warps, blocks, the blocks' partial
    sums) in float32 arithmetic, whatever the input dtype; section 4.2 bounds its error by
    |computed - exact| <= gamma_k * sum |x_i|, k = ceil(log2 n), gamma_k ~ k u. Each term
    brings TERM_ROUNDINGS roundings of its own (a log or an exp, a multiply, the final
    division), each relative to the numbers the term is computed from, not to the term: a
    cross-entropy row's loss is lse_i - x_i,t, and where the target is the row's largest logit
    both are far larger than their difference; a KL term t (log t - log p) is likewise the
    difference of t log t and t log p. So the terms' roundings, relative to the loss, are
    amplified by the condition number of the sum of those parts (section 4.2 again: the
    relative error of a sum is bounded by its error bound times sum |x_i| / |sum x_i|)::

        condition = sum_i (|a_i| + |b_i|) / |sum_i (a_i - b_i)|  >= 1

    with (a_i, b_i) = (lse_i, x_i,target) for cross-entropy and (t log t, t log p) for each
    KL term. The summation's own bound is gamma_k times sum |a_i - b_i| / |sum (a_i - b_i)|,
    at most ``condition`` (1 for cross-entropy, whose row losses are >= 0; 1.4 to 6 for KL
    on these inputs): TREE_SAFETY = 2 covers it wherever 4 * condition exceeds
    ceil(log2 n) * (that ratio - 2), as it does here by far. TREE_SAFETY also leaves room for
    a reduction that is not a perfect tree (a short sequential loop per thread, atomics in
    any order); rounding the result to the output dtype adds u(dtype).

    float32 at 16384 x 16384 with condition 1: 3.9e-6. On the inputs drawn here: random
    cross-entropy rows have condition ~1.1 (tolerance ~4e-6); structured ones (the target at a
    row's raised maximum: tiny losses beside logits up to 80) 30 to 230, a tolerance of 1.5e-5
    to 1.1e-4, where the naive rung was off by 5.7e-6 on an H100 and a sequential float32 loop
    per row by up to 1e-5 on the CPU; KL's inputs 150 to 410 (a row's KL ~0.05 beside
    entropies ~log D), 7e-5 to 2e-4, where the ladder reaches 1e-7. One row in eight is off by
    1e-2 to 3e-1 on structured inputs (tests/test_verdict.py). bfloat16: 3.9e-3 and float16:
    4.9e-4 at condition 1 (their own rounding). An answer that does its elementwise arithmetic
    in a 16-bit type, as PyTorch eager does on 16-bit tensors, can be further off: KernelBench's
    verdict, reported beside, compares with eager at a fixed tolerance instead.
    """
    return unit_roundoff(dtype) + TREE_SAFETY * (math.ceil(math.log2(max(n, 2))) + TERM_ROUNDINGS * condition) * \
        unit_roundoff(torch.float32)


def condition_number(problem: problems.Problem, inputs64: tuple) -> float:
    """The condition number of ``problem``'s loss at ``inputs64`` (the inputs, floating ones in
    float64): sum (|a_i| + |b_i|) / |sum (a_i - b_i)|, where the loss sums terms a_i - b_i
    that a kernel computes from larger numbers (see :func:`tolerance`; each loss's terms:
    ``Problem.condition_parts``). 1 for a problem without them, or where the sum is 0 (the
    relative error is then an absolute one). A few elementwise passes over the inputs, as cheap
    as the float64 reference."""
    try:
        with torch.no_grad():
            magnitude, total = problem.condition_parts(*inputs64)
    except NotImplementedError:
        return 1.0
    magnitude, total = magnitude.item(), abs(total.item())
    return max(1.0, magnitude / total) if total > 0 and math.isfinite(magnitude / total) else 1.0


def compare(got: torch.Tensor, eager: torch.Tensor, loss64: torch.Tensor, n: int, condition: float = 1.0) -> dict:
    """One output of the reference's shape against float64 (losslab's verdict: ``passed``, within
    :func:`tolerance` of ``loss64``) and against ``eager``, PyTorch in the input dtype
    (KernelBench's: ``allclose`` at ALLCLOSE_TOL). ``n``: the terms the loss reduces over;
    ``condition``: the inputs' condition number (:func:`condition_number`)."""
    got = got.detach().to(eager.device, eager.dtype)
    tol, kb = tolerance(eager.dtype, n, condition), ALLCLOSE_TOL.get(eager.dtype, 1e-4)
    error, found = relative_error(got, loss64)
    return {"value": got.double().flatten()[:1].item(), "reference": loss64.double().flatten()[:1].item(),
            "max_abs_diff": (got.double() - eager.double()).abs().max().item(),
            "allclose": bool(torch.allclose(got, eager, atol=kb, rtol=kb)), "rel_error_fp64": error,
            "eager_rel_error_fp64": relative_error(eager, loss64)[0], "tolerance": tol, "condition": condition,
            "passed": error <= tol and not found, "detail": found}


def why_they_differ(trials: list[dict], dtype: str, n: int) -> str:
    """One line on why KernelBench's verdict (allclose against eager on random inputs) and
    losslab's (float64, :func:`tolerance`, random and structured inputs) disagree; "" if they agree."""
    compared = [t for t in trials if "allclose" in t and "passed" in t]
    kernelbench = all(t["allclose"] for t in compared if t.get("kind", "random") == "random")
    ours = all(t["passed"] for t in compared)
    if not compared or kernelbench == ours:
        return ""
    if kernelbench:
        worst = next(t for t in compared if not t["passed"])
        if worst.get("kind") == "structured":
            return (f"KernelBench draws uniform random inputs only, where every row carries about the same loss; "
                    f"on structured inputs (a few rows carry most of it) this answer is off by "
                    f"{worst['rel_error_fp64']:.2g}")
        kb = ALLCLOSE_TOL.get(getattr(torch, dtype), 1e-4)
        allowed = kb * (1 + abs(worst["reference"])) / max(abs(worst["reference"]), 1e-30)
        return (f"KernelBench's fixed tolerance (atol = rtol = {kb:g}) allows a relative error of about "
                f"{allowed:.2g} here, {allowed / worst['tolerance']:.0f}x what an honest {dtype} kernel reaches "
                f"over {n:.3g} terms at condition number {worst.get('condition', 1.0):.3g} "
                f"({worst['tolerance']:.2g}); this answer is off by {worst['rel_error_fp64']:.2g}")
    eager = max(t.get("eager_rel_error_fp64", 0.0) for t in compared)
    return (f"KernelBench compares with eager {dtype}, itself off by {eager:.2g} from float64; against float64 "
            f"this answer is within {compared[0]['tolerance']:.2g}")


def speed_of_light(problem: problems.Problem, shape: tuple[int, int], dtype: str, device: str) -> PhysicalFloor | None:
    """The physical floor of ``problem``'s forward at ``shape`` and ``dtype`` (a name such as
    "bfloat16") on ``device`` (a CUDA device name): its minimum bytes at the datasheet's peak
    bandwidth, in ms (no kernel that reads its inputs from device memory is faster); None for a
    device without datasheet figures."""
    nbytes = problem.cost(tuple(shape), "forward", getattr(torch, dtype)).bytes
    return physical_floor(nbytes, device)


def describe_floor(floor: PhysicalFloor) -> str:
    return (f"{floor.nbytes / 1e6:.4g} MB at the {floor.sheet.product} datasheet peak "
            f"{floor.sheet.memory_gbps:g} GB/s = {floor.ms:.4g} ms")


def back_to_back_calls(warmup_ms: float, warmup_calls: int) -> int:
    """How many back-to-back calls each timed command makes (see :func:`parent_clock`): about
    BACK_TO_BACK_MS of them at the per-call time the evaluator's own clock saw over the warm-up
    (``warmup_ms`` for ``warmup_calls`` calls, an over-estimate: each call there has fixed costs
    of its own), within BACK_TO_BACK_CALLS."""
    low, high = BACK_TO_BACK_CALLS
    per_call_ms = warmup_ms / max(int(warmup_calls), 1)
    if not per_call_ms > 0:
        return high
    return int(min(high, max(low, math.ceil(BACK_TO_BACK_MS / per_call_ms))))


def parent_clock(answer_ms: list[float], empty_ms: list[float], calls: int) -> dict:
    """The evaluator's own clock per call of the answer, from the commands it bracketed.

    Each timed command runs, in the child, one timed call (L2 flushed, events, the output
    sent back) and then ``calls`` back-to-back calls of the same forward on the same inputs,
    each followed by a device-wide synchronisation, with no flush; ``answer_ms`` is the
    evaluator's clock around each such command (from sending it to reading the reply),
    ``empty_ms`` around the same command with a forward that does nothing (it returns a 0-d
    view), interleaved with them. Everything else in a command -- the pipe round trip, the
    stdout capture, the 256 MiB flush and its synchronisation, the events, the output's copy
    to the host and the reply -- is in both, so the difference of their medians is
    ``calls + 1`` times what one call of the answer adds to an empty call: the same quantity
    the child's wall clock reports (its call less an empty call), as the issue asks ("the
    parent's wall clock over N synchronised calls, after subtracting the measured launch
    overhead"). A cost of the command that differs between the two (the first call after the
    inputs were drawn or after the evaluator's own GPU work: 0.1 to 0.45 ms on an H100, which
    compared with a single call made honest answers a time_mismatch) counts 1 / (calls + 1).
    The back-to-back calls find L2 warm (and the same inputs: a cache would answer them), so
    an honest answer's time here is at most its flushed time: the check errs towards passing
    it, and only a reported time well below what the evaluator saw fails it.

    Returns {"parent_ms": per call, "parent_overhead_ms": the median empty command,
    "parent_calls": calls + 1}.
    """
    overhead = statistics.median(empty_ms)
    return {"parent_ms": max(statistics.median(answer_ms) - overhead, 0.0) / (calls + 1),
            "parent_overhead_ms": overhead, "parent_calls": calls + 1}


def judge_timing(timing: dict, floor: PhysicalFloor | None = None, min_speedup: float | None = None
                 ) -> tuple[str, str] | None:
    """The verdict the measured times alone give, as (status, message), or None if they pass.

    ``timing`` holds medians in ms: ``solution_ms`` (device-wide: events or host clock around a
    device-wide synchronisation, whichever is longer), ``solution_event_ms`` (CUDA events on the
    caller's stream only), ``parent_ms`` (the evaluator's own clock per call, :func:`parent_clock`)
    and ``speedup_eager``. In order: ``time_mismatch`` if
    ``solution_ms`` is below ``parent_ms`` by more than CLOCK_FRACTION of it and CLOCK_SLACK_MS;
    ``hidden_work`` if the device-wide time exceeds the event time by more than HIDDEN_MIN_MS and
    HIDDEN_FRACTION of it; ``impossible_time`` if it is below ``floor``; ``too_slow`` below
    ``min_speedup``.
    """
    solution_ms = timing["solution_ms"]
    parent_ms = timing.get("parent_ms")
    if parent_ms is not None and parent_ms - solution_ms > max(CLOCK_FRACTION * parent_ms, CLOCK_SLACK_MS):
        return "time_mismatch", (f"the solution's process reported {solution_ms:.3g} ms per call; the evaluator's "
                                 f"own clock over {timing.get('parent_calls', '?')} synchronised calls in one command "
                                 f"saw {parent_ms:.3g} ms per call (less the same command with an empty call, "
                                 f"{timing.get('parent_overhead_ms', 0):.3g} ms)")
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
        stage: how far the evaluation got (load, correctness, backward, repeatability, memory,
            timing, peers, done).
        trials: per correctness trial and kind of inputs ("random", "structured"): trial, kind,
            seed, output shape, value, reference (float64), max_abs_diff and allclose (against
            eager, KernelBench's check), rel_error_fp64, tolerance and passed (losslab's check).
        backward: {"supported": True, "rel_error", "tolerance", "passed"}, {"supported": False,
            "why"} for an answer without a working backward (forward only), or None if not reached.
        timing: milliseconds per implementation (``solution``, ``eager``, ``compile``): ``<name>_ms``
            (median device-wide time), ``<name>_p10_ms``/``_p90_ms``, ``<name>_event_ms`` (events
            on the caller's stream), ``<name>_wall_ms`` (host clock); ``overhead_ms`` (host clock of
            an empty call), ``parent_ms`` (the evaluator's own clock per call over ``parent_calls``
            calls in one command, less ``parent_overhead_ms``, its clock around the same command
            with an empty call: :func:`parent_clock`), ``floor_ms`` (speed of light,
            if the device has a datasheet entry), and ``speedup_eager``/``speedup_compile`` (peer
            time over solution time; absent when the time is impossible).
        memory: peak extra bytes of one forward: ``solution_bytes`` (as the child reports it),
            ``eager_bytes`` (absent when the evaluation stopped before eager was measured).
        repeatable: three forwards on the same inputs gave bitwise the same output.
        solution_inputs: what the file's own get_inputs()/get_init_inputs() return (not used).
        processes: how the child's processes were contained: {"contained": bool, "how": str,
            "survivors": [descriptions of processes still alive after the kill]}.
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
    processes: dict | None = None

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    @property
    def forward_only(self) -> bool:
        """The answer has no working backward: its forward verdict stands, no training speedup is claimed."""
        return self.backward is not None and not self.backward.get("supported")

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
        only = " (FORWARD ONLY)" if self.passed and self.forward_only else ""
        lines = [f"{self.solution}: {self.status.upper().replace('_', ' ')}{only} "
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
        for line in _process_lines(self.processes):
            lines.append(line)
        if self.detail and not self.passed:
            detail = self.detail.strip().splitlines()
            # a compiler's first errors matter most; a traceback's last lines
            shown = detail[:40] if self.status in ("compile_error", "tampered") else detail[-40:]
            lines.append("  details:\n" + "\n".join("    " + line for line in shown))
        return "\n".join(lines)


def _check_lines(verdict: Verdict) -> list[str]:
    """Correctness (losslab's and KernelBench's), backward, repeatability and memory, one line each."""
    lines = []
    compared = [t for t in verdict.trials if "allclose" in t]
    if compared:
        ours = [t for t in compared if "passed" in t]
        kernelbench = [t for t in compared if t.get("kind", "random") == "random"]
        n = math.prod(verdict.shape)
        if ours:  # each input's tolerance follows from its condition number
            worst = max(ours, key=lambda t: t["rel_error_fp64"] / t["tolerance"] if t["tolerance"] else math.inf)
            lines.append(f"  correctness: {sum(bool(t['passed']) for t in ours)}/{len(ours)} inputs (random and "
                         f"structured) within {_span([t['tolerance'] for t in ours], '.2g')} of float64 (relative; "
                         f"{verdict.dtype} over {n:.3g} terms, condition number "
                         f"{_span([t.get('condition', 1.0) for t in ours], '.3g')}); worst "
                         f"{worst['rel_error_fp64']:.2g} (tolerance {worst['tolerance']:.2g})")
        ok = sum(bool(t["allclose"]) for t in kernelbench)
        kb = ALLCLOSE_TOL.get(getattr(torch, verdict.dtype, None), 1e-4)
        lines.append(f"  KernelBench's check: {ok}/{len(kernelbench)} random trials match eager (torch.allclose, "
                     f"atol = rtol = {kb:g}); max |diff| {max(t['max_abs_diff'] for t in compared):.3g}")
        why = why_they_differ(verdict.trials, verdict.dtype, n)
        if why:
            lines.append(f"  KernelBench's verdict would be {'pass' if ok == len(kernelbench) else 'fail'}, "
                         f"losslab's is {'pass' if all(t['passed'] for t in ours) else 'fail'}: {why}")
    b = verdict.backward
    if b is not None and not b.get("supported"):
        lines.append(f"  backward: forward only ({b.get('why', 'no gradient')}); the forward verdict stands, and no "
                     "speedup is claimed for training")
    elif b is not None:
        lines.append(f"  backward: relative error vs float64 {b.get('rel_error', float('nan')):.2g} "
                     f"(tolerance {b.get('tolerance', float('nan')):g}) "
                     f"{'ok' if b.get('passed') else 'FAILED ' + str(b.get('detail', ''))}".rstrip())
    if verdict.repeatable is not None:
        lines.append(f"  bitwise repeatable: {'yes' if verdict.repeatable else 'NO (outputs differ between runs)'}")
    if verdict.memory and "solution_bytes" in verdict.memory:  # eager's is measured last, after the timing
        eager = verdict.memory.get("eager_bytes")
        lines.append(f"  peak extra memory: {format_bytes(verdict.memory['solution_bytes'])}"
                     + (f" (eager {format_bytes(eager)})" if eager is not None else ""))
    return lines


def _span(values: list[float], spec: str) -> str:
    """"a" or "a to b": the least and the largest of ``values``, formatted with ``spec``."""
    low, high = format(min(values), spec), format(max(values), spec)
    return low if low == high else f"{low} to {high}"


def _timing_line(t: dict) -> str:
    if "solution_ms" not in t:
        return "  time: not measured"
    parts = [f"{t['solution_ms']:.4g} ms (median of {t.get('repeats')}, fresh inputs each call, "
             f"p10-p90 {t['solution_p10_ms']:.4g}-{t['solution_p90_ms']:.4g}; "
             f"events on the caller's stream {t.get('solution_event_ms', float('nan')):.4g})"]
    if "parent_ms" in t:
        parts.append(f"the evaluator's own clock {t['parent_ms']:.4g} ms per call (over {t.get('parent_calls', '?')} "
                     "back to back)")
    if "floor_ms" in t:
        parts.append(f"speed-of-light floor {t['floor_ms']:.4g} ms")
    for peer, label in (("eager", "eager"), ("compile", "torch.compile")):
        if f"{peer}_ms" in t:
            speedup = f", speedup {t[f'speedup_{peer}']:.2f}x" if f"speedup_{peer}" in t else ""
            parts.append(f"{label} {t[f'{peer}_ms']:.4g} ms{speedup}")
    if "compile_error" in t:
        parts.append(f"torch.compile failed: {t['compile_error']}")
    return "  time: " + "; ".join(parts)


def _process_lines(processes: dict | None) -> list[str]:
    if not processes:
        return []
    lines = [] if processes.get("contained") else [f"  processes: {processes.get('how', 'not contained')}"]
    survivors = processes.get("survivors") or []
    if survivors:
        lines.append(f"  processes: {len(survivors)} started by the solution survived the kill: "
                     + "; ".join(survivors[:5]))
    return lines


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"
