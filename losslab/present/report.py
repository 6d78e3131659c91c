"""The report: every notebook executed headless, exported, and linked from one index page.

:func:`build_report` (``make report``, ``python -m losslab report``) writes each notebook executed,
its HTML export and its figures under ``reports/``, and ``reports/index.html`` linking them all with
the provenance of the results each notebook shows. Nothing under ``notebooks/`` is written, and a run
that is interrupted or fails leaves the previous report as it was.
"""
from __future__ import annotations

import base64
import contextlib
import html
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import papermill
from nbconvert import HTMLExporter

from losslab import problems, records
from losslab.build import ROOT
from losslab.present import tables
from losslab.present.html import format_date
from losslab.present.results import METADATA_KEY

NOTEBOOKS = ROOT / "notebooks"
KERNEL_NAME = "python3"  # ipykernel's own kernel: runs on the Python that runs papermill (the venv's)


@dataclass
class NotebookReport:
    """What became of one notebook: paths of its outputs, the seconds it took, the
    results it showed (``present.results.source_info`` dicts from its banners) and the error, if it failed."""

    name: str
    executed: Path
    html: Path
    figures: list[Path] = field(default_factory=list)
    seconds: float = 0.0
    shows: list[dict] = field(default_factory=list)
    error: str = ""


def notebooks(folder: Path = NOTEBOOKS) -> list[Path]:
    """The workbook's notebooks, in name order (01_..., 02_..., ...)."""
    return sorted(folder.glob("*.ipynb"))


def extract_figures(nb: nbformat.NotebookNode, folder: Path, name: str) -> list[Path]:
    """Write every image/png output of ``nb`` to ``folder/<name>_<n>.png`` (n from 1); return the paths."""
    paths = []
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {}).get("image/png")
            if data:
                path = folder / f"{name}_{len(paths) + 1}.png"
                path.write_bytes(base64.b64decode(data))
                paths.append(path)
    return paths


def shown_results(nb: nbformat.NotebookNode) -> list[dict]:
    """What each ``present.results.banner`` output of ``nb`` recorded in its metadata (``source_info``)."""
    return [output["metadata"][METADATA_KEY] for cell in nb.cells for output in cell.get("outputs", [])
            if METADATA_KEY in output.get("metadata", {})]


@contextlib.contextmanager
def _stderr_to(path: Path):
    """Descriptor 2 goes to ``path`` while the block runs. The kernel papermill starts inherits
    it: its warnings, and on Ctrl-C its shutdown tracebacks, stay out of the terminal."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "ab") as log:
        os.dup2(log.fileno(), 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def run_notebook(source: Path, output_dir: Path, parameters: dict | None = None) -> NotebookReport:
    """Execute ``source`` with papermill into ``output_dir``, export it to HTML and extract its figures.

    Only the ``parameters`` the notebook's parameters cell defines are passed. A failing
    cell does not raise: the report's ``error`` says what failed, and the executed copy
    (which papermill writes with the traceback) is still exported. What the kernel process
    writes to stderr goes to ``output_dir/<name>.kernel-stderr.txt``.
    """
    name = source.stem
    report = NotebookReport(name, output_dir / f"{name}.ipynb", output_dir / f"{name}.html")
    known = papermill.inspect_notebook(str(source))
    passed = {k: v for k, v in (parameters or {}).items() if k in known}
    start = time.perf_counter()
    try:
        with _stderr_to(output_dir / f"{name}.kernel-stderr.txt"):
            papermill.execute_notebook(str(source), str(report.executed), parameters=passed,
                                       kernel_name=KERNEL_NAME, cwd=str(source.parent), progress_bar=False)
    except papermill.PapermillExecutionError as error:
        report.error = f"cell {error.exec_count}: {error.ename}: {error.evalue}"
    report.seconds = time.perf_counter() - start
    nb = nbformat.read(report.executed, as_version=4)
    body, _ = HTMLExporter().from_notebook_node(nb)
    report.html.write_text(body, encoding="utf-8")
    figures = output_dir / "figures"
    figures.mkdir(exist_ok=True)
    report.figures = extract_figures(nb, figures, name)
    report.shows = shown_results(nb)
    return report


def _shown_html(shows: list[dict]) -> str:
    if not shows:
        return "&mdash;"
    items = []
    for s in shows:
        if s["source"] == "none":
            items.append(f"{html.escape(s['problem'])}: no results recorded yet")
            continue
        fresh = "matches the sources now" if s["fresh"] else "<b>does not match the sources now</b>"
        dates = ", ".join(format_date(d) for d in s.get("dates") or [s["date"]])
        items.append(f"{html.escape(s['problem'])}: {html.escape(s['source'])} on {html.escape(s['device'])}, "
                     f"{html.escape(dates)}, torch {html.escape(s['torch'])}, CUDA {html.escape(s['cuda'])}, "
                     f"sources sha256 <code>{s['sources_sha256'][:12]}</code> ({fresh})")
    return "<br>".join(items)


def write_index(output_dir: Path, reports: list[NotebookReport], results_dir: Path = records.RESULTS_DIR) -> Path:
    """Write ``output_dir/index.html``: each notebook's HTML, executed copy, figures and the
    device and date of the results it shows, then every recorded result. Returns its path."""
    rows = []
    for r in reports:
        rel = lambda p: html.escape(p.relative_to(output_dir).as_posix())
        figures = " ".join(f'<a href="{rel(f)}"><img src="{rel(f)}" height="90" alt="{rel(f)}"></a>' for f in r.figures)
        status = f'<span style="color:#b00">FAILED: {html.escape(r.error)}</span>' if r.error else f"{r.seconds:.1f} s"
        rows.append(f'<tr><td><a href="{rel(r.html)}">{html.escape(r.name)}</a><br>'
                    f'<small><a href="{rel(r.executed)}">executed .ipynb</a> &middot; {status}</small></td>'
                    f"<td>{_shown_html(r.shows)}</td><td>{figures}</td></tr>")
    page = f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>losslab report</title>
<style>body{{font-family:sans-serif;margin:2em}} td,th{{padding:4px 10px;text-align:left;vertical-align:top}}
table{{border-collapse:collapse}} tr{{border-bottom:1px solid #ddd}}</style></head>
<body><h1>losslab report</h1>
<p>Built {time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}; current sources sha256:
{", ".join(f"{p} <code>{records.sources_sha256(p)[:12]}</code>" for p in problems.names())}.</p>
<h2>Notebooks</h2>
<table><tr><th>notebook</th><th>results shown</th><th>figures</th></tr>{"".join(rows)}</table>
<h2>Recorded results</h2>{tables.records_table(results_dir)}
</body></html>
"""
    index = output_dir / "index.html"
    index.write_text(page, encoding="utf-8")
    return index


def _swap_in(built: Path, output_dir: Path, reports: list[NotebookReport]) -> None:
    """Move the report built in ``built`` into ``output_dir``: each notebook's figures (its older
    ones removed first), executed copy and HTML, then the index (``os.replace``, one rename each)."""
    (output_dir / "figures").mkdir(exist_ok=True)
    for r in reports:
        for old in (output_dir / "figures").glob(f"{r.name}_*.png"):
            old.unlink()
        for path in [*r.figures, r.executed, r.html]:
            os.replace(path, output_dir / path.relative_to(built))
    os.replace(built / "index.html", output_dir / "index.html")


def build_report(output_dir: Path, parameters: dict | None = None, sources: list[Path] | None = None) -> Path:
    """Execute every notebook (default: all of ``notebooks/``) headless into ``output_dir``,
    export each to HTML, save its figures as PNG and write ``output_dir/index.html``.
    Prints which notebook runs and how long it took. For each notebook it writes::

        reports/<name>.ipynb               executed by papermill (the venv's ``python3`` kernel)
        reports/<name>.html                its HTML export (nbconvert)
        reports/figures/<name>_<n>.png     its n-th PNG output (n from 1)

    and ``reports/index.html`` linking them all with the device, date, versions and kernel hash
    of the results each notebook shows (read from the metadata of its
    ``present.results.banner`` outputs) and a list of every record under ``reports/results/``.
    Everything is built in a temporary folder inside ``output_dir`` and moved into place once
    every notebook has run, index last: a run that is interrupted (Ctrl-C) or fails on the way
    leaves the previous report as it was.

    Args:
        parameters: passed to each notebook's parameters cell (those it defines), e.g.
            ``{"device": "NVIDIA H200"}``.
    Returns the index's path.

    Raises:
        ValueError: ``output_dir`` is inside ``notebooks/`` (the sources are never overwritten).
        RuntimeError: a notebook failed (after every notebook ran and the report was moved into place).
        KeyboardInterrupt: interrupted; ``output_dir`` holds the previous report, unchanged.
    """
    output_dir = Path(output_dir).resolve()
    if output_dir == NOTEBOOKS or NOTEBOOKS in output_dir.parents:
        raise ValueError(f"output_dir: {output_dir} is inside {NOTEBOOKS}; choose another folder, e.g. reports/")
    sources = notebooks() if sources is None else sources
    output_dir.mkdir(parents=True, exist_ok=True)
    built = Path(tempfile.mkdtemp(prefix=".report-building-", dir=output_dir))  # same file system: renames
    try:
        reports = []
        for i, source in enumerate(sources, 1):
            print(f"[{i}/{len(sources)}] executing {source.name} ...", flush=True)
            report = run_notebook(source, built, parameters)
            outcome = f"FAILED ({report.error})" if report.error else "done"
            print(f"[{i}/{len(sources)}] {source.name} {outcome} in {report.seconds:.1f} s -> "
                  f"{report.html.name}, {len(report.figures)} figure(s)", flush=True)
            reports.append(report)
        write_index(built, reports)
        _swap_in(built, output_dir, reports)
    finally:
        shutil.rmtree(built, ignore_errors=True)
    index = output_dir / "index.html"
    print(f"wrote {index}", flush=True)
    failed = [r.name for r in reports if r.error]
    if failed:
        raise RuntimeError(f"notebooks failed: {', '.join(failed)} (see their HTML under {output_dir})")
    return index
