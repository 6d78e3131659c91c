"""Run a participant's launchers in the CPU simulator and collect outputs or a structured failure.

    from losslab.teach.simulator import run
    outcome = run.run("exercises/kl_div/coalesce.cu")            # a path or the source text
    outcome.compiled, outcome.compile_error
    for r in outcome.results: r.case.name, r.loss, r.rows, r.grad, r.failure

Each case runs in a child process (the binary ``build.build`` makes) with a time limit; a
fault ends only the case it happened in: the next run starts at the case after it.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from losslab.teach.simulator import build
from losslab.teach.simulator import cases as case_lib

_ASAN = re.compile(r"ERROR: AddressSanitizer: ([\w-]+)(?: on (?:unknown )?address (0x[0-9a-f]+))?")
_ACCESS = re.compile(r"(READ|WRITE) of size (\d+) at (0x[0-9a-f]+)")
_UBSAN = re.compile(r"([^\s:]+):(\d+):\d+: runtime error: (.*)")
_FRAME = re.compile(r"#\d+ 0x[0-9a-f]+ in (.+?) (\S+?):(\d+)(?::\d+)?$", re.MULTILINE)


@dataclass
class Failure:
    """Why a case stopped: ``kind`` is one of misaligned, out_of_bounds, segv, timeout,
    barrier_divergence, shuffle_mask, shuffle_divergence, shuffle_exited, shuffle_source,
    deadlock, launch_error, crash. ``block``/``thread``: where the simulator was (None on
    the host); ``line``: the participant's line where known; ``buffer``: the buffer an
    out-of-bounds access touched and ``elements``: how far past its end (negative: before
    its start); ``report``: the raw sanitizer text."""

    kind: str
    message: str
    kernel: str = ""
    block: tuple[int, int, int] | None = None
    thread: tuple[int, int, int] | None = None
    file: str = ""
    line: int | None = None
    buffer: str = ""
    elements: int | None = None
    access: str = ""
    report: str = ""


@dataclass
class CaseResult:
    """One case's outputs (numpy: ``loss``, ``rows`` the per-row sums or losses, ``grad`` the
    backward's gradient, flat; ``extra`` e.g. cross_entropy's row_max; None where the run
    stopped before) and failure."""

    case: case_lib.Case
    loss: float | None = None
    rows: np.ndarray | None = None
    grad: np.ndarray | None = None
    forward_status: int | None = None
    backward_status: int | None = None
    failure: Failure | None = None
    extra: dict[str, np.ndarray | None] = field(default_factory=dict)  # a problem's other outputs

    @property
    def finished(self) -> bool:
        return self.failure is None and self.rows is not None


@dataclass
class Outcome:
    """A source's run: ``compiled`` (else ``compile_error``, g++'s text with the source's
    lines), one :class:`CaseResult` per case, and the launches seen (kernel, grid, block)."""

    label: str
    compiled: bool
    compile_error: str = ""
    results: list[CaseResult] = field(default_factory=list)
    launches: list[dict] = field(default_factory=list)

    @property
    def failures(self) -> list[Failure]:
        return [r.failure for r in self.results if r.failure is not None]


def source_text(source: str | os.PathLike, label: str | None = None) -> tuple[str, str]:
    """(text, label) of ``source``: a path (a PathLike, or a one-line str ending in .cu),
    labelled by its file name, else CUDA text labelled ``label`` (default "source.cu").
    Raises ValueError for a path that does not exist."""
    if isinstance(source, os.PathLike) or (isinstance(source, str) and "\n" not in source
                                           and source.endswith((".cu", ".cuh"))):
        path = Path(source)
        if not path.is_file():
            raise ValueError(f"source: no file {path}")
        return path.read_text(), path.name
    return str(source), label or "source.cu"


def _write_manifest(folder: Path, case_list: list[case_lib.Case], spec: case_lib.ProblemSpec) -> Path:
    lines = [str(len(case_list))]
    for i, c in enumerate(case_list):
        data = folder / f"in{i}.bin"
        targets = c.t if c.t.dtype == np.int64 else c.t.astype(np.float32)
        data.write_bytes(c.p.astype(np.float32).tobytes() + targets.tobytes())
        lines.append(spec.manifest_line(i, c, str(data)))
    manifest = folder / "manifest.txt"
    manifest.write_text("\n".join(lines) + "\n")
    return manifest


def _locate(address: int, buffers: list[dict]) -> tuple[str, int | None]:
    """The buffer nearest to ``address`` and how many 4-byte elements past its end (or
    before its start, negative) the address lies."""
    best = None
    for b in buffers:
        if address >= b["end"]:
            distance, elements = address - b["end"], (address - b["end"]) // 4 + 1
        elif address < b["start"]:
            distance, elements = b["start"] - address, -((b["start"] - address + 3) // 4)
        else:
            continue
        if best is None or distance < best[0]:
            best = (distance, b["name"], elements)
    return (best[1], best[2]) if best and best[0] < 4096 else ("", None)


def _shown(file: str) -> str:
    """A path as the participant knows it: their label, or kernels/... for a shipped file."""
    return "kernels/" + file.split("/kernels/", 1)[1] if "/kernels/" in file else Path(file).name


def _user_frame(report: str, label: str) -> tuple[str, int | None]:
    """The innermost stack frame in the participant's source, else in a shipped kernel file."""
    frames = _FRAME.findall(report)
    for _, file, line in frames:
        if Path(file).name == Path(label).name:
            return Path(file).name, int(line)
    for _, file, line in frames:
        if "/kernels/" in file:
            return _shown(file), int(line)
    return "", None


def _parse_failure(stderr: str, buffers: list[dict], label: str) -> Failure:
    """The failure a crashed child reported on stderr (simulator line, sanitizer report)."""
    sims = [json.loads(m) for m in re.findall(r"^@@SIM (\{.*\})$", stderr, re.MULTILINE)]
    position = next((s for s in sims if s["kind"] == "position"), {})
    where = {"kernel": position.get("kernel", ""),
             "block": tuple(position["block"]) if position.get("in_kernel") else None,
             "thread": tuple(position["thread"]) if position.get("in_kernel") else None}
    report = "\n".join(line for line in stderr.splitlines()
                       if not line.startswith("@@SIM") and "ASan doesn't fully support" not in line)
    own = next((s for s in sims if s["kind"] not in ("position", "timeout")), None)
    if own:
        return Failure(own["kind"], own["message"], own["kernel"],
                       tuple(own["block"]) if own["in_kernel"] else None,
                       tuple(own["thread"]) if own["in_kernel"] else None, own["file"], own["line"] or None)
    file, line = _user_frame(report, label)
    if any(s["kind"] == "timeout" for s in sims):
        return Failure("timeout", "the time limit ran out", **where, file=file, line=line, report=report)
    if (ub := _UBSAN.search(report)) is not None:
        kind = "misaligned" if "misaligned address" in ub[3] else "undefined_behaviour"
        return Failure(kind, ub[3], **where, file=file or _shown(ub[1]), line=line or int(ub[2]), report=report)
    if (asan := _ASAN.search(report)) is not None:
        access = _ACCESS.search(report)
        address = int(access[3], 16) if access else int(asan[2], 16) if asan[2] else None
        buffer, elements = _locate(address, buffers) if address is not None else ("", None)
        kind = "segv" if asan[1] in ("SEGV", "stack-overflow") else "out_of_bounds"
        return Failure(kind, asan[1], **where, file=file, line=line, buffer=buffer, elements=elements,
                       access=(access[1].lower() if access else ""), report=report)
    return Failure("crash", report.strip().splitlines()[-1] if report.strip() else "the run ended abnormally",
                   **where, file=file, line=line, report=report)


def _events(stdout: str) -> list[dict]:
    """The driver's JSON lines (a kernel's own printf output is skipped)."""
    events = []
    for line in stdout.splitlines():
        if line.startswith('{"event": '):
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return events


def _read_outputs(folder: Path, i: int, result: CaseResult, spec: case_lib.ProblemSpec) -> None:
    def load(name, dtype=np.float32):
        path = folder / f"{i}.{name}.bin"
        return np.fromfile(path, dtype) if path.exists() else None

    loss = load("loss")
    result.loss = float(loss[0]) if loss is not None and loss.size else None
    result.rows, result.grad = load("rows"), load("grad")
    result.extra = {name: load(name, dtype) for name, dtype in spec.extra_outputs}


def _run_from(exe: Path, manifest: Path, folder: Path, first: int, count: int, order: str, time_limit: float):
    env = dict(os.environ, SIM_ORDER=order, SIM_TIME_LIMIT=str(max(1, int(time_limit))),
               ASAN_OPTIONS="detect_leaks=0:detect_stack_use_after_return=0:print_summary=0:symbolize=1",
               UBSAN_OPTIONS="print_stacktrace=1:abort_on_error=1")
    try:
        proc = subprocess.run([str(exe), str(manifest), str(folder), str(first)], capture_output=True,
                              text=True, env=env, timeout=time_limit * (count - first) + 10)
        return proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as err:
        out = err.stdout.decode() if isinstance(err.stdout, bytes) else (err.stdout or "")
        return -9, out, "@@SIM {\"kind\": \"timeout\"}"


def run(source: str | os.PathLike, problem: str = case_lib.KL_DIV, case_list: list[case_lib.Case] | None = None, *,
        label: str | None = None, order: str = "forward", time_limit: float = 10.0) -> Outcome:
    """Compile ``source`` (a path to a .cu file, or CUDA text) for ``problem`` and run its
    launchers on ``case_list`` (default: the problem's cases in :mod:`cases`), each block's
    threads in ``order`` ("forward" or "reverse"), at most ``time_limit`` seconds a child.

    Never raises for a wrong source: a compile error, a fault or a hang is in the Outcome.
    Raises:
        ValueError: unknown problem or order, or a source path that does not exist.
        build.SimulatorError: g++ is missing or the simulator does not build here.
    """
    if problem not in case_lib.PROBLEMS:  # checked before the build, which also knows the problems
        raise ValueError(f"problem: the simulator knows {', '.join(case_lib.PROBLEMS)}, got {problem!r}")
    if order not in ("forward", "reverse"):
        raise ValueError(f"order: expected 'forward' or 'reverse', got {order!r}")
    text, label = source_text(source, label)
    spec = case_lib.PROBLEMS[problem]
    case_list = spec.cases() if case_list is None else case_list
    try:
        exe = build.build(problem, text, label)
    except build.CompileError as err:
        return Outcome(label, False, str(err))
    outcome = Outcome(label, True, results=[CaseResult(c) for c in case_list])
    with tempfile.TemporaryDirectory(prefix="losslab-sim-") as tmp:
        folder = Path(tmp)
        manifest = _write_manifest(folder, case_list, spec)
        first = 0
        while first < len(case_list):
            code, stdout, stderr = _run_from(exe, manifest, folder, first, len(case_list), order, time_limit)
            events = _events(stdout)
            current, buffers = first, []
            for e in events:
                if e["event"] == "case_begin":
                    current, buffers = e["case"], []
                elif e["event"] == "buffer":
                    buffers.append(e)
                elif e["event"] == "launch" and len(outcome.launches) < 64:
                    outcome.launches.append({k: e[k] for k in ("kernel", "grid", "block")} | {"case": current})
                elif e["event"] == "case_end":
                    result = outcome.results[e["case"]]
                    result.forward_status, result.backward_status = e["forward_status"], e["backward_status"]
                    _read_outputs(folder, e["case"], result, spec)
                    current = e["case"] + 1
            if code == 0:
                break
            if current < len(case_list):
                outcome.results[current].failure = _parse_failure(stderr, buffers, label)
                if outcome.results[current].failure.kind == "timeout":
                    break  # the next cases would most likely hang too: time limit x cases
            first = current + 1
    return outcome
