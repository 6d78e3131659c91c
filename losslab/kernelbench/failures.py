"""What a failure of the solution's code means for the verdict: the :class:`Stop` that ends an
evaluation, the compiler's first error from a build's output, a CUDA error or an exception.

Used by the child process (``child``), which runs the solution, and by the parent (``parent``),
which raises a Stop for what it finds itself.
"""
from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import traceback

import torch

BUILD_FAILURE_SIGNS = ("Error building extension", "undefined symbol")
# a compiler's diagnostic: nvcc "file.cu(12): error: ...", gcc/clang "file.cpp:12:5: error: ..."
_DIAGNOSTIC = re.compile(r"(\(\d+\)|:\d+(:\d+)?):\s*(fatal )?error\b")
_BUILD_NOISE = re.compile(r"^(\[\d+/\d+\] |FAILED: |ninja: )|-DTORCH_EXTENSION_NAME=")


class Stop(Exception):
    """Ends the evaluation with ``status`` and ``message`` (and optional ``detail``)."""

    def __init__(self, status: str, message: str, detail: str = ""):
        super().__init__(message)
        self.status, self.message, self.detail = status, message, detail



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
