"""Grade a whole folder of KernelBench answers: one verdict per ``*.py`` file, one table, fast_p.

    python -m losslab evaluate answers/ --jobs 4 --json grades.json --html grades.html
    report = evaluate_folder("answers/"); print(report.format())

Each answer goes through ``evaluate.evaluate`` (its own child, supervisor and time limit): the
checks of all answers run in parallel, the timing one answer at a time (:func:`evaluate_folder`).
"""
from __future__ import annotations

import ast
import html
import inspect
import json
import os
import re
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from losslab import problems
from losslab.kernelbench.evaluate import check_arguments, evaluate, output_file
from losslab.kernelbench.verdict import Verdict
from losslab.present.html import table

FAST_P = (0.0, 1.0, 1.5, 2.0)  # the thresholds KernelBench reports
CORRECT = ("passed", "too_slow")  # a correct answer; too_slow is correct but slower than asked
UNGRADED = "no_gpu"  # nothing ran: neither right nor wrong, so fast_p is unknown
JOBS = 4  # answers checked at once by default: each holds a child and its inputs on the GPU
PROBLEM_COMMENT = re.compile(r"^#\s*problem:\s*(\S+)", re.MULTILINE)


def fast_p(results: Sequence[tuple[bool | None, float | None]], p: float) -> float | None:
    """KernelBench's fast_p: the fraction of ALL answers that are correct and whose speedup over
    the reference (PyTorch eager) is greater than ``p`` (Ouyang et al., "KernelBench", arXiv
    2502.10517; ``fastp`` in KernelBench's src/score.py: correct answers with speedup > p, over
    all n). fast_0 is the fraction correct.

    Args:
        results: one (correct, or None where it was not graded; speedup over eager, or None where it
            was not timed) per answer.
        p: the threshold, >= 0.

    Returns the fraction in [0, 1]; None when an answer was not graded (no GPU ran it), or ``p`` > 0
    and a correct answer was not timed (a dry run): the fraction is then unknown, not 0.
    Raises ValueError for no results or p < 0.
    """
    if not results:
        raise ValueError("results: expected at least one answer")
    if not p >= 0:
        raise ValueError(f"p: expected a number >= 0, got {p!r}")
    fast = 0
    for correct, speedup in results:
        if correct is None or (correct and speedup is None and p > 0):
            return None
        if correct and (speedup is None or speedup > p):  # at p = 0 an untimed answer counts: any speedup is > 0
            fast += 1
    return fast / len(results)


def kernelbench_name(problem: problems.Problem) -> str | None:
    """KernelBench's name of ``problem`` ("98_KLDivLoss"), from the docstring of its KernelBench file."""
    path = problem.kernelbench_file
    doc = ast.get_docstring(ast.parse(path.read_text())) if path.is_file() else None
    found = re.search(r"\b\d+_[A-Za-z]\w*", doc or "")
    return found.group(0) if found else None


def detect_problem(path: Path) -> str:
    """The problem an answer file names, read from its text (never imported), in this order:
    a comment line ``# problem: NAME``; a module-level ``PROBLEM = "NAME"`` (``losslab export``
    writes it); KernelBench's name of a problem ("98_KLDivLoss") in the file's text or name, or
    a file name that is a problem's name or starts with it and "_".

    Raises:
        ValueError: the comment names no known problem, or no rule (or more than one problem) matched.
    """
    text = path.read_text(errors="replace")
    names = problems.names()
    named = PROBLEM_COMMENT.findall(text)
    if named:
        if named[0] not in names:
            raise ValueError(f"answer {path.name}: its '# problem:' comment names {named[0]!r}; expected one of "
                             f"{', '.join(names)}")
        return named[0]
    found = set(_assigned_problem(text)) & set(names)
    if not found:
        found = {p.name for p in problems.registered() if (kernelbench_name(p) or "\0") in text + path.name
                 or path.stem == p.name or path.stem.startswith(p.name + "_")}
    if len(found) != 1:
        which = f"it could be {' or '.join(sorted(found))}" if found else "it names none"
        raise ValueError(f"answer {path.name}: cannot tell its problem ({which}); add a line '# problem: NAME', "
                         "or give --problem or --problems")
    return found.pop()


def _assigned_problem(text: str) -> list[str]:
    """The strings assigned to ``PROBLEM`` at module level ([] if the file does not parse)."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return []
    return [node.value.value for node in tree.body if isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "PROBLEM" for t in node.targets)
            and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)]


def answers(folder: str | os.PathLike, problem: str | None = None,
            problem_map: dict[str, str] | None = None) -> list[tuple[Path, str]]:
    """Each ``*.py`` file of ``folder`` (not its subfolders), sorted, with its problem:
    ``problem_map[file name]`` if given there, else ``problem`` if given, else :func:`detect_problem`.

    Raises:
        FileNotFoundError: no such folder.
        ValueError: not a folder, no .py file in it, a map entry for a file that is not there,
            an unknown problem, or an answer whose problem cannot be told.
    """
    path = Path(folder).expanduser().resolve()
    if not path.exists():
        raise FileNotFoundError(f"folder: no folder {path}")
    if not path.is_dir():
        raise ValueError(f"folder: {path} is not a folder")
    files = sorted(f for f in path.glob("*.py") if f.is_file())
    if not files:
        raise ValueError(f"folder: {path} holds no .py answers" + ("" if any(path.iterdir()) else " (it is empty)"))
    problem_map = dict(problem_map or {})
    missing = sorted(set(problem_map) - {f.name for f in files})
    if missing:
        raise ValueError(f"problems: {', '.join(missing)} is not a .py answer in {path}")
    for name in [problem, *problem_map.values()]:
        if name is not None:
            problems.get(name)  # ValueError naming the known problems
    return [(f, problem_map.get(f.name) or problem or detect_problem(f)) for f in files]


def read_problem_map(path: str | os.PathLike) -> dict[str, str]:
    """A JSON object {answer file name: problem name} (the ``--problems`` file).

    Raises:
        FileNotFoundError: no such file. ValueError: not JSON, or not an object of strings.
    """
    try:
        loaded = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"problems: no file {path}") from None
    except (ValueError, UnicodeDecodeError) as err:
        raise ValueError(f"problems: {path} is not JSON ({err})") from None
    if not isinstance(loaded, dict) or not all(isinstance(v, str) for v in loaded.values()):
        raise ValueError(f'problems: expected a JSON object of answer file name -> problem name, '
                         f'e.g. {{"a.py": "{problems.names()[0]}"}}')
    return loaded


@dataclass
class Graded:
    """One answer's verdict, and what the table shows of it."""

    answer: str
    verdict: Verdict

    @property
    def correct(self) -> bool | None:
        """Whether the answer is correct; None where it was not graded (no GPU ran it)."""
        return None if self.verdict.status == UNGRADED else self.verdict.status in CORRECT

    @property
    def speedup(self) -> float | None:
        """Eager's time over the answer's (None where it was not timed, or the time is an artifact)."""
        return (self.verdict.timing or {}).get("speedup_eager") if self.correct else None

    @property
    def speed_of_light_pct(self) -> float | None:
        """The speed-of-light floor over the answer's time, in % (None without a floor or a time)."""
        timing = self.verdict.timing or {}
        if not self.correct or "floor_ms" not in timing or not timing.get("solution_ms"):
            return None
        return 100.0 * timing["floor_ms"] / timing["solution_ms"]

    def row(self) -> dict:
        """The table's row, and the whole verdict under "verdict"."""
        return {"answer": self.answer, "problem": self.verdict.problem, "status": self.verdict.status,
                "speedup_eager": self.speedup, "speed_of_light_pct": self.speed_of_light_pct,
                "message": self.verdict.message, "verdict": self.verdict.as_dict()}


@dataclass
class FolderReport:
    """The verdicts of a folder's answers, in file-name order."""

    folder: str
    graded: list[Graded]

    def fast_p(self) -> dict[str, float | None]:
        """{"0": fast_0, "1": fast_1, "1.5": fast_1.5, "2": fast_2} (:func:`fast_p`)."""
        results = [(g.correct, g.speedup) for g in self.graded]
        return {f"{p:g}": fast_p(results, p) for p in FAST_P}

    def as_dict(self) -> dict:
        return {"folder": self.folder, "fast_p": self.fast_p(), "answers": [g.row() for g in self.graded]}

    def _cells(self) -> list[list[str]]:
        return [[g.answer, g.verdict.problem, g.verdict.status,
                 "-" if g.speedup is None else f"{g.speedup:.2f}x",
                 "-" if g.speed_of_light_pct is None else f"{g.speed_of_light_pct:.0f} %",
                 g.verdict.message.splitlines()[0][:100] if g.verdict.message else ""] for g in self.graded]

    def summary(self) -> str:
        shown = "  ".join(f"fast_{p} = {'-' if v is None else f'{v:.2f}'}" for p, v in self.fast_p().items())
        count = f"{len(self.graded)} answer{'s' if len(self.graded) != 1 else ''}"
        return (f"{shown}  ({count}; fast_p: the fraction correct and faster than eager "
                "by more than p; '-': not timed or not graded)")

    def format(self) -> str:
        """The table as plain text, then fast_p."""
        head = ["answer", "problem", "verdict", "speedup", "% speed of light", "why"]
        rows = [head, *self._cells()]
        widths = [max(len(r[i]) for r in rows) for i in range(len(head) - 1)]

        def line(cells: list[str]) -> str:  # text columns left-aligned, numbers right, "why" as it comes
            padded = [c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(cells[:-1], widths,
                                                                                          strict=True))]
            return "  ".join([*padded, cells[-1]]).rstrip()

        return "\n".join([*map(line, rows), "", self.summary()])

    def html(self) -> str:
        """A standalone HTML page: the table, fast_p, then each answer's full report (folded)."""
        head = ["answer", "problem", "verdict", "speedup over eager", "% of the speed of light", "why"]
        body = [[*map(html.escape, row[:-1]), f'<div style="text-align:left">{html.escape(row[-1])}</div>']
                for row in self._cells()]
        title = html.escape(f"KernelBench answers in {self.folder}")
        return (f'<!doctype html>\n<html><head><meta charset="utf-8"><title>{title}</title></head><body>\n'
                f"<h1>{title}</h1>\n{table(head, body, text_columns=3)}\n"
                f"<p>{html.escape(self.summary())}</p>\n"
                + "".join(f"<details><summary>{html.escape(g.answer)}: {html.escape(g.verdict.status)}</summary>"
                          f"<pre>{html.escape(g.verdict.format())}</pre></details>\n" for g in self.graded)
                + "</body></html>\n")


def evaluate_folder(folder: str | os.PathLike, problem: str | None = None, problem_map: dict[str, str] | None = None,
                    *, jobs: int = JOBS, json_path: str | os.PathLike | None = None,
                    html_path: str | os.PathLike | None = None, device: str = "cuda",
                    progress: Callable[[str], None] | None = None, **options) -> FolderReport:
    """Grade every ``*.py`` answer of ``folder`` (problems as :func:`answers` finds them).

    First every answer's checks (load, correctness, backward, repeatability, tampering) run,
    ``jobs`` answers at a time, each in its own child (``evaluate(..., timed=False)``); then the
    answers that passed are evaluated again one at a time, timing included, so that no timing
    contends with another answer (their checks run again, on fresh secret inputs; the build is
    reused from the first pass). Every answer keeps the evaluator's protections: its own child
    under a supervisor, its own time limit, the parent's verdict; one that crashes, hangs or
    breaks its CUDA context gets that verdict and the others are still graded. ``device="cpu"``
    is the dry run of the checks only (``evaluate``).

    Args:
        options: passed to ``evaluate`` for every answer (size, dtype, trials, repeats, seed,
            timeout_s (per answer), compare_compile, min_speedup).
        json_path, html_path: if given, the report is also written there (JSON, HTML page).
        progress: called with one line as each answer's verdict comes (e.g. print to stderr).

    Raises (before anything is run): FileNotFoundError and ValueError of :func:`answers`, of
    ``evaluate``'s options for any answer's problem, a bad ``json_path``/``html_path``, or ``jobs`` < 1;
    TypeError for an option ``evaluate`` does not take.
    """
    if not (isinstance(jobs, int) and jobs >= 1):
        raise ValueError(f"jobs: expected a positive whole number, got {jobs!r}")
    found = answers(folder, problem, problem_map)
    outputs = [output_file(p, name) if p is not None else None for p, name in ((json_path, "json_path"),
                                                                             (html_path, "html_path"))]
    parameters = inspect.signature(evaluate).parameters
    unknown = sorted(set(options) - set(parameters) | set(options) & {"solution_path", "problem", "build_dir",
                                                                       "json_path", "timed"})
    if unknown:
        raise TypeError(f"options: evaluate_folder passes no {', '.join(unknown)} to evaluate")
    settings = {**{k: p.default for k, p in parameters.items() if p.default is not p.empty}, **options}
    specs = {name: problems.get(name) for _, name in found}  # answers() checked each name
    for spec in specs.values():
        check_arguments(spec, settings["size"], settings["dtype"], settings["trials"], settings["repeats"],
                        settings["timeout_s"], device, settings["min_speedup"])
    with tempfile.TemporaryDirectory(prefix="losslab-evaluate-folder-") as tmp:
        def grade(index: int, timed: bool) -> Verdict:
            path, name = found[index]
            verdict = evaluate(path, specs[name], device=device, timed=timed, build_dir=Path(tmp) / str(index),
                               **options)
            if progress is not None:
                later = not timed and verdict.passed and device == "cuda"
                progress(f"{path.name}: {verdict.status}" + (" (correct; timed later, one at a time)" if later else ""))
            return verdict

        with ThreadPoolExecutor(max_workers=jobs) as pool:
            verdicts = list(pool.map(lambda i: grade(i, False), range(len(found))))
        if device == "cuda":
            torch.cuda.empty_cache()  # the parallel pass's references: memory the timed answers can use
            verdicts = [grade(i, True) if v.passed else v for i, v in enumerate(verdicts)]
    graded = [Graded(path.name, verdict) for (path, _), verdict in zip(found, verdicts, strict=True)]
    report = FolderReport(str(Path(folder)), graded)
    if outputs[0] is not None:
        outputs[0].write_text(json.dumps(report.as_dict(), indent=1))
    if outputs[1] is not None:
        outputs[1].write_text(report.html())
    return report
