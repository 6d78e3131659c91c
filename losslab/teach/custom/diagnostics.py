"""nvcc's diagnostics in the user's line numbers: parse the compiler's output, format it.

The user's source is compiled as ``<name>.cu`` inside a generated wrapper that also checks
the launchers' types; a diagnostic in the user's file keeps its line number, one in the
wrapper is reported as the launcher-signature check, followed by the expected declarations.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from losslab import build, problems
from losslab.teach.custom.launchers import signature

SIGNATURE_CHECK = "the launcher-signature check"
_DIAGNOSTIC = re.compile(r"^(?P<file>[^\s(:][^(:]*?)(?:\((?P<line>\d+)\)|:(?P<gline>\d+)(?::\d+)?):\s*"
                         r"(?P<kind>catastrophic error|fatal error|error|warning)[^:]*:\s*(?P<text>.*)$")


@dataclass(frozen=True)
class CompileMessage:
    """One compiler diagnostic: ``line`` in the user's source (None when it is elsewhere),
    ``kind`` "error" or "warning", ``where`` the file it was reported in when not the user's."""

    line: int | None
    kind: str
    text: str
    where: str = ""


class CustomCompileError(build.BuildError):
    """nvcc rejected a custom variant; ``messages`` holds the diagnostics, the str() lists
    them with the user's line numbers and source lines."""

    def __init__(self, message: str, messages: Sequence[CompileMessage] = ()):
        super().__init__(message)
        self.messages = list(messages)


def parse_diagnostics(output: str, user_file: str, wrapper_file: str = "") -> list[CompileMessage]:
    """The diagnostics in ``output`` (nvcc's and the host compiler's formats), with line
    numbers kept for those in ``user_file`` (matched by file name) and the rest labelled with
    their file; one in ``wrapper_file`` is labelled :data:`SIGNATURE_CHECK`."""
    found = []
    for raw in output.splitlines():
        match = _DIAGNOSTIC.match(raw.strip())
        if not match:
            continue
        name = Path(match["file"]).name
        kind = "warning" if match["kind"] == "warning" else "error"
        line = int(match["line"] or match["gline"])
        text = re.sub(r' \(aka "[^"]*"\)', "", match["text"]).strip()  # the aliases only repeat the type
        if name == Path(user_file).name:
            found.append(CompileMessage(line, kind, text))
        else:
            where = SIGNATURE_CHECK if wrapper_file and name == Path(wrapper_file).name else name
            found.append(CompileMessage(None, kind, text, where))
    return found


def format_diagnostics(messages: Sequence[CompileMessage], source: str, problem: problems.Problem) -> str:
    """Each diagnostic as ``line N: error: text`` followed by that line of ``source``; a
    failed signature check is followed by the declarations the source must define."""
    lines = source.splitlines()
    out = []
    for m in messages:
        if m.line is None:
            out.append(f"{m.where}: {m.kind}: {m.text}")
            continue
        out.append(f"line {m.line}: {m.kind}: {m.text}")
        if 0 < m.line <= len(lines):
            out.append(f"  {m.line:4d} | {lines[m.line - 1]}")
    if any(m.where == SIGNATURE_CHECK and m.kind == "error" for m in messages):
        out.append(f"your source must define the launchers of {problem.name} with exactly these signatures:\n"
                   + signature(problem))
    return "\n".join(out)
