"""The browser tier: every notebook in JupyterLab in a real browser, the way participants use them.

A JupyterLab server on 127.0.0.1 (this environment's Python, a copy of notebooks/, settings that
silence the news popup) and Debian's chromium driven by Playwright: each notebook is opened, run
with Run All, and must end with every code cell executed, no error output, no widget drawn as text
or as "Error displaying widget", and no browser console error. In 04_explorer ``interactive = True``
(set in the copy's parameters cell): its controls must render as widgets, and changing the problem
and then the variants must change what it shows. Each kernel is shut down after its notebook
(with torch loaded each holds several hundred MB). A screenshot of each notebook goes to
reports/screenshots/ (not committed): what a participant sees.

Skipped with a reason without chromium or playwright (conftest.py). To see the tier fail as it
should without the widget extension: LOSSLAB_BROWSER_DISABLE=@jupyter-widgets/jupyterlab-manager
(comma-separated lab extensions to disable in the test server's own config).
"""
from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

from losslab.build import ROOT

from browser.lab import JupyterLab
from browser.notebook import WIDGET_FAILURES, LabPage, NotebookPage, launch

pytestmark = pytest.mark.browser

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))  # 04_explorer runs in its own test, interactive
SCREENSHOTS = ROOT / "reports" / "screenshots"
EXPLORER = "04_explorer"
RUN_ALL_TIMEOUT_S = 600  # 05_your_turn compiles three kernels with nvcc: tens of seconds on 2 cores


def interactive_explorer(folder: Path) -> None:
    """Set ``interactive = True`` in the explorer's parameters cell (in the served copy only)."""
    path = folder / f"{EXPLORER}.ipynb"
    text, count = re.subn(r"(interactive = )False\b", r"\1True", path.read_text(), count=1)
    assert count == 1, f"{path.name}: no `interactive = False` in its parameters cell to turn on"
    path.write_text(text)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    disabled = tuple(e for e in os.environ.get("LOSSLAB_BROWSER_DISABLE", "").split(",") if e)
    server = JupyterLab(ROOT / "notebooks", tmp_path_factory.mktemp("jupyterlab"), disabled_extensions=disabled)
    interactive_explorer(server.notebooks)
    with server:
        yield server


@pytest.fixture(scope="module")
def lab_page(lab):
    """JupyterLab loaded once in Debian's chromium (a workspace of its own, reset: nothing reopens)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = launch(playwright)
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        yield LabPage(context, lab.url("lab/workspaces/browser-tier") + "&reset")
        browser.close()


@pytest.fixture
def notebook(lab, lab_page):
    """``notebook(name)`` opens notebooks/<name>.ipynb (the served copy); afterwards its kernel is shut down."""
    opened = []

    def open_notebook(name: str) -> NotebookPage:
        opened.append(lab_page.open(name))
        return opened[-1]

    yield open_notebook
    for page in opened:
        page.close()
    lab.shut_down_kernels()


def assert_ran_clean(page: NotebookPage, outcome: str, lab: JupyterLab) -> None:
    problems = page.problems()
    assert outcome == "true" and not problems, (
        f"{page.name} in JupyterLab: Run All returned {outcome}\n" + "\n".join(problems)
        + f"\n(screenshot: {SCREENSHOTS / page.name}.png; server log tail:\n{lab.log_tail(10)})")


@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if p.stem != EXPLORER], ids=lambda p: p.stem)
def test_notebook_runs_all_in_jupyterlab(path, notebook, lab):
    page = notebook(path.stem)
    outcome = page.run_all(RUN_ALL_TIMEOUT_S)
    page.screenshot(SCREENSHOTS / f"{path.stem}.png")
    assert page.cells(), f"{path.stem}: no code cells seen in the page"
    assert_ran_clean(page, outcome, lab)


def output_text(page: NotebookPage) -> str:
    """What the explorer's output widget shows now."""
    return page.page.locator(".widget-output").first.text_content(timeout=30_000) or ""


def wait_for_new_output(page: NotebookPage, before: str, timeout_s: float = 120.0) -> str:
    """The output widget's text once it differs from ``before`` and has settled: the kernel idle
    and the same text twice, half a second apart (the outputs arrive one display at a time)."""
    deadline = time.monotonic() + timeout_s
    last = before
    while time.monotonic() < deadline:
        time.sleep(0.5)
        page.wait_idle()
        now = output_text(page)
        if now and now != before and now == last:
            return now
        last = now
    raise AssertionError(f"{EXPLORER}: the output did not change and settle within {timeout_s:.0f} s")


def control(page: NotebookPage, kind: str, description: str):
    """The <select> of the ipywidgets control ``kind`` (e.g. "dropdown") labelled ``description``."""
    return page.page.locator(f".widget-{kind}", has=page.page.locator("label", has_text=description)).locator(
        "select")


def test_explorer_widgets_respond(notebook, lab):
    page = notebook(EXPLORER)
    outcome = page.run_all(RUN_ALL_TIMEOUT_S)
    try:
        page.page.wait_for_selector(".widget-dropdown select", timeout=30_000)
    except Exception:  # Playwright's TimeoutError: say what the page shows instead
        page.screenshot(SCREENSHOTS / f"{EXPLORER}.png")
        shown = " | ".join(cell.text[:200] for cell in page.cells() if cell.text)
        problems = "\n".join(page.problems())
        raise AssertionError(f"{EXPLORER}: no widget controls rendered; the page shows: {shown}\n{problems}") from None
    assert_ran_clean(page, outcome, lab)
    assert any(cell.widgets for cell in page.cells()), f"{EXPLORER}: no cell holds a widget"

    first = output_text(page)
    assert "kl_div" in first and not any(failure in first for failure in WIDGET_FAILURES), first[:500]
    control(page, "dropdown", "problem").select_option(label="cross_entropy")
    second = wait_for_new_output(page, first)
    assert "cross_entropy" in second and "kl_div" not in second, second[:500]
    control(page, "select-multiple", "variants").select_option(label=["naive", "vectorized"])
    third = wait_for_new_output(page, second)
    # The deselected rungs leave the table and chart captions (a note naming the whole ladder may stay).
    assert "cross_entropy" in third and third.count("shared_memory") < second.count("shared_memory"), third[:500]
    page.page.locator(".widget-dropdown").first.evaluate("node => node.scrollIntoView({block: 'start'})")
    page.screenshot(SCREENSHOTS / f"{EXPLORER}.png")
    assert_ran_clean(page, "true", lab)
