"""The ladder's sources as the notebooks show them: each rung's kernel file, its opening comment
(what the rung does and which flaw of the rung below it fixes), and two rungs side by side."""
from __future__ import annotations

import html

from losslab import problems
from losslab.build import KERNELS
from losslab.present.html import Html, table


def kernel_source(problem: str, variant: str) -> str:
    """The text of ``kernels/<problem>/<variant>.cu``.

    Raises:
        ValueError: unknown problem or variant.
    """
    problems.get(problem).check_variant_name(variant)
    return (KERNELS / problem / f"{variant}.cu").read_text()


def rung_header(problem: str, variant: str) -> str:
    """The opening ``//`` comment of a rung's .cu file as one paragraph: what the rung does
    and which flaw of the rung below it fixes."""
    lines = []
    for line in kernel_source(problem, variant).splitlines():
        if not line.startswith("//"):
            break
        lines.append(line[2:].strip())
    return " ".join(lines)


def ladder_summary(problem: str, variants: list[str] | None = None) -> Html:
    """A table of the rungs, each with its header comment (what it fixes)."""
    variants = list(variants or problems.get(problem).variants)
    body = [[f"<code>{html.escape(v)}</code>", html.escape(rung_header(problem, v))] for v in variants]
    plain = "\n".join(f"{v}: {rung_header(problem, v)}" for v in variants)
    return Html(table(["rung", "what it does, and what it fixes"], body, text_columns=2), plain=plain)


def side_by_side(problem: str, left: str, right: str) -> Html:
    """The sources of two rungs (e.g. "naive", "shared_memory") as a two-column HTML table,
    escaped and monospaced, each headed by its path under ``kernels/``.

    Raises:
        ValueError: unknown problem or variant.
    """
    columns = [(v, kernel_source(problem, v)) for v in (left, right)]
    head = "".join(f'<th style="text-align:left">kernels/{problem}/{html.escape(v)}.cu</th>' for v, _ in columns)
    cells = "".join('<td style="text-align:left;vertical-align:top;width:50%">'
                    '<pre style="font-family:monospace;font-size:11px;white-space:pre;overflow-x:auto">'
                    f"{html.escape(src)}</pre></td>" for _, src in columns)
    plain = "\n\n".join(f"==> kernels/{problem}/{v}.cu <==\n{src}" for v, src in columns)
    return Html(f'<table style="table-layout:fixed;width:100%"><tr>{head}</tr><tr>{cells}</tr></table>',
                plain=plain)
