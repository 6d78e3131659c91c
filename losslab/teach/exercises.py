"""Graded exercises that follow the ladder: a skeleton to complete, a grader, a solution.

    from losslab.teach import exercises
    exercises.task("coalesce")          # what to do, and the skeleton's source
    exercises.grade("coalesce")         # compile, machine code, and (on a GPU) the checks

Each exercise is a CUDA file under ``exercises/<problem>/`` that compiles but fails the
check until its ``FILL ME IN`` is done; its solution is under
``exercises/solutions/<problem>/``. Both define the launchers of a custom variant
(``losslab.teach.custom``); the backward is a shipped rung's. A grade is green when the
source compiles, its machine code shows the rung's idea (where an opcode shows it) and
every check against the float64 reference passes. On a GPU the checks run in a child
process with a time limit (``custom.check``): a kernel that hangs or faults (a misaligned
float4 load) is graded red with what happened, and the notebook's CUDA context stays
usable. Without a GPU the grade compiles the source, reads its SASS and says that the
checks need a GPU.
"""
from __future__ import annotations

import html
from dataclasses import dataclass, field
from pathlib import Path

import torch

from losslab import build
from losslab.present.html import Html
from losslab.teach import custom
from losslab.teach.custom.evaluation import CHECK_TIMEOUT_S

ROOT = build.ROOT / "exercises"
SIZES = ("small", "odd", "narrow", "scalar")  # graded sizes: aligned, odd, few rows, one element


@dataclass(frozen=True)
class Exercise:
    """One exercise: ``key`` names its files, ``rung`` the shipped rung it rebuilds,
    ``sass`` the opcodes its machine code must show when done."""

    key: str
    problem: str
    rung: str
    title: str
    task: str
    sass: tuple[str, ...] = ()

    @property
    def skeleton(self) -> Path:
        return ROOT / self.problem / f"{self.key}.cu"

    @property
    def solution(self) -> Path:
        return ROOT / "solutions" / self.problem / f"{self.key}.cu"


EXERCISES = (
    Exercise("coalesce", "kl_div", "shared_memory", "Coalesce the naive row loop",
             "Give each row a block and let thread k read elements k, k + 256, ...: a warp then "
             "reads 32 consecutive floats (one 128-byte line) instead of 32 lines D floats apart."),
    Exercise("warp_shuffle", "kl_div", "warp_shuffle", "Replace the shared-memory tree with warp shuffles",
             "Write warp_sum: five __shfl_xor_sync steps (offsets 16, 8, 4, 2, 1) leave the warp's sum "
             "in every lane, with no shared memory and no barrier.", ("SHFL.BFLY",)),
    Exercise("vectorize", "kl_div", "vectorized", "Vectorize the loads, with a correct tail",
             "Read the aligned middle of each row with float4 loads (16 bytes per instruction) and "
             "finish the elements after the last whole float4 one at a time.", ("LDG.E.128",)),
)


def get(key: str) -> Exercise:
    """The exercise called ``key``. Raises ValueError for an unknown key."""
    for exercise in EXERCISES:
        if exercise.key == key:
            return exercise
    raise ValueError(f"exercise: no exercise {key!r}; expected one of {', '.join(e.key for e in EXERCISES)}")


def _pre(text: str) -> str:
    return f'<pre style="font-size:11px;white-space:pre;overflow-x:auto">{html.escape(text)}</pre>'


def task(key: str) -> Html:
    """The exercise's task and its skeleton's source (with its path, to open and edit)."""
    e = get(key)
    path = e.skeleton.relative_to(build.ROOT)
    plain = f"{e.title}\n{e.task}\nEdit {path}:\n\n{e.skeleton.read_text()}"
    body = (f"<p><b>{html.escape(e.title)}</b> (the <code>{e.rung}</code> rung). {html.escape(e.task)} "
            f"Edit <code>{path}</code>, then run the grade cell.</p>" + _pre(e.skeleton.read_text()))
    return Html(body, plain)


@dataclass
class Grade:
    """The outcome of grading one source.

    ``compiled``: nvcc accepted it (else ``compile_error``); ``sass``: opcode -> found in its
    machine code (empty when cuobjdump is missing or nothing is asked); ``checks``: the
    CheckResults (None when they could not run, ``note`` says why); ``fault``: the child's
    verdict when the kernel hung or faulted (the checks then stopped); ``passed``: all green.
    """

    key: str
    path: str
    compiled: bool
    compile_error: str = ""
    sass: dict[str, bool] = field(default_factory=dict)
    checks: list | None = None
    note: str = ""
    fault: str = ""

    @property
    def passed(self) -> bool:
        return (self.compiled and all(self.sass.values()) and self.checks is not None
                and all(c.passed for c in self.checks))

    def lines(self) -> list[str]:
        """The grade as lines of text."""
        out = [f"{self.key}: {self.path}"]
        if not self.compiled:
            return out + ["  does not compile:", *("    " + line for line in self.compile_error.splitlines())]
        out.append("  compiles (nvcc)")
        for opcode, found in self.sass.items():
            out.append(f"  machine code shows {opcode}: {'yes' if found else 'NO'}")
        if self.fault:
            out.append("  checks: stopped, the kernel did not finish:")
            out += ["    " + line for line in self.fault.splitlines()]
        elif self.checks is None:
            out.append(f"  checks: not run ({self.note})")
        else:
            failed = [c for c in self.checks if not c.passed]
            out.append(f"  checks: {len(self.checks) - len(failed)} of {len(self.checks)} passed")
            for c in failed[:8]:
                out.append(f"    FAIL {c.direction} {c.case}: error {c.error:.2e} > {c.tolerance:.0e} "
                           f"{c.detail}".rstrip())
        waiting = self.checks is None and not self.fault and self.compiled and all(self.sass.values())
        verdict = "GREEN: done" if self.passed else "not graded yet" if waiting else "RED: not yet"
        return out + [f"  {verdict}"]

    def _repr_mimebundle_(self, include=None, exclude=None):
        text = "\n".join(self.lines())
        waiting = self.checks is None and not self.fault and self.compiled
        color = "#060" if self.passed else "#a40" if waiting else "#b00"
        return {"text/plain": text, "text/html": f'<pre style="color:{color}">{html.escape(text)}</pre>'}


def grade(key: str, source: str | None = None, *, solution: bool = False, gpu: bool | None = None,
          sizes: tuple[str, ...] = SIZES, edge_cases: bool = True,
          timeout_s: float = CHECK_TIMEOUT_S) -> Grade:
    """Grade exercise ``key``: the skeleton file as it is now (your edits), or ``source``,
    or with ``solution=True`` the solution file.

    Compiles with nvcc, reads the machine code for the exercise's opcodes (when cuobjdump
    is available) and, on a GPU (``gpu`` None: when one is visible), builds the variant and
    checks it forward and backward at ``sizes`` and on the edge cases, in a child process
    killed after ``timeout_s`` seconds. Never raises for a wrong source: a compile error, a
    hang or a fault is part of the grade.

    Raises:
        ValueError: unknown exercise.
        build.BuildError: nvcc is missing here.
    """
    e = get(key)
    path = e.solution if solution else e.skeleton
    label = "your source" if source is not None else str(path.relative_to(build.ROOT))
    source = path.read_text() if source is None else source
    try:
        compiled = custom.check_source(e.problem, source, e.key)
    except custom.CustomCompileError as err:
        return Grade(key, label, False, str(err))
    except build.BuildError as err:  # no nvcc here: nothing can be graded
        return Grade(key, label, False, f"cannot compile on this machine: {err}")
    result = Grade(key, label, True)
    notes = []
    if e.sass:
        try:
            sass = compiled.sass()
            result.sass = {opcode: opcode in sass for opcode in e.sass}
        except (build.BuildError, OSError) as err:
            notes.append(f"machine code not read: {err}")
    gpu = torch.cuda.is_available() if gpu is None else gpu
    if not gpu:
        result.note = "; ".join([*notes, "the checks need a CUDA GPU and none is visible here"])
        return result
    try:
        variant = custom.compile_variant(e.problem, e.key, source)
    except build.BuildError as err:  # the link or the binding failed after nvcc's check passed
        return Grade(key, label, False, str(err), result.sass)
    run = custom.check(variant, sizes, edge_cases=edge_cases, seed=0, timeout_s=timeout_s)
    result.checks, result.fault = run.checks, "" if run.outcome.ok else run.outcome.format()
    return result
