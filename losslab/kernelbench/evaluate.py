"""Judge a single-file KernelBench solution (a ``ModelNew``) against a problem's reference.

    python -m losslab evaluate solution.py --problem kl_div
    verdict = evaluate("solution.py", "kl_div"); print(verdict.format())

Evaluating a solution RUNS ITS CODE, in a child process the answer cannot use to forge its
verdict (:func:`evaluate` says how). This module checks the arguments and settles the verdict;
``parent`` runs the child (``child``) and checks its replies; ``verdict`` holds the rules.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
import time
from pathlib import Path

import torch

from losslab import problems
from losslab.kernelbench.parent import Plan, evaluator_error, run_child, time_peers
from losslab.kernelbench.verdict import ADVICE, STATUSES, Verdict, judge_timing, speed_of_light

__all__ = ["ADVICE", "STATUSES", "Verdict", "evaluate"]

DTYPES = ("float32", "bfloat16", "float16")


def solution_file(solution_path: str | os.PathLike) -> Path:
    """``solution_path`` as an absolute path to an existing Python file.

    Raises:
        FileNotFoundError: nothing is there.
        ValueError: it is a directory, or not a ``.py`` file.
    """
    path = Path(solution_path).expanduser().resolve()
    if path.is_dir():
        raise ValueError(f"solution_path: {path} is a directory; expected a Python file defining ModelNew")
    if not path.exists():
        raise FileNotFoundError(f"solution_path: no file {path}")
    if path.suffix != ".py":
        raise ValueError(f"solution_path: expected a Python file (.py), got {path.name}")
    return path


def output_file(json_path: str | os.PathLike, argument: str = "json_path") -> Path:
    """``json_path`` as an absolute path that a file can be written to (checked before any work);
    ``argument`` names it in the errors.

    Raises:
        FileNotFoundError: its folder does not exist.
        ValueError: it is a directory, or the file or its folder is not writable.
    """
    path = Path(json_path).expanduser().resolve()
    if path.is_dir():
        raise ValueError(f"{argument}: {path} is a directory; expected a file name")
    if not path.parent.is_dir():
        raise FileNotFoundError(f"{argument}: the folder {path.parent} does not exist")
    if path.exists() and not os.access(path, os.W_OK):
        raise ValueError(f"{argument}: {path} is not writable")
    if not path.exists() and not os.access(path.parent, os.W_OK):
        raise ValueError(f"{argument}: cannot create a file in {path.parent} (not writable)")
    return path


def check_arguments(problem: problems.Problem, size: str | tuple[int, int], dtype: str, trials: int, repeats: int,
                    timeout_s: float, device: str, min_speedup: float | None = None) -> tuple[int, int]:
    """Validate the options of :func:`evaluate`; returns the shape (rows, columns).

    Raises:
        ValueError: naming the first bad argument and what was expected.
    """
    if isinstance(size, str):
        if size not in problem.sizes:
            raise ValueError(f"size: {problem.name} has no size {size!r}; expected one of {', '.join(problem.sizes)} "
                             "or (rows, columns)")
        shape = tuple(problem.sizes[size])
    else:
        try:
            shape = tuple(int(n) for n in size)
        except (TypeError, ValueError):
            shape = ()
        if len(shape) != 2 or min(shape) < 1:
            raise ValueError(f"size: expected a size name or two positive integers (rows, columns), got {size!r}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype: expected one of {', '.join(DTYPES)}, got {dtype!r}")
    if trials < 1 or repeats < 1:
        raise ValueError(f"trials, repeats: expected at least 1, got {trials}, {repeats}")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s: expected a positive number of seconds, got {timeout_s!r}")
    if device not in ("cuda", "cpu"):
        raise ValueError(f"device: expected 'cuda' or 'cpu', got {device!r}")
    if min_speedup is not None and not (isinstance(min_speedup, (int, float)) and 0 < min_speedup < math.inf):
        raise ValueError(f"min_speedup: expected None or a positive number, got {min_speedup!r} (NaN, 0 or a "
                         "negative value would turn the too_slow gate off)")
    return shape



def conclude(verdict: Verdict, problem: problems.Problem, stderr: str, returncode: int | None, timeout_s: float,
             min_speedup: float | None) -> Verdict:
    """Settle ``verdict``: a timeout (``returncode`` None), a child that ended before the
    evaluation did (status still "running"), or the timing rules."""
    if returncode is None:
        verdict.status = "timed_out"
        verdict.message = f"no result after {timeout_s:g} s; it was in stage {verdict.stage!r} (killed)"
        verdict.detail = stderr[-4000:]
    elif verdict.status == "running":  # the child ended before the evaluation did
        how = f"killed by signal {-returncode}" if returncode < 0 else f"it exited with code {returncode}"
        last = next((line for line in reversed(stderr.strip().splitlines()) if line.strip()), "")
        verdict.status = "crashed"
        verdict.message = (f"the process ended ({how}) in stage {verdict.stage!r}, before the evaluation did"
                           + (f": {last[:300]}" if last else ""))
        verdict.detail = stderr[-4000:]
    elif verdict.status == "passed" and verdict.timing and "solution_ms" in verdict.timing:
        floor = speed_of_light(problem, verdict.shape, verdict.dtype, verdict.device)
        if floor is not None:
            verdict.timing["floor_ms"] = floor.ms
        judged = judge_timing(verdict.timing, floor, min_speedup)
        if judged:
            verdict.status, verdict.message = judged
            if verdict.status in ("impossible_time", "time_mismatch"):  # an artifact is never reported as a speedup
                for key in ("speedup_eager", "speedup_compile"):
                    verdict.timing.pop(key, None)
    return verdict


def evaluate(solution_path: str | os.PathLike, problem: problems.Problem | str, *,
             size: str | tuple[int, int] = "seed", dtype: str = "float32", trials: int = 5, repeats: int = 20,
             seed: int | None = None, timeout_s: float = 600.0, compare_compile: bool = True,
             min_speedup: float | None = None,
             build_dir: str | os.PathLike | None = None, device: str = "cuda",
             json_path: str | os.PathLike | None = None, timed: bool = True) -> Verdict:
    """Judge ``solution_path``'s ``ModelNew`` against ``problem``'s reference, in a child process.

    SECURITY: evaluating a solution RUNS ITS CODE (its Python at import, its C++/CUDA at build
    and launch), with your user's rights. Evaluate only files you would run yourself. The file
    is never imported into the calling process: a child process (``losslab.kernelbench.child``)
    loads it, in a fresh temporary working directory, with its own TORCH_EXTENSIONS_DIR (so it
    neither reads nor overwrites another build), under a supervisor (``supervisor``) that kills
    the child and every process it started when the evaluation ends or its time runs out.

    Who decides what: this process (the parent) holds the verdict. It draws every seed (fresh and
    secret unless ``seed`` is given; timed calls always), makes its own copy of every input,
    computes every reference (float64, and eager for KernelBench's check) and every comparison.
    The child only draws the same inputs from the seed it is sent, runs the solution and hands
    back what came out (outputs, gradients) and what its clocks measured, over pipes the parent
    created. Nothing the solution writes can pass it: a result file it forges is never read, a
    message it writes into the pipes is at most a claimed output (checked like any other) or
    breaks the protocol (``tampered``), and the parent times every timed call with its own clock
    too. What the parent cannot check, it reports as the child found it: a replaced function
    (``tampered``), an input changed in place, peak memory.

    What is checked, in order (the first failure ends the evaluation):

    1. load and build the file (``compile_error`` with the compiler's first error and its line,
       whether or not the file builds with ``verbose=True``; ``raised``);
    2. ``trials`` correctness trials at the problem's seed size unless ``size`` says otherwise,
       each on two fresh sets of inputs from the trial's seed: the problem's random inputs (as
       KernelBench's ``get_inputs``; the file's own ``get_inputs`` and ``get_init_inputs`` are
       reported, not used) and structured ones (rows on very different scales, a few rows carrying
       most of the loss; ``Problem.structured_inputs``). The output shape must be the reference's
       (``wrong_shape``); its relative error against float64 must be within what an honest kernel
       reaches for the dtype, the reduction length and the condition number of the loss at those
       inputs (``verdict.tolerance``, ``verdict.condition_number``; ``wrong_values``);
       KernelBench's own check (``torch.allclose`` with atol = rtol = 1e-4 in fp32, 1e-2 in 16-bit,
       against eager) is reported beside it, with why they differ if they do; an input changed in
       place is ``mutated_inputs``;
    3. where the reference has a gradient: the gradient w.r.t. the first input, on both kinds of
       inputs, against float64 (``check.TOLERANCES``; ``wrong_values`` if off); an answer without
       a working backward passes as forward only (no speedup is claimed for training);
    4. bitwise repeatability (three runs), peak extra memory (``bench.peak_extra_memory``);
       a function of torch, time or losslab replaced by the solution (``tampered``);
    5. timing of the solution, PyTorch eager and ``torch.compile``: ``repeats`` calls, each on
       fresh inputs made outside the timed region, after warm-up, with L2 flushed; each call
       timed by CUDA events on the caller's stream and by the host clock around a device-wide
       synchronisation, the longer one counting. The parent's own clock brackets each timed call
       together with N back-to-back synchronised calls of the answer in the same command, less
       the same command with an empty forward (``verdict.parent_clock``): a reported time more
       than 20 % below that per-call time is ``time_mismatch``. Every timed output is checked
       (a cached answer is ``wrong_values``);
       work left on another stream is ``hidden_work``; a median below the speed-of-light floor
       (minimum bytes at the datasheet's peak bandwidth) is ``impossible_time``, never a speedup;
       ``too_slow`` if the speedup over eager is below ``min_speedup``. Eager and torch.compile
       are timed by the parent after the child and everything it started are gone.

    A hang gives ``timed_out``, a dead child (an illegal address, a segfault, an exit)
    ``crashed`` with its stderr; without a GPU, ``no_gpu`` at once; a failure of the
    evaluator's own code ``evaluator_error``. ``device="cpu"`` is a dry run of stages 1-4 (no
    memory, no timing) on CPU tensors, for testing the evaluator and Python-only solutions.

    Args:
        solution_path: a Python file defining ``class ModelNew(nn.Module)`` whose forward takes
            the reference's inputs (e.g. predictions (B, D), targets (B, D) for kl_div).
        problem: a Problem, or its name (``python -m losslab list``; looked up here).
        size: a size name of the problem (default "seed", KernelBench's) or (rows, columns).
        dtype: the floating inputs' dtype name: "float32", "bfloat16" or "float16".
        trials: correctness trials, each on random and structured inputs from one seed.
        repeats: timed calls per implementation, each on fresh inputs (median reported, in ms).
        seed: None (default): every seed fresh and secret, so no answer can prepare for its
            inputs; an integer: trial ``i`` uses ``seed + i`` (to replay a failure; predictable).
            Timed calls always draw fresh secret seeds.
        timeout_s: wall-clock limit in seconds for the whole child (build included).
        compare_compile: also time ``torch.compile`` of the reference.
        min_speedup: if set, a correct solution slower than ``min_speedup`` x eager is ``too_slow``.
        build_dir: the child's TORCH_EXTENSIONS_DIR; default a fresh temporary one (isolated,
            so the build starts from scratch every time).
        device: "cuda"; "cpu" is a dry run of load, correctness, backward, repeatability and
            the tampering check on CPU tensors, with no memory or timing (for testing the
            evaluator itself and Python-only solutions; a CUDA solution fails there).
        json_path: if given, the verdict is also written there as JSON.
        timed: False stops after stages 1-4 on the GPU too (no memory, no timing; ``passed``
            then means correct): the pass that ``folder.evaluate_folder`` runs in parallel.

    Returns a Verdict; never raises for anything the solution does, and never hangs past
    ``timeout_s`` (plus a few seconds to end the child).

    Raises (before anything is run):
        FileNotFoundError: ``solution_path`` does not exist, or ``json_path``'s folder does not.
        ValueError: ``solution_path`` is a directory or not a .py file; ``json_path`` is a
            directory or not writable; unknown problem, size, dtype or device; trials/repeats
            < 1; timeout_s <= 0; min_speedup not a positive number.
    """
    problem = problems.get(problem)
    path = solution_file(solution_path)
    out = output_file(json_path) if json_path is not None else None
    shape = check_arguments(problem, size, dtype, trials, repeats, timeout_s, device, min_speedup)
    fields = dict(problem=problem.name, solution=path.name, shape=shape, dtype=dtype)
    if device == "cuda" and not torch.cuda.is_available():
        verdict = Verdict("no_gpu", **fields, message=f"no CUDA GPU is visible here (torch {torch.__version__}, "
                          f"CUDA build: {torch.version.cuda or 'no'}); nothing was run")
    else:
        start = time.monotonic()
        plan = Plan(problem, shape, getattr(torch, dtype), device, trials, repeats, seed, compare_compile, timed)
        with tempfile.TemporaryDirectory(prefix="losslab-evaluate-") as tmp:
            work = Path(tmp)
            build = Path(build_dir).resolve() if build_dir else work / "torch_extensions"
            result, stderr, returncode, seeds = run_child(plan, path, work, build, timeout_s)
        if result["stage"] == "peers":
            try:
                if seeds:
                    time_peers(plan, result, seeds)
                result.update(status="passed", stage="done")
            except Exception as err:  # noqa: BLE001 - the parent's own failure
                evaluator_error(result, err, "while timing eager and torch.compile")
        fields["seconds"] = time.monotonic() - start
        verdict = conclude(Verdict.from_child(result, **fields), problem, stderr, returncode, timeout_s, min_speedup)
    if out is not None:
        out.write_text(json.dumps(verdict.as_dict(), indent=1))
    return verdict
