"""Judge a single-file KernelBench solution (a ``ModelNew``) against a problem's reference.

    python -m losslab evaluate solution.py --problem kl_div
    verdict = evaluate("solution.py", "kl_div"); print(verdict.format())

SECURITY: evaluating a solution RUNS ITS CODE (its Python at import, its C++/CUDA at build
and launch), with your user's rights. Evaluate only files you would run yourself. The file
is never imported into the calling process: a child process (``losslab.kernelbench.child``)
loads it, in a fresh temporary working directory, with its own TORCH_EXTENSIONS_DIR (so it
neither reads nor overwrites another build), under a time limit after which its whole
process group is killed. This isolates faults (a hang, a crash, a broken CUDA context), not
a malicious file: the child has the same environment and file-system access as you.

What the child checks, in order (the first failure ends the evaluation):

1. load and build the file (``compile_error`` with the compiler's first error and its line,
   whether or not the file builds with ``verbose=True``; ``raised``);
2. KernelBench's protocol on the problem's inputs (``problem.make_inputs`` at the problem's
   seed size unless ``size`` says otherwise; the file's own ``get_inputs`` and
   ``get_init_inputs`` are reported, not used): ``trials`` correctness trials, each on fresh
   inputs from seed ``seed + trial``; the output shape equal to the reference's
   (``wrong_shape``), ``torch.allclose`` with atol = rtol = 1e-4 for fp32, 1e-2 for 16-bit
   types (``wrong_values``, with the trial and by how much); the relative error against the
   float64 reference is recorded too;
3. if the output carries autograd, the gradient w.r.t. the first input against float64
   (``check.TOLERANCES``; ``wrong_values`` if off);
4. bitwise repeatability (three runs), peak extra memory (``bench.peak_extra_memory``);
   a function of torch, time or losslab replaced by the solution (``tampered``);
5. timing of the solution, PyTorch eager and ``torch.compile``: ``repeats`` calls, each on
   fresh inputs made outside the timed region, after warm-up, with L2 flushed; each call
   timed by CUDA events on the caller's stream and by the host clock around a device-wide
   synchronisation, the longer one counting. Every timed output is checked (a cached answer
   is ``wrong_values``); work left on another stream is ``hidden_work``; a median below the
   speed-of-light floor (minimum bytes at the datasheet's peak bandwidth) is
   ``impossible_time``, never a speedup; ``too_slow`` if the speedup over eager is below
   ``min_speedup``.

A hang gives ``timed_out``, a dead child (an illegal address, a segfault) ``crashed`` with
its stderr; without a GPU, ``no_gpu`` at once; a failure of the evaluator's own code
``evaluator_error``.

This module checks the arguments, runs the child and settles the verdict; the child
(``child.py``) runs the solution and measures; ``verdict.py`` holds the Verdict and the
rules over measured times, as pure functions.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

from losslab import problems
from losslab.child_process import run_killable
from losslab.kernelbench.verdict import ADVICE, STATUSES, Verdict, judge_timing, speed_of_light
from losslab.measure.timing import FLUSH_BYTES

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


def output_file(json_path: str | os.PathLike) -> Path:
    """``json_path`` as an absolute path that a file can be written to (checked before any work).

    Raises:
        FileNotFoundError: its folder does not exist.
        ValueError: it is a directory, or the file or its folder is not writable.
    """
    path = Path(json_path).expanduser().resolve()
    if path.is_dir():
        raise ValueError(f"json_path: {path} is a directory; expected a file name")
    if not path.parent.is_dir():
        raise FileNotFoundError(f"json_path: the folder {path.parent} does not exist")
    if path.exists() and not os.access(path, os.W_OK):
        raise ValueError(f"json_path: {path} is not writable")
    if not path.exists() and not os.access(path.parent, os.W_OK):
        raise ValueError(f"json_path: cannot create a file in {path.parent} (not writable)")
    return path


def check_arguments(problem: str, size: str | tuple[int, int], dtype: str, trials: int, repeats: int,
                    timeout_s: float, device: str) -> tuple[int, int]:
    """Validate the options of :func:`evaluate`; returns the shape (rows, columns).

    Raises:
        ValueError: naming the first bad argument and what was expected.
    """
    spec = problems.get(problem)
    if isinstance(size, str):
        if size not in spec.sizes:
            raise ValueError(f"size: {problem} has no size {size!r}; expected one of {', '.join(spec.sizes)} "
                             "or (rows, columns)")
        shape = tuple(spec.sizes[size])
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
    return shape


def _child_env(build_dir: Path) -> dict[str, str]:
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


def run_child(config: dict, work: Path, build_dir: Path, timeout_s: float) -> tuple[dict, str, int | None]:
    """Run the child on ``config`` in ``work``; returns (its last result, its stderr, its exit code
    or None if it was killed at ``timeout_s``). The child's whole process group (ninja, nvcc,
    anything it started) is killed when it ends or times out."""
    result_path = Path(config["result"])
    (work / "config.json").write_text(json.dumps(config))
    with open(work / "stdout.txt", "wb") as out, open(work / "stderr.txt", "wb") as err:
        returncode = run_killable([sys.executable, "-m", "losslab.kernelbench.child", str(work / "config.json")],
                                  cwd=work, env=_child_env(build_dir), stdout=out, stderr=err, timeout_s=timeout_s)
    stderr = (work / "stderr.txt").read_bytes().decode(errors="replace")
    try:
        result = json.loads(result_path.read_text())
    except (OSError, ValueError):
        result = {"status": "running", "stage": "start"}
    return result, stderr, returncode


def conclude(verdict: Verdict, stderr: str, returncode: int | None, timeout_s: float,
             min_speedup: float | None) -> Verdict:
    """Settle ``verdict`` (the child's last word): a timeout, a dead child, or the timing rules."""
    if returncode is None:
        verdict.status = "timed_out"
        verdict.message = f"no result after {timeout_s:g} s; it was in stage {verdict.stage!r} (killed)"
        verdict.detail = stderr[-4000:]
    elif verdict.status == "running":  # the child died before writing a verdict
        how = f"killed by signal {-returncode}" if returncode < 0 else f"exit code {returncode}"
        last = next((line for line in reversed(stderr.strip().splitlines()) if line.strip()), "")
        verdict.status = "crashed"
        verdict.message = f"the process died ({how}) in stage {verdict.stage!r}" + (f": {last[:300]}" if last else "")
        verdict.detail = stderr[-4000:]
    elif verdict.status == "passed" and verdict.timing and "solution_ms" in verdict.timing:
        floor = speed_of_light(verdict.problem, verdict.shape, verdict.dtype, verdict.device)
        if floor is not None:
            verdict.timing["floor_ms"] = floor.ms
        judged = judge_timing(verdict.timing, floor, min_speedup)
        if judged:
            verdict.status, verdict.message = judged
            if verdict.status == "impossible_time":  # an artifact is never reported as a speedup
                for key in ("speedup_eager", "speedup_compile"):
                    verdict.timing.pop(key, None)
    return verdict


def evaluate(solution_path: str | os.PathLike, problem: str, *, size: str | tuple[int, int] = "seed",
             dtype: str = "float32", trials: int = 5, repeats: int = 20, seed: int = 0,
             timeout_s: float = 600.0, compare_compile: bool = True, min_speedup: float | None = None,
             build_dir: str | os.PathLike | None = None, device: str = "cuda",
             json_path: str | os.PathLike | None = None) -> Verdict:
    """Judge ``solution_path``'s ``ModelNew`` against ``problem``'s reference, in a child process.

    Args:
        solution_path: a Python file defining ``class ModelNew(nn.Module)`` whose forward takes
            the reference's inputs (e.g. predictions (B, D), targets (B, D) for kl_div).
        problem: a problem name (``python -m losslab list``).
        size: a size name of the problem (default "seed", KernelBench's) or (rows, columns).
        dtype: the floating inputs' dtype name: "float32", "bfloat16" or "float16".
        trials: correctness trials, each on fresh inputs seeded ``seed + trial``.
        repeats: timed calls per implementation, each on fresh inputs (median reported, in ms).
        timeout_s: wall-clock limit in seconds for the whole child (build included).
        compare_compile: also time ``torch.compile`` of the reference.
        min_speedup: if set, a correct solution slower than ``min_speedup`` x eager is ``too_slow``.
        build_dir: the child's TORCH_EXTENSIONS_DIR; default a fresh temporary one (isolated,
            so the build starts from scratch every time).
        device: "cuda"; "cpu" is a dry run of load, correctness, backward, repeatability and
            the tampering check on CPU tensors, with no memory or timing (for testing the
            evaluator itself and Python-only solutions; a CUDA solution fails there).
        json_path: if given, the verdict is also written there as JSON.

    Returns a Verdict; never raises for anything the solution does, and never hangs past
    ``timeout_s`` (plus a few seconds to kill the child).

    Raises (before anything is run):
        FileNotFoundError: ``solution_path`` does not exist, or ``json_path``'s folder does not.
        ValueError: ``solution_path`` is a directory or not a .py file; ``json_path`` is a
            directory or not writable; unknown problem, size, dtype or device; trials/repeats
            < 1; timeout_s <= 0.
    """
    import torch

    path = solution_file(solution_path)
    out = output_file(json_path) if json_path is not None else None
    shape = check_arguments(problem, size, dtype, trials, repeats, timeout_s, device)
    fields = dict(problem=problem, solution=path.name, shape=shape, dtype=dtype)
    if device == "cuda" and not torch.cuda.is_available():
        verdict = Verdict("no_gpu", **fields, message=f"no CUDA GPU is visible here (torch {torch.__version__}, "
                          f"CUDA build: {torch.version.cuda or 'no'}); nothing was run")
    else:
        start = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="losslab-evaluate-") as tmp:
            work = Path(tmp)
            config = dict(solution=str(path), problem=problem, shape=list(shape), dtype=dtype, trials=trials,
                          repeats=repeats, seed=seed, compile=compare_compile, flush_bytes=FLUSH_BYTES,
                          result=str(work / "result.json"), device=device)
            build = Path(build_dir).resolve() if build_dir else work / "torch_extensions"
            result, stderr, returncode = run_child(config, work, build, timeout_s)
        fields["seconds"] = time.monotonic() - start
        verdict = conclude(Verdict.from_child(result, **fields), stderr, returncode, timeout_s, min_speedup)
    if out is not None:
        out.write_text(json.dumps(verdict.as_dict(), indent=1))
    return verdict
