"""How present/ writes its output: :class:`Html` (a str that Jupyter renders as HTML), tables,
one-line messages, and the number and date formats every table and banner shares.

Cells of :func:`table` are already-escaped HTML; everything else here escapes its text.
"""
from __future__ import annotations

import datetime as dt
import html

WARN = "#a40"   # colour of a message that something is missing or stale
GOOD = "#060"   # colour of a banner whose record matches the sources
BAD = "#b00"    # colour of a failure or a flagged number


class Html(str):
    """A str of HTML that Jupyter renders as HTML.

    ``plain`` is the text/plain form (shown by consoles and text exports); ``metadata`` is
    attached to the notebook output, where ``present.report`` reads it.
    """

    def __new__(cls, text: str, plain: str = "", metadata: dict | None = None):
        obj = super().__new__(cls, text)
        obj.plain = plain or "(HTML output)"
        obj.metadata = metadata or {}
        return obj

    def _repr_mimebundle_(self, include=None, exclude=None):
        return {"text/html": str(self), "text/plain": self.plain}, self.metadata

    def _repr_pretty_(self, printer, cycle):
        # IPython's text/plain printer for str would win over the mimebundle's and show the HTML source
        printer.text(self.plain)


def table(head: list[str], body: list[list[str]], caption: str = "", text_columns: int = 1) -> str:
    """An HTML table. ``head`` and ``body`` cells are already-escaped HTML; the first
    ``text_columns`` columns are left-aligned, the rest (numbers) right-aligned."""
    cell = 'style="text-align:{};padding:2px 8px"'
    th = "".join(f'<th {cell.format("left")}>{h}</th>' for h in head)
    rows = "".join("<tr>" + "".join(f'<td {cell.format("left" if i < text_columns else "right")}>{c}</td>'
                                    for i, c in enumerate(row)) + "</tr>" for row in body)
    cap = f'<caption style="text-align:left">{caption}</caption>' if caption else ""
    return f'<table style="border-collapse:collapse">{cap}<thead><tr>{th}</tr></thead><tbody>{rows}</tbody></table>'


def message(text: str, color: str = WARN, metadata: dict | None = None) -> Html:
    """``text`` as one bold coloured paragraph (plain form: ``text``)."""
    return Html(f'<p style="color:{color}"><b>{html.escape(text)}</b></p>', plain=text, metadata=metadata)


def markdown(text: str):
    """``text`` as Markdown that a notebook renders like the prose around it: a sentence whose
    numbers are read from a record or a listing, never typed into a markdown cell."""
    from IPython.display import Markdown

    return Markdown(text)


def no_results(what: str) -> Html:
    """What a table or chart shows when there are no results to show."""
    return message(f"No results yet, so no {what}: see the note at the top of the notebook.")


def format_bytes(n: float) -> str:
    """``n`` bytes in binary units with two decimals: 2147483648 -> "2.00 GiB", 100 -> "100 B"."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def format_date(iso: str) -> str:
    """An ISO 8601 date as "YYYY-MM-DD HH:MM UTC" (``iso`` unchanged if it is not one)."""
    try:
        return dt.datetime.fromisoformat(iso).strftime("%Y-%m-%d %H:%M UTC")
    except ValueError:
        return iso
