"""Driving one notebook in JupyterLab through Playwright, as a participant would: open, Run All, look.

Read through the JupyterLab application that the server exposes to the page
(``--LabApp.expose_app_in_browser``): the notebook's session for the kernel's state, each code
cell's model for its execution count and outputs, and each cell's DOM ``textContent`` for what the
page shows (``textContent``, not ``innerText``: JupyterLab skips rendering cells off screen, so
only ``textContent`` holds their text).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# Debian's chromium; playwright's own browser download is never used (no `playwright install`).
CHROMIUM = "/usr/bin/chromium"
# --no-sandbox: CI runs as root; --disable-dev-shm-usage: containers often give /dev/shm only 64 MB.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]
# What the page shows when a widget cannot be drawn, or when only a widget's text fallback arrives.
WIDGET_FAILURES = ("Error displaying widget", "Loading widget...", "Dropdown(", "VBox(children=")

_NOTEBOOK = "window.jupyterapp.shell.currentWidget"
_KERNEL_IDLE = f"() => {_NOTEBOOK}?.sessionContext?.session?.kernel?.status === 'idle'"
_CELLS = f"""() => {_NOTEBOOK}.content.widgets.filter(cell => cell.model.type === 'code').map(cell => ({{
    source: cell.model.sharedModel.getSource(),
    execution_count: cell.model.executionCount,
    outputs: cell.model.outputs.toJSON(),
    text: cell.outputArea.node.textContent,
    widgets: cell.outputArea.node.querySelectorAll('.jupyter-widgets').length,
}}))"""


def launch(playwright):
    """Debian's chromium, headless, through Playwright."""
    return playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)


@dataclass
class Cell:
    """A code cell after a run: its source, execution count (None: never ran), nbformat outputs
    and the text its output area shows; ``widgets`` counts the widgets drawn in it."""

    index: int
    source: str
    execution_count: int | None
    outputs: list[dict]
    text: str
    widgets: int

    def problems(self) -> list[str]:
        where = f"code cell {self.index} ({self.source.strip().splitlines()[0][:60] if self.source.strip() else ''})"
        found = [] if self.execution_count else [f"{where}: did not run"]
        for output in self.outputs:
            if output.get("output_type") == "error":
                found.append(f"{where}: {output.get('ename')}: {output.get('evalue')}")
        found += [f"{where}: shows {failure!r}" for failure in WIDGET_FAILURES if failure in self.text]
        return found


class LabPage:
    """One browser page holding JupyterLab (loaded once: a load takes seconds); notebooks open in it
    one at a time. Console errors and uncaught page errors are collected in order."""

    def __init__(self, context, url: str, timeout_s: float = 120.0):
        self.page = context.new_page()
        self.console_errors: list[str] = []
        self.page.on("console", lambda message: message.type == "error" and self.console_errors.append(
            f"console: {message.text}"))
        self.page.on("pageerror", lambda error: self.console_errors.append(f"page error: {error}"))
        self.page.goto(url)
        self.page.wait_for_function("() => window.jupyterapp?.shell !== undefined", timeout=timeout_s * 1000)
        self.page.evaluate("async () => { await window.jupyterapp.restored; }")

    def open(self, name: str, timeout_s: float = 120.0) -> NotebookPage:
        """Open ``<name>.ipynb`` (relative to the server's root) and wait for its kernel to be idle."""
        return NotebookPage(self, name, len(self.console_errors)).wait_ready(timeout_s)


@dataclass
class NotebookPage:
    """One notebook open in the lab page, the current widget; ``first_error`` is where its share of
    the page's console errors starts."""

    lab: LabPage
    name: str
    first_error: int

    @property
    def page(self):
        return self.lab.page

    @property
    def console_errors(self) -> list[str]:
        """The page's console errors since this notebook opened, each once with its count."""
        mine = self.lab.console_errors[self.first_error:]
        return [f"{error} (x{mine.count(error)})" if mine.count(error) > 1 else error for error in dict.fromkeys(mine)]

    def wait_ready(self, timeout_s: float) -> NotebookPage:
        self.page.evaluate(f"""async () => {{
            const widget = await window.jupyterapp.commands.execute('docmanager:open', {{path: '{self.name}.ipynb'}});
            window.jupyterapp.shell.activateById(widget.id);
            await widget.context.ready; await widget.sessionContext.ready; }}""")
        self.wait_idle(timeout_s)
        return self

    def wait_idle(self, timeout_s: float = 120.0) -> None:
        self.page.wait_for_function(_KERNEL_IDLE, timeout=timeout_s * 1000, polling=250)

    def run_all(self, timeout_s: float) -> str:
        """Run All Cells (the Run menu's command); wait for it to finish and the kernel to go idle.
        Returns the command's result: "true" when every cell ran without an error."""
        self.page.evaluate("() => { window.__runAll = null; window.jupyterapp.commands.execute("
                           "'notebook:run-all-cells').then(ok => { window.__runAll = String(ok); },"
                           " error => { window.__runAll = 'failed: ' + error; }); }")
        self.page.wait_for_function("() => window.__runAll !== null", timeout=timeout_s * 1000, polling=500)
        self.wait_idle()
        return self.page.evaluate("() => window.__runAll")

    def cells(self) -> list[Cell]:
        return [Cell(index, **cell) for index, cell in enumerate(self.page.evaluate(_CELLS))]

    def problems(self) -> list[str]:
        """Everything a participant would call broken: cells that did not run, error outputs,
        widgets not drawn, and browser console errors."""
        return [p for cell in self.cells() for p in cell.problems()] + self.console_errors

    def screenshot(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(path))

    def close(self) -> None:
        """Shut the kernel down and close the notebook without saving (the served copy stays as it was)."""
        self.page.evaluate(f"""async () => {{ const widget = {_NOTEBOOK};
            if (widget?.sessionContext) {{ await widget.sessionContext.shutdown(); widget.dispose(); }} }}""")
