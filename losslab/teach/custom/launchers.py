"""The launcher contract of a custom variant, read from the problem's one declaration.

Every rung of a problem has the same forward and backward signature, declared once in
``kernels/<problem>/launchers.h`` as the function types ``<problem>_forward_fn`` and
``<problem>_backward_fn``; a custom variant defines ``<problem>_custom_forward`` (and optionally
``<problem>_custom_backward``) of those types. Everything here derives from that declaration: the
text shown to the user (:func:`signature`), the compile-time check of the user's launchers' types,
and what the binding binds (``building``, with ``losslab/build/csrc/bind.h``, which reads the
parameter list from the function's type). The problem's *stages* (its other launchers, e.g.
cross_entropy's ``valid_mean``) are read the same way.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from losslab import build, problems

DIRECTIONS = ("forward", "backward")
_COMMENT = re.compile(r"/\*(.*?)\*/|//([^\n]*)", re.DOTALL)
_FUNCTION = re.compile(r"\b(?P<typedef>typedef\s+)?cudaError_t\s+(?P<name>\w+)\s*\(")


@dataclass(frozen=True)
class Param:
    """One launcher parameter: its C type (``const float*``, ``int64_t``, ``DType``,
    ``cudaStream_t``), its name, and the shape its comment gives (``(B, D)`` -> ("B", "D"),
    ``()`` -> (); None where the comment gives none)."""

    ctype: str
    name: str
    shape: tuple[str, ...] | None = None
    comment: str = ""

    @property
    def pointer(self) -> bool:
        return self.ctype.endswith("*")

    @property
    def const(self) -> bool:
        return self.ctype.startswith("const ")


@dataclass(frozen=True)
class Launcher:
    """A launcher declaration: ``function`` its C name, ``params`` in order."""

    function: str
    params: tuple[Param, ...]

    def declaration(self, function: str | None = None, width: int = 120) -> str:
        """``cudaError_t <function>(...);``: a parameter with a comment on its own line, the
        comment wrapped at ``width`` characters; the uncommented ones after it on one line."""
        name = function or self.function
        indent = " " * len(f"cudaError_t {name}(")
        lines, pending = [], []
        for i, p in enumerate(self.params):
            last = i == len(self.params) - 1
            text = f"{p.ctype} {p.name}" + (");" if last else ",")
            if not p.comment:
                pending.append(text)
                continue
            if pending:
                lines.append(" ".join(pending))
                pending = []
            column = max(28, len(text) + 1)
            words, comment_lines = p.comment.split(), [""]
            for word in words:
                if comment_lines[-1] and len(indent) + column + 3 + len(comment_lines[-1]) + len(word) >= width:
                    comment_lines.append("")
                comment_lines[-1] = f"{comment_lines[-1]} {word}".strip()
            lines.append(f"{text:<{column}}// {comment_lines[0]}")
            lines += [f"{'':<{column}}// {more}" for more in comment_lines[1:]]
        if pending:
            lines.append(" ".join(pending))
        return "\n".join((f"cudaError_t {name}(" if i == 0 else indent) + line for i, line in enumerate(lines))


@dataclass(frozen=True)
class Contract:
    """What a custom variant of ``problem`` defines and what is linked beside it.

    ``forward``/``backward``: the rungs' launcher declarations (named ``<problem>_rung_*``
    here; :meth:`function` gives a variant's name); ``stages``: the problem's other launchers
    (e.g. cross_entropy's ``valid_mean``, which the teaching rungs' forward launchers run after
    their row kernel), bound into a custom build too (callable from Python there, to try one
    stage alone; the host code calls only the rung's launchers); ``support``: the .cu files
    under ``kernels/`` linked into a custom build (``common/`` and the problem's non-rung files).
    """

    problem: str
    forward: Launcher
    backward: Launcher
    stages: tuple[Launcher, ...]
    support: tuple[str, ...]

    def function(self, variant: str, direction: str) -> str:
        """The C name of ``variant``'s launcher: ``<problem>_<variant>_<direction>``."""
        return f"{self.problem}_{variant}_{direction}"

    def type_name(self, direction: str) -> str:
        """The function type launchers.h declares: ``<problem>_<direction>_fn``."""
        return f"{self.problem}_{direction}_fn"


def _params(body: str) -> tuple[Param, ...]:
    """The parameters of a declaration's parenthesised ``body`` (line continuations removed),
    each with the comment(s) between it and the next parameter."""
    comments = [(m.start(), (m.group(1) if m.group(1) is not None else m.group(2)).strip())
                for m in _COMMENT.finditer(body)]
    code = _COMMENT.sub(lambda m: " " * len(m.group(0)), body)  # keeps positions
    spans, start = [], 0
    for piece in code.split(","):
        text = piece.strip()
        begin = start + piece.index(text) if text else start
        spans.append((begin, begin + len(text), text))
        start += len(piece) + 1
    params = []
    for i, (_, end, text) in enumerate(spans):
        if not text:
            continue
        until = spans[i + 1][0] if i + 1 < len(spans) else len(body)
        comment = " ".join(c for pos, c in comments if end <= pos < until)
        match = re.fullmatch(r"(?P<type>.*?[\s*])(?P<name>\w+)", text)
        if not match:
            raise ValueError(f"launchers.h: cannot read the parameter {text!r}")
        ctype = re.sub(r"\s*\*", "*", " ".join(match["type"].split()))
        shape = re.match(r"\(([^)]*)\)", comment)
        dims = tuple(d.strip() for d in shape.group(1).split(",") if d.strip()) if shape else None
        params.append(Param(ctype, match["name"], dims, comment))
    return tuple(params)


def parse_declarations(text: str) -> dict[str, Launcher]:
    """Every launcher declared in C++ ``text``, by name: function types (``typedef cudaError_t
    name(...)``) and plain declarations (``cudaError_t name(...)``), each parameter with the
    comment(s) after it."""
    text = text.replace("\\\n", " ")
    found = {}
    for match in _FUNCTION.finditer(text):
        depth, end = 1, match.end()
        while depth:
            depth += {"(": 1, ")": -1}.get(text[end], 0)
            end += 1
        found[match["name"]] = Launcher(match["name"], _params(text[match.end():end - 1]))
    return found


def declared_launchers(problem: problems.Problem) -> dict[str, Launcher]:
    """Every launcher ``kernels/<problem>/launchers.h`` declares (see :func:`parse_declarations`):
    the one place the contract is read from."""
    return parse_declarations((build.KERNELS / problem.name / "launchers.h").read_text())


@functools.cache
def contract(problem: problems.Problem) -> Contract:
    """The contract of ``problem``'s custom variants, from its launchers.h.

    Raises:
        ValueError: a launchers.h without the two function types.
    """
    name = problem.name
    declared = declared_launchers(problem)
    missing = [f"{name}_{d}_fn" for d in DIRECTIONS if f"{name}_{d}_fn" not in declared]
    if missing:
        raise ValueError(f"problem: kernels/{name}/launchers.h declares no {' or '.join(missing)}; "
                         "custom variants need the rungs' launcher types")
    forward, backward = (declared[f"{name}_{d}_fn"] for d in DIRECTIONS)
    forward = Launcher(f"{name}_rung_forward", forward.params)
    backward = Launcher(f"{name}_rung_backward", backward.params)
    stages = tuple(launcher for name, launcher in declared.items() if not name.endswith("_fn"))
    rung_files = set(problem.variants)
    support = tuple(p.relative_to(build.KERNELS).as_posix() for p in sorted((build.KERNELS / "common").glob("*.cu"))
                    ) + tuple(p.relative_to(build.KERNELS).as_posix()
                              for p in sorted((build.KERNELS / name).glob("*.cu")) if p.stem not in rung_files)
    return Contract(name, forward, backward, stages, support)


def signature(problem: problems.Problem | str, variant: str = "custom") -> str:
    """The C declarations a custom variant called ``variant`` of ``problem`` (a Problem, or its name)
    defines (the backward optional), as launchers.h gives them, with each parameter's comment."""
    c = contract(problems.get(problem))
    return (f"{c.forward.declaration(c.function(variant, 'forward'))}\n\n"
            f"// optional: without it a shipped rung's backward runs on what your forward saved\n"
            f"{c.backward.declaration(c.function(variant, 'backward'))}")
