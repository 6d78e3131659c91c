"""The ladder's sources as the notebooks show them: each rung's kernel file (the teaching rung,
kernels/<problem>/ladder/, where the problem has one), its opening comment (what the rung does and
which flaw of the rung below it fixes), two rungs side by side, the diff between adjacent rungs with
the helpers they rely on inlined, and the diff from the top teaching rung to the operator's file."""
from __future__ import annotations

import difflib
import html
import re
from pathlib import Path

from losslab import problems
from losslab.build import KERNELS, knobs, ladder
from losslab.present.html import Html, table


def kernel_path(problem: problems.Problem, variant: str, *, operator: bool = False) -> Path:
    """The file a notebook shows for rung ``variant``: the teaching rung
    ``kernels/<problem>/ladder/<variant>.cu`` where the problem's ladder has it, else (or with
    ``operator``) the operator's ``kernels/<problem>/<variant>.cu`` (every dtype and option).

    Raises:
        ValueError: a variant neither in the teaching ladder nor the operators' rungs.
    """
    taught = ladder.folder(problem.name) / f"{variant}.cu"
    if not operator and variant in taught_rungs(problem) and taught.exists():
        return taught
    problem.check_variant_name(variant)
    return KERNELS / problem.name / f"{variant}.cu"


def taught_rungs(problem: problems.Problem) -> tuple[str, ...]:
    """The rungs the notebooks teach, in order: ``problem``'s teaching ladder (``build.ladder.rungs``)
    where it has one, else its operators' rungs (``problem.variants``)."""
    has_ladder = problem.name in ladder.problems_with_ladder()
    return ladder.rungs(problem.name) if has_ladder else tuple(problem.variants)


def _shown(path: Path) -> str:
    return path.relative_to(KERNELS.parent).as_posix()


def kernel_source(problem: problems.Problem, variant: str, *, operator: bool = False) -> str:
    """The text of :func:`kernel_path`'s file.

    Raises:
        ValueError: unknown variant.
    """
    return kernel_path(problem, variant, operator=operator).read_text()


def rung_header(problem: problems.Problem, variant: str) -> str:
    """The opening ``//`` comment of a rung's .cu file as one paragraph: what the rung does
    and which flaw of the rung below it fixes."""
    lines = []
    for line in kernel_source(problem, variant).splitlines():
        if not line.startswith("//"):
            break
        lines.append(line[2:].strip())
    return " ".join(lines)


def ladder_summary(problem: problems.Problem, variants: list[str] | None = None) -> Html:
    """A table of the rungs (default :func:`taught_rungs`), each with its header comment (what it fixes)."""
    variants = list(variants or taught_rungs(problem))
    body = [[f"<code>{html.escape(v)}</code>", html.escape(rung_header(problem, v))] for v in variants]
    plain = "\n".join(f"{v}: {rung_header(problem, v)}" for v in variants)
    return Html(table(["rung", "what it does, and what it fixes"], body, text_columns=2), plain=plain)


def side_by_side(problem: problems.Problem, left: str, right: str) -> Html:
    """The sources of two rungs (e.g. "naive", "shared_memory") as a two-column HTML table,
    escaped and monospaced, each headed by its path (:func:`kernel_path`).

    Raises:
        ValueError: unknown variant.
    """
    columns = [(_shown(kernel_path(problem, v)), kernel_source(problem, v)) for v in (left, right)]
    head = "".join(f'<th style="text-align:left">{html.escape(v)}</th>' for v, _ in columns)
    cells = "".join('<td style="text-align:left;vertical-align:top;width:50%">'
                    '<pre style="font-family:monospace;font-size:11px;white-space:pre;overflow-x:auto">'
                    f"{html.escape(src)}</pre></td>" for _, src in columns)
    plain = "\n\n".join(f"==> {v} <==\n{src}" for v, src in columns)
    return Html(f'<table style="table-layout:fixed;width:100%"><tr>{head}</tr><tr>{cells}</tr></table>',
                plain=plain)


# helpers a rung relies on, shown inlined in a diff where the rung first uses them:
# name called -> the definitions to show (from the kernel header that defines the first)
HELPERS = {
    "block_reduce_sum": ("warp_reduce", "block_reduce"),
    "load_pack": ("load_pack",),
    "block_reduce_logsumexp": ("warp_reduce_logsumexp", "block_reduce_logsumexp"),
    "lse_add": ("lse_raise_max", "lse_add"),
}


def defining_header(name: str) -> str:
    """The header under ``kernels/`` (as ``common/reduce.cuh``) that defines the device function
    ``name``. Raises LookupError if none does."""
    for path in sorted(KERNELS.rglob("*.cuh")):
        if re.search(rf"__device__[^;{{]*\b{name}\(", path.read_text()):
            return path.relative_to(KERNELS).as_posix()
    raise LookupError(f"no header under {KERNELS} defines {name}()")


def helper_source(header: str, name: str) -> str:
    """The definition of ``name`` in ``kernels/<header>``, with the comment and ``template``
    lines above it: from its first line to the brace that closes its body."""
    lines = (KERNELS / header).read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if re.search(rf"\b{name}\(", line) and "__device__" in line)
    top = start
    while top > 0 and (lines[top - 1].startswith("//") or lines[top - 1].startswith("template")):
        top -= 1
    depth, end = 0, start
    for end in range(start, len(lines)):
        depth += lines[end].count("{") - lines[end].count("}")
        if depth == 0 and "}" in lines[end]:
            break
    return "\n".join(lines[top:end + 1])


def rung_diff(problem: problems.Problem, lower: str, upper: str, context: int = 2, *,
              to_operator: bool = False) -> Html:
    """The lines that change from ``lower`` to ``upper`` (a unified diff of the two kernel files,
    :func:`kernel_path`, ``context`` lines around each change), with each helper of :data:`HELPERS`
    that the added lines call inlined (as ``|`` lines) after the first added line that calls it. The
    lower rung's names (``<problem>_<lower>_...``, and its knob macros ``LOSSLAB_<PROBLEM>_<LOWER>_...``)
    are read as the upper's, so a renamed kernel, launcher or knob whose body is the same is no change.
    ``to_operator``: ``upper`` is the operator's file (``kernel_path(..., operator=True)``): what every
    dtype and option add to the top teaching rung.

    Raises:
        ValueError: unknown variant.
    """
    lower_path, upper_path = kernel_path(problem, lower), kernel_path(problem, upper, operator=to_operator)
    name = problem.name
    renamed = lower_path.read_text().replace(f"{name}_{lower}_", f"{name}_{upper}_").replace(
        knobs.macro_prefix(name, lower), knobs.macro_prefix(name, upper))
    a, b = renamed.splitlines(), upper_path.read_text().splitlines()
    out, shown = [], set()
    for line in difflib.unified_diff(a, b, _shown(lower_path), _shown(upper_path), n=context, lineterm=""):
        out.append(line)
        if not line.startswith("+") or line.startswith("+++"):
            continue
        for called, names in HELPERS.items():
            if called not in shown and re.search(rf"\b{called}\(", line):
                shown.add(called)
                header = defining_header(names[0])
                body = "\n".join(helper_source(header, n) for n in names)
                out += [f"|   {text}" for text in [f"--- {called}, from kernels/{header}:", *body.splitlines(),
                                                      "--- end of helper"]]
    added = sum(1 for line in out if line.startswith("+") and not line.startswith("+++"))
    removed = sum(1 for line in out if line.startswith("-") and not line.startswith("---"))
    text = "\n".join(out) or f"{lower} and {upper} have the same source"

    def styled(line: str) -> str:
        color = {"+": "#0a5d00", "-": "#a40000", "@": "#555", "|": "#1f4e9a"}.get(line[:1], "#000")
        return f'<span style="color:{color}">{html.escape(line)}</span>'

    body = "\n".join(styled(line) for line in out)
    tall = "max-height:40em;overflow-y:auto;" if to_operator else ""
    head = f"<p>{added} lines added, {removed} removed</p>" if to_operator else ""
    return Html(f'{head}<pre style="font-family:monospace;font-size:11px;white-space:pre;overflow-x:auto;{tall}">'
                f'{body}</pre>', plain=(f"{added} lines added, {removed} removed\n" if to_operator else "") + text)
