"""Turn a simulated run into specific feedback: what is wrong and where, without a GPU.

``diagnose.grade_on_cpu("warp_shuffle", source)`` (source: text or path; None: the skeleton) gives
``grade.passed`` and ``grade.messages``. The messages come from the simulated numbers on designed
inputs (``cases``) and the faults the simulator reports; how each is read: :func:`grade_on_cpu`.

One module: every message reads the same outcome and references, and the most specific one wins.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from losslab.teach.simulator import build
from losslab.teach.simulator import cases as case_lib
from losslab.teach.simulator import run as run_lib

EXERCISES_ROOT = build.KERNELS.parent / "exercises"  # the checkout's, or the wheel's losslab/exercises/


@dataclass(frozen=True)
class ExerciseText:
    """What the messages say for one exercise: its problem; ``zero``: the likely cause when
    the loss is 0 for every input; ``one_lane``: the cause when only thread 0's value
    arrives; ``row_parts``: the exercise splits a row into head, float4 packs and tail (the
    37 x 37 probe then names the broken part); ``passing_notes``: (text in the source, note)
    pairs shown with a pass; ``wrong_max``, ``wrong_sum``: what to fix when a cross_entropy row's max is
    wrong, or its max is right and its sum is not."""

    problem: str
    zero: str = "no element reaches it"
    one_lane: str = "(the reduction adds nothing)"
    row_parts: bool = False
    passing_notes: tuple[tuple[str, str], ...] = ()
    special: str = ""  # the name of an exercise's own diagnosis in this module (_SPECIAL), run first
    wrong_max: str = "the max of a union is the larger of the two maxes"
    wrong_sum: str = ("each part's sum counts exp(x - its own max); before adding, rescale each by exp(its max - "
                      "the combined max)")
    # a fused gradient's divisor as the loss names it ("B D": the mean over every element), and its inverse as
    # the source holds it
    mean: tuple[str, str] = ("B", "1/B (inv_B)")
    derivative: str = "d/dp of -t log p is -t / p"  # a fused gradient's formula
    wrong_loss: str = ""  # what to check when only the loss says something is wrong (no probes, no extra outputs)


EXERCISES = {
    "coalesce": ExerciseText(case_lib.KL_DIV, zero="no element is added (the loop over the row is missing)"),
    "warp_shuffle": ExerciseText(
        case_lib.KL_DIV,
        zero=("lane 0 holds only one lane's value, nothing is summed (value = __shfl_xor_sync(...) replaces "
              "the value): a shuffle result must be added"),
        one_lane="(warp_sum returns its input unchanged: it must add the other lanes' values)",
        passing_notes=(("__shfl_down_sync",
                        "__shfl_down_sync is fine here: block_sum uses only lane 0's result, which SHFL.DOWN leaves "
                        "complete (the machine-code check looks for SHFL.BFLY, the butterfly that leaves the sum in "
                        "every lane; with SHFL.DOWN the other lanes hold partial sums)"),)),
    "vectorize": ExerciseText(case_lib.KL_DIV, row_parts=True),
    "online_softmax": ExerciseText(case_lib.CROSS_ENTROPY, special="online_softmax"),
    "logsumexp_tree": ExerciseText(
        case_lib.CROSS_ENTROPY, special="online_softmax",
        wrong_max=("slot 0 must end with the whole block's state: at each step (stride THREADS/2 down to 1) the "
                   "first `stride` threads merge the slot `stride` further into their own")),
    "fused_softmax": ExerciseText(case_lib.CROSS_ENTROPY, special="fused_softmax"),
    "vectorize_logits": ExerciseText(case_lib.CROSS_ENTROPY, special="logit_parts"),
    "warp_max": ExerciseText(
        case_lib.CROSS_ENTROPY, special="online_softmax",
        wrong_max=("some lanes' values never reach the warp's max: a butterfly, m = fmaxf(m, "
                   "__shfl_xor_sync(FULL_WARP, m, offset)) for offset 16, 8, 4, 2, 1"),
        wrong_sum=("every lane rescales its own sum by exp(its max - the warp's max), so every lane needs the warp's "
                   "max: __shfl_down_sync leaves it in lane 0 only (the other lanes hold partial maxes); "
                   "__shfl_xor_sync (a butterfly) gives it to all 32")),
    "fused": ExerciseText(case_lib.KL_DIV, special="fused"),
}
_ELEMENTWISE_MEAN = ("B D", "1/(B D) (inv_n)")
EXERCISES |= {
    "mse_block_sum": ExerciseText(
        case_lib.MSE_LOSS, one_lane="(block_sum returns thread 0's own slot: the tree must add the others into "
                                    "partial[0])"),
    "mse_warp_sum": replace(EXERCISES["warp_shuffle"], problem=case_lib.MSE_LOSS),
    "mse_vectorize": ExerciseText(case_lib.MSE_LOSS, row_parts=True),
    "mse_fused": ExerciseText(case_lib.MSE_LOSS, special="fused", mean=_ELEMENTWISE_MEAN,
                              derivative="d/dp of (p - t)^2 is 2 (p - t)"),
    "hinge_coalesce": ExerciseText(case_lib.HINGE_LOSS, zero="no element is added (the loops over the rows are "
                                                             "missing)"),
    "hinge_warp_partials": ExerciseText(case_lib.HINGE_LOSS),
    "hinge_vectorize": ExerciseText(case_lib.HINGE_LOSS, zero="no element is added (the tile's rows are never "
                                                              "read)"),
    "hinge_fused": ExerciseText(case_lib.HINGE_LOSS, special="fused", mean=_ELEMENTWISE_MEAN,
                                derivative="d/dp of max(1 - p t, 0) is -t where 1 - p t > 0, 0 elsewhere"),
    "smooth_l1_coalesce": replace(EXERCISES["coalesce"], problem=case_lib.SMOOTH_L1_LOSS),
    "smooth_l1_warp_sum": replace(EXERCISES["warp_shuffle"], problem=case_lib.SMOOTH_L1_LOSS),
    "smooth_l1_vectorize": ExerciseText(case_lib.SMOOTH_L1_LOSS, row_parts=True),
    "smooth_l1_fused": ExerciseText(case_lib.SMOOTH_L1_LOSS, special="fused", mean=_ELEMENTWISE_MEAN,
                                    derivative="d/dp of smooth_l1(p - t) is clamp(p - t, -1, 1) (beta = 1): "
                                               "smooth_l1_grad"),
    "cosine_block_dots": ExerciseText(
        case_lib.COSINE, special="dots",
        wrong_sum=("tree[k][0] must end with the block's sum k, for each of the three: at each step (stride "
                   "THREADS / 2 down to 1) the first `stride` threads add the slots `stride` further into their own")),
    "cosine_warp_dots": ExerciseText(
        case_lib.COSINE, special="dots",
        wrong_sum=("lane 0 of each warp must end with its warp's 32 lanes' sums, for each of the three: a shuffle "
                   "result added at offsets 16, 8, 4, 2 and 1")),
    "cosine_vectorize": ExerciseText(
        case_lib.COSINE, special="dots",
        wrong_sum="every element of the row must reach add() exactly once: head, float4 packs and tail"),
    "cosine_fused": ExerciseText(case_lib.COSINE, special="fused", mean=("B", "1/B: row_cosine's scale is -1/B"),
                                 derivative="dL/dp = -(1/B) dcos/dp: row_cosine's scale is -1/B"),
    "triplet_block_squares": ExerciseText(
        case_lib.TRIPLET, wrong_loss=("slot 0 must end with the block's sums of both: at each step (stride THREADS / 2 "
                                      "down to 1) the first `stride` threads add both slots `stride` further on")),
    "triplet_warp_squares": ExerciseText(
        case_lib.TRIPLET, wrong_loss=("lane 0 of each warp must end with its warp's 32 lanes' sums, of s.ap and of "
                                      "s.an: a shuffle result added at offsets 16, 8, 4, 2 and 1")),
    "triplet_vectorize": ExerciseText(
        case_lib.TRIPLET, wrong_loss=("every element of a packed row must reach add_squares exactly once: thread k "
                                      "takes packs k, k + THREADS, ... of the D / 4")),
    "triplet_fused": ExerciseText(case_lib.TRIPLET, special="fused", mean=("N", "1/N (triplet_coefficients' scale)"),
                                  derivative="dL/da = (1/N) d(row's loss)/da: triplet_coefficients' scale is 1/N"),
}
PROBLEM_OF = {key: text.problem for key, text in EXERCISES.items()}
RTOL, ATOL = 1e-4, 1e-5
_HINTS = (
    (re.compile(r"(?:'|identifier \")__shfl(_xor|_down|_up|)(?:' was not declared|\" is undefined)"),
     lambda m: f"did you mean __shfl{m[1]}_sync (CUDA 9+ needs the mask)? e.g. "
               f"__shfl{m[1]}_sync(0xffffffff, value, {'lane' if not m[1] else 'offset'})"),
    (re.compile(r"(?:'|identifier \")__(ballot|any|all)(?:' was not declared|\" is undefined)"),
     lambda m: f"did you mean __{m[1]}_sync (CUDA 9+ needs the mask)? e.g. __{m[1]}_sync(0xffffffff, predicate)"),
    (re.compile(r"'(__\w+|cub|cooperative_groups)' (?:was not declared|has not been declared|is not a member)"),
     lambda m: f"the CPU simulator does not provide {m[1]}: where nvcc accepts it, grade on a GPU"),
    (re.compile(r"undefined reference to `(\w+_custom_(?:forward|backward))"),
     lambda m: f"{m[1]} is missing, or its parameters differ from the contract: copy its declaration from "
               f"the problem's launchers.h ({m[1].rsplit('_custom_', 1)[0]}_{m[1].rsplit('_', 1)[1]}_fn)"),
    (re.compile(r"expected '[;,)]' before"), lambda m: "a missing ';', ',' or ')' at the end of the line before?"),
    (re.compile(r"(?:'(\w+)' was not declared in this scope|identifier \"(\w+)\" is undefined)"),
     lambda m: f"'{m[1] or m[2]}' is not defined: a typo, or a name from another scope (THREADS, D, head, "
               f"packs...)?"),
)


@dataclass
class CpuGrade:
    """A grade from the CPU simulator: ``passed`` and the lines to show, most specific first."""

    key: str
    passed: bool
    messages: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        head = f"{self.key}: {'GREEN on the CPU simulator' if self.passed else 'RED on the CPU simulator'}"
        return "\n".join([head, *("  " + m for m in self.messages)])


def compile_hints(error: str) -> list[str]:
    """Hints for the compile errors in ``error`` (g++'s text): at most one for an undeclared
    name (the most specific), plus one per other slip."""
    hints, named = [], False
    for pattern, hint in _HINTS:
        about_name = "declared" in pattern.pattern
        if about_name and named:
            continue
        if (m := pattern.search(error)) is not None:
            hints.append(hint(m))
            named = named or about_name
    return hints


def _failure_message(result: run_lib.CaseResult, time_limit: float) -> str:
    f = result.failure
    where = f" (case {result.case.name}"
    if f.block is not None:
        where += f"; row {f.block[0]}, thread {f.thread[0]}"
    where += f"; {f.file} line {f.line})" if f.line else ")"
    if f.kind == "misaligned":
        return (f"misaligned 16-byte load at row {f.block[0] if f.block else '?'}: peel the head first (the "
                f"elements before the first 16-byte boundary, one float each), then load float4s from p + head"
                + where)
    if f.kind == "out_of_bounds":
        side = (f"{f.elements} element(s) past the end of {f.buffer}" if (f.elements or 0) > 0
                else f"{-(f.elements or 0)} element(s) before the start of {f.buffer}")
        return f"out-of-bounds {f.access or 'access'}: {side}; a loop bound runs past the row" + where
    if f.kind == "timeout":
        return (f"no result within {time_limit:g} s: a loop that never ends (a step of 0, a bound that "
                f"never becomes false?)" + where)
    if f.kind == "segv":
        return "the run crashed (invalid address or stack overflow)" + where
    return f"{f.message}" + where


def _close(got, want) -> bool:
    """``got`` matches ``want`` (float64) to RTOL/ATOL; where ``want`` is NaN (a row the
    reference leaves open, e.g. an ignored cross_entropy row) anything matches."""
    if got is None:
        return False
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        return False
    got = np.where(np.isnan(want), 0.0, got)
    want = np.where(np.isnan(want), 0.0, want)
    both_inf = np.isinf(want) & (got == want)
    scale = float(np.max(np.abs(want[np.isfinite(want)]), initial=1.0))  # an inf want (race: a run's loss) is no scale
    ok = np.isclose(got, want, rtol=RTOL, atol=ATOL * scale, equal_nan=True)
    return bool(np.all(ok | both_inf))


def _wrong(result: run_lib.CaseResult, reference) -> bool:
    return not (_close([result.loss], reference["loss"]) and _close(result.rows, reference["rows"]))


def _weights(result: run_lib.CaseResult, reference) -> np.ndarray | None:
    """A probe's weights: each row's sum over the reference's (the hot element's term, 1 for kl_div)."""
    if not result.finished:
        return None
    return np.round(result.rows.astype(np.float64) / reference["rows"], 2)


def _lane_message(weights: dict[int, float], text: ExerciseText) -> str | None:
    """A message for a weight pattern over warp 0's lanes (probe 60 x 256), or None."""
    lanes = np.array([weights.get(lane, np.nan) for lane in range(32)])
    if np.isnan(lanes).any():
        return None
    if np.all(lanes == 0):
        return None
    if lanes[0] == 1 and np.all(lanes[1:] == 0):
        return f"only thread 0's own value reaches the loss: no other lane's value is added {text.one_lane}"
    ones = lanes == 1
    if not np.all(ones | (lanes == 0)):
        return None
    reached = {lane for lane in range(32) if ones[lane]}
    for missing in range(1, 32):
        if reached == {lane for lane in range(32) if lane & missing == 0}:
            offsets = [o for o in (16, 8, 4, 2, 1) if missing & o]
            if offsets == [16]:
                return ("only half of each warp's values reach lane 0: the offsets must run 16, 8, 4, 2, 1 "
                        "(offset 16 is missing)")
            return (f"lanes {sorted(set(range(32)) - reached)[:6]}... of each warp never reach lane 0: offset(s) "
                    f"{', '.join(map(str, offsets))} missing; the offsets must run 16, 8, 4, 2, 1")
    return None


def _probe_messages(outcome: run_lib.Outcome, references, text: ExerciseText, block_threads: int) -> list[str]:
    messages = []
    all_zero = all(r.loss == 0 for r in outcome.results if r.case.kind == "standard" and r.finished)
    for result, reference in zip(outcome.results, references, strict=True):
        case = result.case
        w = _weights(result, reference) if case.kind == "probe" else None
        if case.kind != "probe" or w is None or np.all(w == 1):
            continue
        by_position = dict(zip(case.positions, w, strict=True))
        if np.all(w == 0) and all_zero:
            messages.append(f"the loss is 0 for every input: {text.zero}")
        elif np.all(w == 0):
            if not text.row_parts:  # with row parts the 37 x 37 probe says which part is missing
                messages.append(f"no element of a {case.D}-wide row reaches the loss")
        elif np.all(w == w[0]) and w[0] == block_threads:
            messages.append(f"every element is added {block_threads} times: each thread sums the whole row")
        elif np.all(w == w[0]):
            messages.append(f"every element is added {w[0]:g} times instead of once")
        elif case.D == 256 and (lane := _lane_message(by_position, text)):
            messages.append(lane)
        elif case.D != 256 and text.row_parts:
            messages += _role_messages(case, w, block_threads)
        elif case.D == 256 and not text.row_parts:
            messages.append(_weights_message(case.positions, w))
    return list(dict.fromkeys(messages))


def _weights_message(positions, w: np.ndarray) -> str:
    """The fallback: how often some elements of a row were added, to compare with once."""
    wrong = [(pos, x) for pos, x in zip(positions, w, strict=True) if x != 1][:5]
    listed = ", ".join(f"element {pos}: {x:g}" for pos, x in wrong)
    return (f"elements of a row are added the wrong number of times ({listed}): each element must be added "
            f"exactly once; check where each thread's loop starts and how far it steps")


def _role_messages(case: case_lib.Case, w: np.ndarray, block_threads: int) -> list[str]:
    """Messages for the probe 37 x 37: which of head, float4 packs and tail is wrong."""
    roles = case_lib.row_roles(case)[np.arange(case.B), np.asarray(case.positions)]
    messages = []
    names = {0: "the head (before the first 16-byte boundary)", 1: "the float4 packs", 2: "the scalar tail"}
    for role, name in names.items():
        bad = w[(roles == role) & (w != 1)]
        if bad.size == 0:
            continue
        if role == 2 and np.all(bad == 0):
            messages.append("wrong values on odd widths: the scalar tail misses the last D % 4 elements "
                            "(those after head + 4 * packs, one float each)")
        elif role == 2 and np.all(bad == block_threads):
            messages.append(f"wrong values on odd widths: every thread adds the whole tail ({block_threads} "
                            f"times each): share it like the head loop (start at threadIdx.x, step THREADS)")
        elif np.all(bad == 0):
            messages.append(f"the elements in {name} never reach the loss")
        else:
            messages.append(f"the elements in {name} are added {', '.join(f'{x:g}' for x in sorted(set(bad)))} "
                            f"times instead of once")
    return messages


def _ratio_message(outcome: run_lib.Outcome, references, block_threads: int) -> str | None:
    ratios = [r.loss / ref["loss"][0] for r, ref in zip(outcome.results, references, strict=True)
              if r.case.kind == "standard" and r.finished and ref["loss"][0] > 0 and np.isfinite(ref["loss"][0])]
    if ratios and block_threads > 1 and all(abs(x / block_threads - 1) < 0.01 for x in ratios):
        return (f"the loss is {block_threads}x too large: each thread sums the whole row (thread k must start at "
                f"element k and step by blockDim.x = {block_threads})")
    if (len(ratios) > 1 and ratios[0] != 0 and np.isfinite(ratios[0]) and abs(ratios[0] - 1) > 0.01
            and all(abs(x / ratios[0] - 1) < 0.01 for x in ratios)):
        return f"the loss is {ratios[0]:.4g}x the reference on every case: a wrong factor (the division by B?)"
    return None


def _nan_message(wrong) -> str | None:
    """A NaN loss where the reference has none: in the simulator, shared memory starts each
    block as NaN, so this is (almost always) a read of a slot no thread wrote."""
    for r, ref in wrong:
        if np.isnan(r.loss) and np.isfinite(ref["loss"][0]):
            return (f"the loss is NaN on {r.case.name}: a thread read shared memory that no thread of its block "
                    f"had written (the simulator starts each block's shared memory as NaN): a missing "
                    f"__syncthreads() between the writes and the reads, or a read past the slots written?")
    return None


def _second_stage_message(wrong) -> str | None:
    """Every row right and the loss wrong: the step from row sums to the loss."""
    if not all(_close(r.rows, ref["rows"]) for r, ref in wrong):
        return None
    if all(ref["loss"][0] and abs(r.loss / ref["loss"][0] / r.case.B - 1) < 1e-3 for r, ref in wrong):
        return "every row's sum is right but the loss is B times too large: divide the sum of the rows by B"
    r, ref = wrong[0]
    return (f"every row's sum is right but the loss is not ({r.loss:.6g} instead of {ref['loss'][0]:.6g} on "
            f"{r.case.name}): the step from row sums to the loss (sum / B) is wrong")


_RACE = "the loss changes with the order the threads run"


def _race_message(outcome: run_lib.Outcome, source: str, problem: str, label: str) -> str | None:
    standard = [r for r in outcome.results if r.case.kind == "standard" and r.finished]
    again = run_lib.run(source, problem, [r.case for r in standard], label=label, order="reverse")
    for first, second in zip(standard, again.results, strict=True):
        same = np.isnan(first.loss) == np.isnan(second.loss) and _close([second.loss], [first.loss])
        if second.finished and not same:
            return (f"{_RACE} ({first.loss:.6g} vs {second.loss:.6g} on "
                    f"{first.case.name}): a race. A thread reads shared memory another thread has not written "
                    f"yet: a missing __syncthreads()?")
    return None


def _value_messages(outcome, references, exercise: ExerciseText, source, problem) -> list[str]:
    launches = [x for x in outcome.launches if x["kernel"] != "sum_partials_kernel"]
    block_threads = int(np.prod(launches[0]["block"])) if launches else 0
    wrong = [(r, ref) for r, ref in zip(outcome.results, references, strict=True) if r.finished and _wrong(r, ref)]
    if not wrong:
        return []
    race = _race_message(outcome, source, problem, outcome.label)
    found = (_nan_message(wrong), race, _ratio_message(outcome, references, block_threads),
             _second_stage_message(wrong))
    messages = [m for m in found if m]
    if not any(found[:2]):  # with a NaN or a race the probes' weights are noise: they would mislead
        probes = _probe_messages(outcome, references, exercise, block_threads)
        messages += [m for m in probes if not messages or "whole row" not in m]
    if not messages and all(r.loss == 0 for r, _ in wrong) and len(wrong) > 1:  # no probes to say it (hinge_loss)
        messages.append(f"the loss is 0 for every input: {exercise.zero}")
    if not messages:
        r, ref = wrong[0]
        messages.append(f"wrong loss on {r.case.name}: {r.loss:.6g} instead of {ref['loss'][0]:.6g}"
                        + (f": {exercise.wrong_loss}" if exercise.wrong_loss else ""))
    return messages


def _backward_messages(outcome: run_lib.Outcome, references) -> list[str]:
    for r, ref in zip(outcome.results, references, strict=True):
        if r.finished and r.grad is not None and not _close(r.grad, ref["grad"]):
            bad = int(np.argmax(~np.isclose(r.grad, ref["grad"], rtol=RTOL, atol=ATOL)))
            return [f"wrong gradient on {r.case.name}: element {bad} is {r.grad[bad]:.6g} instead of "
                    f"{ref['grad'][bad]:.6g}"]
    return []


def _online_softmax_messages(outcome: run_lib.Outcome, references, text: ExerciseText) -> list[str]:
    """The (max, sum) combine: an overflow on large logits, a wrong max, a sum not rescaled."""
    for r in outcome.results:
        if not r.finished or r.extra.get("row_max") is None:
            continue
        x = r.case.p[r.case.offset_p:].reshape(r.case.B, r.case.D).astype(np.float64)
        want_max = x.max(axis=1)
        want_log_sum = np.log(np.exp(x - want_max[:, None]).sum(axis=1))
        got_max, got_log_sum = r.extra["row_max"].astype(np.float64), r.extra["row_log_sum"].astype(np.float64)
        if not np.all(np.isfinite(got_log_sum)):
            return [f"the sum is NaN or inf on {r.case.name}: exp of a logit or of a max itself overflows for large "
                    f"logits (expf(89) is inf) and is 0 for an empty part (max -FLT_MAX: then 0 / 0); combine only "
                    f"ever needs exp of a difference <= 0: each sum rescaled by exp(its max - the combined max)"]
        if not np.allclose(got_max, want_max, rtol=RTOL, atol=ATOL):
            row = int(np.argmax(~np.isclose(got_max, want_max, rtol=RTOL, atol=ATOL)))
            return [f"the combined max is wrong on {r.case.name}: row {row} has max {got_max[row]:.6g}, its "
                    f"largest logit is {want_max[row]:.6g}; {text.wrong_max}"]
        if not np.allclose(got_log_sum, want_log_sum, rtol=RTOL, atol=ATOL):
            row = int(np.argmax(~np.isclose(got_log_sum, want_log_sum, rtol=RTOL, atol=ATOL)))
            return [f"the max is right but the sum is not on {r.case.name} (row {row}: log sum {got_log_sum[row]:.6g} "
                    f"instead of {want_log_sum[row]:.6g}): {text.wrong_sum}"]
    return []


def _tail_lengths(case: case_lib.Case) -> np.ndarray:
    """(N,) the scalar tail's length in each row of logits: C - head - 4 * packs (common/row_split.cuh)."""
    starts = case.offset_p + np.arange(case.B) * case.D
    head = np.minimum(case.D, (4 - starts % 4) % 4)
    return (case.D - head) % 4


def _logit_parts_messages(outcome: run_lib.Outcome, references, text: ExerciseText) -> list[str]:
    """Rows read as head, float4 packs and tail: wrong exactly on the rows with a tail names the tail (missed,
    or added more than once); rows whose sum is 0 name the packs; else the (max, sum) messages."""
    tail_errors, other_errors, empty = [], [], False
    for r in outcome.results:
        if not r.finished or r.extra.get("row_max") is None:
            continue
        x = r.case.p[r.case.offset_p:].reshape(r.case.B, r.case.D).astype(np.float64)
        want_max = x.max(axis=1)
        want = np.log(np.exp(x - want_max[:, None]).sum(axis=1)) + want_max  # logsumexp
        with np.errstate(over="ignore", invalid="ignore"):
            got = r.extra["row_log_sum"].astype(np.float64) + r.extra["row_max"].astype(np.float64)
            ratio = np.exp(got - want)  # the row's sum / the right one (NaN where got is NaN)
        tails = _tail_lengths(r.case) > 0
        tail_errors += list(ratio[tails] - 1)
        other_errors += list(ratio[~tails] - 1)
        empty = empty or bool(np.any(ratio == 0))
    # wrong only where a row has a tail (a tail logit far below the max may weigh less than the tolerance)
    wrong = [e for e in tail_errors if not abs(e) < 1e-4]
    if wrong and all(abs(e) < 1e-4 for e in other_errors):
        if all(e < 0 for e in wrong):
            return ["wrong only on the rows with a tail: the scalar tail misses the last (C - head) % 4 logits (those "
                    "after head + 4 * packs, one float each)"]
        return ["wrong only on the rows with a tail: the tail is added more than once (every thread adding the whole "
                "tail?): share it like the head loop (start at threadIdx.x, step THREADS)"]
    if empty:
        return ["a row's sum is 0 (its log is -inf): no float4 pack reaches it; the packs start at x + head"]
    return _online_softmax_messages(outcome, references, text)


def _fused_messages(outcome: run_lib.Outcome, references, text: ExerciseText) -> list[str]:
    """The gradient written in the forward: never written, a factor B, the sign."""
    for r, ref in zip(outcome.results, references, strict=True):
        if not r.finished or r.grad is None or _close(r.grad, ref["grad"]):
            continue
        got, want = r.grad.astype(np.float64), ref["grad"]
        if np.isnan(got).any() and not np.isnan(want).any():
            where = int(np.argmax(np.isnan(got)))
            return [f"elements of the gradient are never written on {r.case.name} (element {where} is still the "
                    f"NaN the simulator fills the gradient with): every element must be written once"]
        mask = np.abs(want) > 1e-12
        ratios = got[mask] / want[mask]
        if ratios.size and np.allclose(ratios, ratios[0], rtol=1e-3):
            factor = float(ratios[0])
            divisor, inverse = text.mean
            n = r.case.B * (r.case.D if divisor == "B D" else 1)
            if abs(factor / n - 1) < 1e-3 and n > 1:
                return [f"the gradient is {divisor} = {n} times too large on {r.case.name}: L is the sum divided "
                        f"by {divisor}, so dL/dp carries the {inverse}"]
            if abs(factor + 1) < 1e-3:
                return [f"the gradient has the wrong sign on {r.case.name}: {text.derivative}"]
            return [f"the gradient is {factor:.4g} times the reference on {r.case.name}: a wrong factor "
                    f"({text.derivative})"]
    return []


def _fused_softmax_messages(outcome: run_lib.Outcome, references, text: ExerciseText) -> list[str]:
    """cross_entropy's gradient written in the forward: never written (as kl_div's), wrong only at the
    targets (the one-hot), a factor n_valid (the mean's 1 / n_valid)."""
    for r, ref in zip(outcome.results, references, strict=True):
        if not r.finished or r.grad is None or _close(r.grad, ref["grad"]):
            continue
        got, want = r.grad.astype(np.float64).reshape(r.case.B, r.case.D), ref["grad"].reshape(r.case.B, r.case.D)
        if np.isnan(got).any():
            return _fused_messages(outcome, references, text)
        valid = r.case.t != case_lib.IGNORE_INDEX
        at_target = np.zeros_like(got, dtype=bool)
        at_target[np.arange(r.case.B)[valid], r.case.t[valid]] = True
        if np.allclose(got[~at_target], want[~at_target], rtol=RTOL, atol=ATOL):
            return [f"the gradient is wrong only at each row's target class on {r.case.name}: dL/dx_j = "
                    f"softmax(x)_j - 1 where j is the target (the one-hot), softmax(x)_j elsewhere"]
        mask = (np.abs(want) > 1e-12) & valid[:, None]
        ratios = got[mask] / want[mask]
        n_valid = int(valid.sum())
        if ratios.size and np.allclose(ratios, n_valid, rtol=1e-3) and n_valid > 1:
            return [f"the gradient is n_valid = {n_valid} times too large on {r.case.name}: the loss is the mean "
                    f"over the valid rows, so dL/dx carries `scale` (1 / n_valid on a valid row, 0 on an ignored one)"]
        if not np.allclose(got[~valid], 0.0):
            return [f"an ignored row's gradient is not 0 on {r.case.name}: multiply by `scale`, which is 0 there"]
    return []


_PARTS = ("the head (before the first 16-byte boundary)", "the float4 packs", "the scalar tail")


def _dots_messages(outcome: run_lib.Outcome, references, text: ExerciseText) -> list[str]:
    """cosine_similarity_loss's three sums a row (row_dots: the loss alone cannot tell, cos is the same for sums
    all k times too large): a part of the row (head, packs, tail) missing or added by every thread, else the
    first wrong sum."""
    launches = [x for x in outcome.launches if x["kernel"] != "sum_partials_kernel"]
    threads = int(np.prod(launches[0]["block"])) if launches else 0
    for r in outcome.results:
        got = r.extra.get("row_dots")
        if not r.finished or got is None:
            continue
        p, t = r.case.predictions.astype(np.float64), r.case.targets.astype(np.float64)
        want = np.concatenate([(p * t).sum(axis=1), (p * p).sum(axis=1), (t * t).sum(axis=1)])
        got = got.astype(np.float64)
        if _close(got, want):
            continue
        pp_error = got[r.case.B:2 * r.case.B] - want[r.case.B:2 * r.case.B]
        roles = case_lib.row_roles(r.case)
        for role, name in enumerate(_PARTS):
            part = np.where(roles == role, p * p, 0.0).sum(axis=1)
            if np.any(part > 1e-3) and np.allclose(pp_error, -part, rtol=1e-3, atol=1e-3):
                return [f"the elements in {name} never reach the sums on {r.case.name}"]
            if np.any(part > 1e-3) and np.allclose(pp_error, (threads - 1) * part, rtol=1e-3, atol=1e-3):
                return [f"the elements in {name} are added by every thread ({threads} times each) on {r.case.name}: "
                        f"share them like warp_shuffle's loop (start at threadIdx.x, step THREADS)"]
        bad = int(np.argmax(~np.isclose(got, want, rtol=RTOL, atol=ATOL)))
        return [f"the row's {('p.t', 'p.p', 't.t')[bad // r.case.B]} is wrong on {r.case.name} (row {bad % r.case.B}: "
                f"{got[bad]:.6g} instead of {want[bad]:.6g}): {text.wrong_sum}"]
    return []


_SPECIAL = {"online_softmax": _online_softmax_messages, "fused": _fused_messages,
            "logit_parts": _logit_parts_messages, "fused_softmax": _fused_softmax_messages, "dots": _dots_messages}


def _notes(text: ExerciseText, source: str) -> list[str]:
    return [note for needle, note in text.passing_notes if needle in source]


def _exercise(key: str) -> ExerciseText:
    """The text of exercise ``key`` (this module's table holds every exercise of
    ``losslab.teach.exercises``; the simulator does not import it: that module imports this one)."""
    if key not in EXERCISES:
        raise ValueError(f"exercise: the CPU simulator grades {', '.join(EXERCISES)}, got {key!r}")
    return EXERCISES[key]


EMPTY = "the file is empty: start from the exercise's skeleton (its FILL ME IN says what to write)"


def _code_lines(code: str) -> list[str]:
    """The non-blank lines of ``code`` (comments already blanked), whitespace collapsed."""
    return [" ".join(line.split()) for line in code.splitlines() if line.strip()]


def unfilled(key: str, text: str) -> bool:
    """Whether the skeleton's FILL ME IN is still to do in ``text``, judged from the code, not the
    comment: the skeleton's code lines around its FILL ME IN (two before, one after: a placeholder
    statement such as ``return value;`` included) still stand next to each other."""
    try:
        skeleton = (EXERCISES_ROOT / _exercise(key).problem / f"{key}.cu").read_text()
    except (OSError, ValueError):
        return False
    at = skeleton.find("FILL ME IN")
    if at < 0:
        return False
    blank = build.blank_comments(skeleton)  # positions kept: split the code at the comment
    before, after = _code_lines(blank[:at]), _code_lines(blank[at:])
    window = before[-2:] + after[:1]  # two lines before: the placeholder's neighbours may recur (a tail loop)
    code = _code_lines(build.blank_comments(text))
    return any(code[i:i + len(window)] == window for i in range(len(code)))


def grade_on_cpu(key: str, source: str | Path | None = None, *, time_limit: float = 10.0) -> CpuGrade:
    """Grade exercise ``key`` on the CPU simulator: ``source`` is CUDA text or a path
    (None: the skeleton file as it is now). Returns ``CpuGrade(key, passed, messages)``.

    The messages come from the simulated numbers on designed inputs (``cases``): the ratio of
    the loss to the float64 reference (each thread summing the whole row gives blockDim x),
    and the one-hot probes, which give each element's *weight* in its row's sum (how many
    times it arrived): a weight pattern over a warp's lanes names the missing shuffle offsets,
    one over a row's head, float4 packs and tail names the part that is broken. Faults come
    from the simulator (misaligned float4 loads, out-of-bounds accesses, barrier or shuffle
    divergence, time limit) with the row, thread and line; compile errors get hints for
    common slips (:func:`compile_hints`). A source that passes is also run with each block's
    threads in reverse order: a loss that changes is a race.

    Never raises for a wrong source. Raises:
        ValueError: an exercise the simulator does not know.
        build.SimulatorError: g++ is missing or the simulator does not build here.
    """
    exercise = _exercise(key)
    problem = exercise.problem
    if source is None:
        source = EXERCISES_ROOT / problem / f"{key}.cu"
    text, label = run_lib.source_text(source, f"{key}.cu")
    if not text.strip():
        return CpuGrade(key, False, [EMPTY])
    outcome = run_lib.run(text, problem, label=label, time_limit=time_limit)
    if not outcome.compiled:
        lines = outcome.compile_error.splitlines()
        hints = compile_hints(outcome.compile_error)
        errors = [line for line in lines if "error" in line or "undefined reference" in line][:6] or lines[:6]
        if hints:  # g++'s own guess for a CUDA name is unrelated ('__shfl_xor' -> '__floor')
            errors = [re.sub(r"; did you mean '[^']*'\?", "", line) for line in errors]
        return CpuGrade(key, False, ["does not compile:", *errors, *("hint: " + h for h in hints)])
    references = [case_lib.PROBLEMS[problem].reference(r.case) for r in outcome.results]
    messages = []
    seen = set()
    for r in outcome.results:
        if r.failure is not None and r.failure.kind not in seen:
            seen.add(r.failure.kind)
            messages.append(_failure_message(r, time_limit))
        if r.failure is not None and r.failure.kind == "timeout":
            break
        if r.forward_status not in (None, 0) and "launch_error" not in seen:
            seen.add("launch_error")
            messages.append(f"the forward returned cudaError {r.forward_status} on {r.case.name} (a launch "
                            f"configuration the GPU refuses: more than 1024 threads a block, or 0 blocks?)")
    special = _SPECIAL[exercise.special](outcome, references, exercise) if exercise.special else []
    generic = _value_messages(outcome, references, exercise, text, problem) + _backward_messages(outcome, references)
    if special:  # the exercise's own diagnosis replaces the generic "wrong loss/gradient on ..." lines
        generic = [m for m in generic if not m.startswith(("wrong loss on", "wrong gradient on", "the loss is NaN"))]
    messages += special + generic
    races = [m for m in messages if m.startswith((_RACE, "lost update"))]  # a race makes other numbers noise
    messages = races + [m for m in messages if m not in races]
    if messages and unfilled(key, text):
        messages.append("the FILL ME IN in the source is still to do")
    if not messages and (race := _race_message(outcome, text, problem, label)):
        messages.append(race)
    passed = not messages
    if passed:
        messages = [f"all {len(outcome.results)} simulated cases match the float64 reference (forward"
                    f"{' and backward' if any(r.grad is not None for r in outcome.results) else ''})",
                    *_notes(exercise, text)]
    return CpuGrade(key, passed, messages)
