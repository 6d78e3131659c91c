"""Export one rung of a ladder as a single-file KernelBench solution.

    python -m losslab export kl_div vectorized > solution.py

The file is :mod:`losslab.kernelbench.solution_template` filled in, self-contained (it needs
torch and nvcc, nothing of losslab); :func:`export_solution` says what it holds.
"""
from __future__ import annotations

import ast
import functools
import inspect
import re
from pathlib import Path

from losslab import problems, validation
from losslab.build import CSRC, KERNELS, ROOT
from losslab.problems import launch

TEMPLATE = Path(__file__).with_name("solution_template.py")
HOST_FUNCTIONS = ("validate_inputs", "forward", "backward")  # what the template calls
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
_PRAGMA_ONCE = re.compile(r"^\s*#\s*pragma\s+once\b")
PLACEHOLDER = re.compile(r"^(?P<name>[A-Z_]+) = .*  # export: .*$", re.MULTILINE)
LINE_LENGTH = 120  # the exported file's lines, as pyproject.toml's ruff allows


class ExportError(ValueError):
    """A source cannot be inlined (a local include not found, or text that cannot be quoted)."""


def inline_includes(path: Path, seen: set[Path] | None = None) -> str:
    """The text of ``path`` with every ``#include "..."`` replaced by the included file's text,
    recursively. A file with ``#pragma once`` is inlined the first time only (``seen`` carries
    that across calls, as one translation unit would); ``#include <...>`` lines stay.

    Quoted includes resolve against the including file's folder, then ``kernels/`` (the
    ``-I`` the package's own build uses).

    Raises:
        ExportError: an included file exists in neither place.
    """
    seen = set() if seen is None else seen
    path = path.resolve()
    text = path.read_text()
    if any(_PRAGMA_ONCE.match(line) for line in text.splitlines()) and path in seen:
        return ""
    seen.add(path)
    name = path.relative_to(ROOT) if ROOT in path.parents else path.name
    lines = [f"// ---- {name} ----"]
    for line in text.splitlines():
        match = _INCLUDE.match(line)
        if match:
            target = next((p for p in (path.parent / match.group(1), KERNELS / match.group(1)) if p.is_file()),
                          None)
            if target is None:
                raise ExportError(f"{path}: cannot find the included file {match.group(1)!r} "
                                  f"(looked in {path.parent} and {KERNELS})")
            lines.append(inline_includes(target, seen))
        elif not _PRAGMA_ONCE.match(line):
            lines.append(_fit(line))
    return "\n".join(lines)


def _fit(line: str) -> str:
    """A source line longer than :data:`LINE_LENGTH`, fitted (the solution file is Python and must
    lint clean): a trailing ``//`` comment goes on a line of its own above the code, and a code line
    still too long breaks at its last space that fits, continued on indented lines (C++ ignores where
    a statement breaks; a preprocessor line, a string literal or a comment is left as it is)."""
    code, sep, comment = line.partition("  // ")
    if len(line) <= LINE_LENGTH:
        return line
    if sep and code.strip():
        return f"{code[:len(code) - len(code.lstrip())]}// {comment}\n{_fit(code.rstrip())}"
    indent = line[:len(line) - len(line.lstrip())]
    if line.lstrip().startswith("#") or any(mark in line for mark in ('"', "'", "//", "/*")):
        return line
    parts = []
    while len(line) > LINE_LENGTH:
        cut = line.rfind(" ", len(indent) + 1, LINE_LENGTH + 1)
        if cut <= len(indent) or not line[:cut].strip():
            break
        parts.append(line[:cut].rstrip())
        line = indent + " " * 8 + line[cut:].lstrip()
    return "\n".join([*parts, line])


def kernel_files(problem: problems.Problem, variant: str) -> list[Path]:
    """The ``.cu`` files one rung needs: its own, that of the rung it falls back to (if
    any), the problem's files that are not a rung (stages such as
    ``cross_entropy/valid_mean.cu``) and ``kernels/common/*.cu``.

    Raises:
        ValueError: unknown variant.
    """
    rung = problem.rung(variant)
    rungs = [variant] + ([rung.falls_back_to] if rung.falls_back_to else [])
    stages = [p for p in sorted((KERNELS / problem.name).glob("*.cu")) if p.stem not in problem.variants]
    return [*(KERNELS / problem.name / f"{r}.cu" for r in rungs), *stages, *sorted((KERNELS / "common").glob("*.cu"))]


def cuda_source(problem: problems.Problem, variant: str) -> str:
    """One CUDA translation unit holding the rung's kernels and launchers, free of local includes."""
    seen: set[Path] = set()
    return "\n\n".join(inline_includes(path, seen) for path in kernel_files(problem, variant))


def binding_source(problem: problems.Problem, variant: str) -> str:
    """The package's binding of ``problem`` (``csrc/<problem>.cpp`` with ``bind.h`` and the
    launchers' declarations inlined), binding the launchers of ``variant`` only."""
    problem.check_variant_name(variant)
    return (f"// the one rung this solution links\n#define BOUND_RUNGS(X) X({variant})\n\n"
            + inline_includes(CSRC / f"{problem.name}.cpp"))


def _raw(text: str) -> str:
    """``text`` as a Python raw triple-quoted literal, kept readable."""
    if "'''" in text:
        raise ExportError("a source contains ''' and cannot be quoted as a raw string")
    return "r'''\n" + text.rstrip() + "\n'''"


def _after_imports(path: Path) -> str:
    """A Python file's text after its docstring and its top-level imports."""
    text = path.read_text()
    body = ast.parse(text).body
    last = max((node.end_lineno for node in body if isinstance(node, (ast.Import, ast.ImportFrom, ast.Expr))
                and (not isinstance(node, ast.Expr) or node is body[0])), default=0)
    return "\n".join(text.splitlines()[last:]).strip() + "\n"


def _with_imports_of(path: Path, text: str) -> str:
    """``text`` (the template) with the top-level imports of the Python file ``path`` that it lacks (e.g.
    ``torch.nn.functional as F``, ``torch.distributions.Pareto``): ``import`` lines after ``import torch.nn
    as nn``, ``from`` lines before ``from torch.utils.cpp_extension``, in the order isort keeps."""
    lines = path.read_text().splitlines()
    found = [node for node in ast.parse(path.read_text()).body if isinstance(node, (ast.Import, ast.ImportFrom))]
    missing = ["\n".join(lines[node.lineno - 1:node.end_lineno]) + "\n" for node in found]
    missing = [line for line in missing if line not in text]
    plain = "".join(sorted(line for line in missing if line.startswith("import ")))
    froms = "".join(sorted(line for line in missing if line.startswith("from ")))
    text = text.replace("import torch.nn as nn\n", "import torch.nn as nn\n" + plain, 1)
    return text.replace("from torch.utils.cpp_extension", froms + "from torch.utils.cpp_extension", 1)


def _owner(name: str, scopes: list) -> tuple[object, object] | None:
    """(module, value) of the function or constant ``name`` as one of ``scopes`` defines it;
    for a constant, the scope that assigns it before one that imports it."""
    constant = None
    for module in scopes:
        value = vars(module).get(name)
        if value is None or inspect.ismodule(value) or inspect.isclass(value):
            continue
        if inspect.isfunction(value):
            if value.__module__ == module.__name__:
                return module, value
        elif isinstance(value, (int, float, str, tuple, dict)):
            if name in _assignments(module):
                return module, value
            constant = constant or (module, value)
    return constant


def host_code(problem: problems.Problem) -> str:
    """Python source of the host functions the template calls (:data:`HOST_FUNCTIONS` of the
    problem's module) and every function and constant of the problem's module,
    :mod:`losslab.problems.launch` and :mod:`losslab.validation` they use, each once.
    Constants are copied as their module writes them, not as their values are now: a cache
    such as ``launch._STREAM_SCRATCH`` starts empty in the solution, whatever this process
    has put in it."""
    scopes = [problem.host, launch, validation]
    found: dict[str, tuple[object, object]] = {}
    constants: dict[str, tuple[int, int, str]] = {}  # name -> (scope, line, its assignment's source)
    todo = list(HOST_FUNCTIONS)
    while todo:
        name = todo.pop()
        owner = None if name in found else _owner(name, scopes)
        if owner is None:
            continue
        found[name] = owner
        module, value = owner
        if inspect.isfunction(value):
            source = inspect.getsource(value)
        else:
            # its assignment as written; a value imported from outside the scopes (an immutable
            # one, e.g. a dtype tuple) as its repr
            line, source = _assignments(module).get(name) or (0, f"{name} = {value!r}")
            constants[name] = (scopes.index(module), line, source)
        todo += [n.id for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Name)]
    functions = sorted((scopes.index(module), value.__code__.co_firstlineno, inspect.getsource(value))
                       for module, value in found.values() if inspect.isfunction(value))
    return ("\n".join(source for *_, source in sorted(constants.values())) + "\n\n\n"
            + "\n\n".join(source for *_, source in functions))


@functools.cache
def _assignments(module) -> dict[str, tuple[int, str]]:
    """Each name ``module`` assigns at module level -> (line, source of the statement): the
    module parsed once, not once per constant asked about."""
    text = inspect.getsource(module)
    found = {}
    for node in ast.parse(text).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) \
            else []
        for target in targets:
            if isinstance(target, ast.Name):
                found.setdefault(target.id, (node.lineno, ast.get_source_segment(text, node)))
    return found


def _replace_block(text: str, block: str, replacement: str) -> str:
    start, end = text.index(f"# >>> {block}"), text.index(f"# <<< {block}")
    return text[:start] + replacement.rstrip() + "\n" + text[end + len(f"# <<< {block}"):]


def export_solution(problem: problems.Problem, variant: str) -> str:
    """The text of a single-file KernelBench solution for one rung: the template
    (``solution_template.py``) with its lines marked ``# export:`` and its blocks between
    ``# >>>`` and ``# <<<`` replaced, so that the solution needs torch and nvcc only:

    * ``Model``, ``get_inputs()``, ``get_init_inputs()``: the problem's KernelBench file
      (``losslab/problems/<problem>/kernelbench.py``), at the problem's seed size;
    * the host code, copied from the package so that the solution launches exactly as losslab
      does: the problem's ``validate_inputs``, ``forward`` and ``backward``
      (``losslab/problems/<problem>/host.py``) and what they use of ``losslab/validation.py`` and
      ``losslab/problems/launch.py``;
    * ``CUDA_SOURCE``: the rung's ``.cu``, the problem's other stages (e.g.
      ``cross_entropy/valid_mean.cu``) and ``kernels/common/*.cu``, with every local header
      inlined once; ``CPP_SOURCE``: the package's own binding ``losslab/build/csrc/<problem>.cpp``
      and ``bind.h``, binding this rung only. No torch headers: it builds in seconds.

    A rung that writes its gradient in the forward (``fused``) keeps doing so in the exported
    file even for inference (its inference rung's kernels are not exported with it); the
    file's docstring says so.

    Returns Python source defining ``Model``, ``ModelNew``, ``get_inputs`` and
    ``get_init_inputs``; nothing is compiled until ``ModelNew()`` is constructed.

    Raises:
        ValueError: unknown variant (ExportError, a ValueError, if a source
            cannot be inlined).
    """
    rung, name = problem.rung(variant), problem.name
    reference = problem.kernelbench_file
    if not reference.is_file():
        raise ExportError(f"problem: no KernelBench file for {name!r} (expected {reference})")
    values = {
        "PROBLEM": repr(name), "RUNG": repr(variant), "WRITES_GRAD_IN_FORWARD": repr(rung.writes_grad_in_forward),
        "DTYPES": "(" + ", ".join(str(d) for d in rung.dtypes) + ",)",
        "EXTENSION_NAME": repr(f"losslab_solution_{name}_{variant}"),
        "CUDA_SOURCE": _raw(cuda_source(problem, variant)), "CPP_SOURCE": _raw(binding_source(problem, variant)),
    }
    text = TEMPLATE.read_text()
    title, _, rest = text.partition("\n")
    docstring_end = rest.index('"""')
    note = rest[:docstring_end].split("\nThis file is the template")[0].rstrip() + "\n"
    if rung.writes_grad_in_forward:
        note += (f"\nThe {variant} rung writes the gradient in its forward even without autograd: "
                 f"for inference, export `{rung.inference or 'vectorized'}`.\n")
    text = (f'"""{name} ({variant} kernels): a single-file KernelBench solution exported by losslab.\n'
            + note.replace("PROBLEM RUNG", f"{name} {variant}").replace("PROBLEM", name) + rest[docstring_end:])
    text = _replace_block(text, "reference", f"# ---- the KernelBench problem ----\n\n\n{_after_imports(reference)}")
    text = _replace_block(text, "host", f"\n\n# ---- host code, from losslab ----\n\n{host_code(problem)}\n")
    text = _with_imports_of(reference, text)
    text = PLACEHOLDER.sub(lambda m: f"{m['name']} = {values[m['name']]}", text)
    return re.sub(r"\n{4,}(?=\S)", "\n\n\n", text)  # at most two blank lines between blocks
