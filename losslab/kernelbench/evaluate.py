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

1. load and build the file (``compile_error`` with the compiler's message; ``raised``);
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
5. timing (``bench.time_cuda``: CUDA events, warm-up, L2 flush outside the timed region,
   median over ``repeats``) of the solution, PyTorch eager and ``torch.compile`` on the same
   inputs; ``too_slow`` if the speedup over eager is below ``min_speedup``.

A hang gives ``timed_out``, a dead child (an illegal address, a segfault) ``crashed`` with
its stderr; without a GPU, ``no_gpu`` at once.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from losslab import problems
from losslab.measure.bench import FLUSH_BYTES

STATUSES = ("passed", "compile_error", "raised", "wrong_shape", "wrong_values", "too_slow",
            "timed_out", "crashed", "no_gpu")
# What a person can do about each failure.
ADVICE = {
    "compile_error": "Fix the build error shown below (nvcc/g++ output from load_inline).",
    "raised": "The solution raised; the traceback below shows where.",
    "wrong_shape": "Return exactly the reference's shape: a 0-d tensor for a mean loss "
                   "(e.g. out.reshape(()) rather than a (1,) buffer).",
    "wrong_values": "Compare with the definition (../DESIGN.md, the problem module's docstring); "
                    "replay the failing trial with problem.make_inputs(shape, seed=SEED). For kl_div, "
                    "batchmean divides by the batch size B only, not B * D.",
    "too_slow": "Correct, but slower than required against PyTorch eager; see the times below.",
    "timed_out": "The solution did not finish in time. Look for an infinite loop or a kernel that never "
                 "exits; a first build with torch headers can also take minutes (raise timeout_s).",
    "crashed": "The process died. An illegal memory access usually means an out-of-bounds index: run "
               "the solution under compute-sanitizer; the stderr tail is below.",
    "no_gpu": "Evaluation runs the solution's kernels and needs a CUDA GPU; run it on a GPU machine.",
}


@dataclass
class Verdict:
    """The outcome of one evaluation.

    Attributes:
        status: one of STATUSES; ``passed`` only if every check passed.
        message: one line saying why (empty when passed).
        detail: the compiler's output, the traceback or the child's stderr tail.
        stage: how far the child got (load, construct, correctness, backward, repeatability,
            memory, timing, done).
        trials: per correctness trial: seed, output shape, value, reference, max_abs_diff,
            allclose, rel_error_fp64 (against the float64 reference).
        backward: {"supported": bool, "rel_error", "tolerance", "passed"} or None if not reached.
        timing: milliseconds (``solution_ms``, ``eager_ms``, ``compile_ms`` and their p10/p90) and
            ``speedup_eager``/``speedup_compile`` (peer time over solution time).
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
    def from_child(cls, result: dict, **fields) -> "Verdict":
        """A verdict from the child's JSON ``result`` plus ``fields`` (problem, solution, shape, ...)."""
        known = {k: v for k, v in result.items() if k in cls.__dataclass_fields__}
        return cls(**{**known, **fields})

    def format(self) -> str:
        """A human-readable report: the verdict, the reason and what to do, then the measurements."""
        rows, cols = self.shape
        head = (f"{self.solution}: {self.status.upper().replace('_', ' ')} "
                f"({self.problem} {rows}x{cols} {self.dtype}{', ' + self.device if self.device else ''})")
        lines = [head]
        if not self.passed:
            lines.append(f"  reason: {self.message or 'see below'}" + (f" [stage: {self.stage}]" if self.stage else ""))
            lines.append(f"  what to do: {ADVICE.get(self.status, '')}")
        compared = [t for t in self.trials if "allclose" in t]
        if compared:
            ok = [t for t in compared if t["allclose"]]
            worst = max(t["max_abs_diff"] for t in compared)
            errors = [t["rel_error_fp64"] for t in compared]
            lines.append(f"  correctness: {len(ok)}/{len(compared)} trials match (torch.allclose); "
                         f"max |diff| {worst:.3g}"
                         + (f"; relative error vs float64 up to {max(errors):.2g}" if errors else ""))
        if self.backward is not None:
            b = self.backward
            if not b.get("supported"):
                lines.append("  backward: not supported (the output does not require grad)")
            else:
                lines.append(f"  backward: relative error vs float64 {b.get('rel_error', float('nan')):.2g} "
                             f"(tolerance {b.get('tolerance', float('nan')):g}) "
                             f"{'ok' if b.get('passed') else 'FAILED ' + b.get('detail', '')}".rstrip())
        if self.repeatable is not None:
            lines.append(f"  bitwise repeatable: {'yes' if self.repeatable else 'NO (outputs differ between runs)'}")
        if self.memory:
            lines.append(f"  peak extra memory: {_bytes(self.memory['solution_bytes'])} "
                         f"(eager {_bytes(self.memory['eager_bytes'])})")
        if self.timing:
            t = self.timing
            parts = [f"{t['solution_ms']:.4g} ms (median of {t.get('repeats')}, "
                     f"p10-p90 {t['solution_p10_ms']:.4g}-{t['solution_p90_ms']:.4g})"]
            for peer, label in (("eager", "eager"), ("compile", "torch.compile")):
                if f"{peer}_ms" in t:
                    parts.append(f"{label} {t[f'{peer}_ms']:.4g} ms, speedup {t[f'speedup_{peer}']:.2f}x")
            if "compile_error" in t:
                parts.append(f"torch.compile failed: {t['compile_error']}")
            lines.append("  time: " + "; ".join(parts))
        if self.solution_inputs:
            for name, value in self.solution_inputs.items():
                shown = "absent" if value is None else (", ".join(value) if isinstance(value, list) else value)
                lines.append(f"  file's {name}(): {shown or '[]'} (reported; the problem's inputs were used)")
        if self.detail and not self.passed:
            lines_ = self.detail.strip().splitlines()
            # a compiler's first errors matter most; a traceback's last lines
            tail = lines_[:40] if self.status == "compile_error" else lines_[-40:]
            lines.append("  details:\n" + "\n".join("    " + line for line in tail))
        return "\n".join(lines)


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def _child_env(work: Path, build_dir: Path) -> dict[str, str]:
    """The child's environment: the caller's, with its own build cache and losslab importable."""
    env = dict(os.environ)
    env["TORCH_EXTENSIONS_DIR"] = str(build_dir)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                         *filter(None, [os.environ.get("PYTHONPATH")])])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if "CUDA_HOME" not in env:  # torch guesses wrong next to an nvcc wrapper script (DESIGN.md)
        try:
            from losslab.build import find_cuda_home

            env["CUDA_HOME"] = str(find_cuda_home())
        except Exception:  # noqa: BLE001 - no toolkit: the solution's build says so itself
            pass
    return env


def evaluate(solution_path: str | os.PathLike, problem: str, *, size: str | tuple[int, int] = "seed",
             dtype: str = "float32", trials: int = 5, repeats: int = 20, seed: int = 0,
             timeout_s: float = 600.0, compare_compile: bool = True, min_speedup: float | None = None,
             build_dir: str | os.PathLike | None = None, device: str = "cuda") -> Verdict:
    """Judge ``solution_path``'s ``ModelNew`` against ``problem``'s reference, in a child process.

    Args:
        solution_path: a Python file defining ``class ModelNew(nn.Module)`` whose forward takes
            the reference's inputs (e.g. predictions (B, D), targets (B, D) for kl_div).
        problem: a problem name (``python -m losslab list``).
        size: a size name of the problem (default "seed", KernelBench's) or (rows, columns).
        dtype: the floating inputs' dtype name: "float32", "bfloat16" or "float16".
        trials: correctness trials, each on fresh inputs seeded ``seed + trial``.
        repeats: timed calls per implementation (median reported, in milliseconds).
        timeout_s: wall-clock limit in seconds for the whole child (build included).
        compare_compile: also time ``torch.compile`` of the reference.
        min_speedup: if set, a correct solution slower than ``min_speedup`` x eager is ``too_slow``.
        build_dir: the child's TORCH_EXTENSIONS_DIR; default a fresh temporary one (isolated,
            so the build starts from scratch every time).
        device: "cuda"; "cpu" is a dry run of load, correctness, backward and repeatability
            on CPU tensors with no memory or timing (for testing the evaluator itself and
            Python-only solutions; a CUDA solution fails there).

    Returns a Verdict; never raises for anything the solution does, and never hangs past
    ``timeout_s`` (plus a few seconds to kill the child).

    Raises:
        FileNotFoundError: ``solution_path`` does not exist.
        ValueError: unknown problem, size, dtype, or trials/repeats < 1.
    """
    import torch

    path = Path(solution_path).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"solution_path: no file {path}")
    spec = problems.get(problem)
    if isinstance(size, str):
        if size not in spec.sizes:
            raise ValueError(f"size: {problem} has no size {size!r}; expected one of {', '.join(spec.sizes)} "
                             "or (rows, columns)")
        shape = spec.sizes[size]
    else:
        shape = tuple(int(n) for n in size)
    if dtype not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"dtype: expected float32, bfloat16 or float16, got {dtype!r}")
    if trials < 1 or repeats < 1:
        raise ValueError(f"trials, repeats: expected at least 1, got {trials}, {repeats}")
    fields = dict(problem=problem, solution=path.name, shape=shape, dtype=dtype)
    if device not in ("cuda", "cpu"):
        raise ValueError(f"device: expected 'cuda' or 'cpu', got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        return Verdict("no_gpu", **fields, message=f"no CUDA GPU is visible here (torch {torch.__version__}, "
                       f"CUDA build: {torch.version.cuda or 'no'}); nothing was run")

    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="losslab-evaluate-") as tmp:
        work = Path(tmp)
        result_path = work / "result.json"
        config = dict(solution=str(path), problem=problem, shape=list(shape), dtype=dtype, trials=trials,
                      repeats=repeats, seed=seed, compile=compare_compile, flush_bytes=FLUSH_BYTES,
                      result=str(result_path), device=device)
        (work / "config.json").write_text(json.dumps(config))
        build = Path(build_dir).resolve() if build_dir else work / "torch_extensions"
        with open(work / "stdout.txt", "wb") as out, open(work / "stderr.txt", "wb") as err:
            child = subprocess.Popen([sys.executable, "-m", "losslab.kernelbench.child", str(work / "config.json")],
                                     cwd=work, env=_child_env(work, build), stdin=subprocess.DEVNULL,
                                     stdout=out, stderr=err, start_new_session=True)
            try:
                returncode = child.wait(timeout=timeout_s)
                timed_out = False
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:  # the child's whole group (ninja, nvcc, anything it started), by its id
                try:
                    os.killpg(child.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                child.wait()
        stderr = (work / "stderr.txt").read_bytes().decode(errors="replace")
        try:
            result = json.loads(result_path.read_text())
        except (OSError, ValueError):
            result = {"status": "running", "stage": "start"}
    fields["seconds"] = time.monotonic() - start
    verdict = Verdict.from_child(result, **fields)
    if timed_out:
        verdict.status = "timed_out"
        verdict.message = f"no result after {timeout_s:g} s; it was in stage {verdict.stage!r} (killed)"
        verdict.detail = stderr[-4000:]
    elif verdict.status == "running":  # the child died before writing a verdict
        how = f"killed by signal {-returncode}" if returncode < 0 else f"exit code {returncode}"
        last = next((l for l in reversed(stderr.strip().splitlines()) if l.strip()), "")
        verdict.status = "crashed"
        verdict.message = f"the process died ({how}) in stage {verdict.stage!r}" + (f": {last[:300]}" if last else "")
        verdict.detail = stderr[-4000:]
    elif verdict.status == "passed" and min_speedup is not None and verdict.timing:
        speedup = verdict.timing.get("speedup_eager", 0.0)
        if speedup < min_speedup:
            verdict.status = "too_slow"
            verdict.message = f"speedup over eager {speedup:.2f}x is below the required {min_speedup:g}x"
    return verdict
