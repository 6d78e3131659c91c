"""The explorer behind ``notebooks/04_explorer.ipynb``: pick a problem, variants, a size and a
dtype; the cost model, the timing table, the bandwidth chart and the roofline follow.

    ex = Explorer()                                   # live on a GPU, else the recorded results
    ex.show(Selection("kl_div", ("naive", "vectorized"), "small", "float32"))   # static: papermill
    ex.widget(Selection("kl_div", ("naive", "vectorized"), "small", "float32")) # JupyterLab

Live, each (problem, implementation, shape, dtype, repeats) is measured once
(``records.measure_section``, no checks) and cached, so changing the selection measures only
what is new; the cached sections are combined with speedups across them. Without a GPU the
explorer filters the newest recorded section: at the selected size if the record holds it,
else at the record's own size; the cost model is drawn at any size. The block size of each
rung is fixed in its kernel file, so there is no launch configuration to pick here: the note
lists each rung's and says where to try another (your own variant, notebook 05).
"""
from __future__ import annotations

import dataclasses
import html
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from losslab import build, problems, records
from losslab.measure.peers import PEERS
from losslab.present import charts, tables
from losslab.present.html import Html

_THREADS = re.compile(r"constexpr\s+int\s+THREADS\s*=\s*([^;]+);")


def block_sizes(problem: str, variants: tuple[str, ...] | list[str]) -> dict[str, str]:
    """Each rung's threads per block as its kernel file sets it (``constexpr int THREADS = ...``:
    a number or an expression such as ``32 * WARPS``); rungs whose file sets none are left out."""
    found = {}
    for variant in variants:
        path = build.KERNELS / problem / f"{variant}.cu"
        match = _THREADS.search(path.read_text()) if path.is_file() else None
        if match:
            found[variant] = " ".join(match.group(1).split())
    return found


def launch_note(problem: str, variants: tuple[str, ...] | list[str]) -> str:
    """What the launch configuration of the selected rungs is, and where to change it."""
    sizes = block_sizes(problem, variants)
    listed = ", ".join(f"{v} {t}" for v, t in sizes.items())
    return ("Launch configuration: each rung's threads per block are fixed in its kernel file at compile time"
            + (f" ({listed})" if listed else "") + ", so there is none to pick here. To try another, copy the "
            "rung's file into your own variant (notebook 05, custom.compile_variant) and change THREADS.")


@dataclass(frozen=True)
class Selection:
    """What to show: a problem, some of its variants, a size name and a dtype name."""

    problem: str
    variants: tuple[str, ...]
    size: str
    dtype: str = "float32"


class Explorer:
    """Measures (live) or looks up (recorded) the rows a selection needs, caching them.

    Args:
        live: True measures on the GPU, False shows the record, None: live when a GPU is visible.
        repeats: timed calls per measurement (live).
        peers: PyTorch peers to time beside the variants (live): some of ``measure.peers.PEERS``.
        device, results_dir: which record to show when not live.
    """

    def __init__(self, live: bool | None = None, repeats: int = 10, peers: tuple[str, ...] = ("eager",),
                 device: str | None = None, results_dir: Path | str | None = None):
        self.live = torch.cuda.is_available() if live is None else live
        self.repeats, self.peers = repeats, tuple(peers)
        self.device, self.results_dir = device, results_dir
        self.measurements = 0  # how many (implementation, shape, dtype) were measured: the cache's effect
        self._measured: dict[tuple, records.Section] = {}
        self._recorded: dict[str, records.Section | None] = {}
        self._ceilings: dict | None = None

    # --- what can be chosen ---------------------------------------------------------------------

    def dtypes(self, problem: str) -> list[str]:
        """dtype names selectable for ``problem``: those a variant has kernels for (live), or
        those the record holds."""
        spec = problems.get(problem)
        if self.live:
            found = {d for v in spec.variants for d in spec.dtypes(v)}
            return [str(d).removeprefix("torch.") for d in (torch.float32, torch.bfloat16, torch.float16) if d in found]
        section = self.recorded(problem)
        return section.dtypes if section is not None and section.rows else ["float32"]

    def recorded(self, problem: str) -> records.Section | None:
        """The newest recorded section of ``problem`` (cached), or None."""
        if problem not in self._recorded:
            folder = Path(self.results_dir) if self.results_dir else records.RESULTS_DIR
            try:
                self._recorded[problem] = records.latest_section(problem, self.device, folder)
            except LookupError:
                self._recorded[problem] = None
        return self._recorded[problem]

    # --- the rows ---------------------------------------------------------------------------------

    def _measure(self, problem: str, implementation: str, shape: tuple[int, int], dtype: str) -> records.Section:
        from losslab.measure.ceilings import measure_ceilings

        key = (problem, implementation, shape, dtype, self.repeats)
        if key not in self._measured:
            if self._ceilings is None:
                self._ceilings = measure_ceilings()
            peer = implementation in PEERS
            self._measured[key] = records.measure_section(
                problem, shape, variants=[] if peer else [implementation], peers=(implementation,) if peer else (),
                dtypes=(dtype,), repeats=self.repeats, check=False, ceilings=self._ceilings, progress=False)
            self.measurements += 1
        return self._measured[key]

    def section(self, sel: Selection) -> records.Section | None:
        """The selected variants and the peers as one section: measured now (only what is not
        cached) or filtered from the record; None when not live and nothing is recorded."""
        spec = problems.get(sel.problem)
        if not self.live:
            section = self.recorded(sel.problem)
            if section is None:
                return None
            shape = spec.sizes[sel.size] if tuple(spec.sizes[sel.size]) in section.shapes else section.primary_shape
            view = section.view(shape, sel.dtype)
            return dataclasses.replace(
                view, rows=[r for r in view.rows if r.kind == "peer" or r.implementation in sel.variants],
                checks=[c for c in view.checks if c.variant in sel.variants])
        shape = tuple(spec.sizes[sel.size])
        return records.combine([self._measure(sel.problem, impl, shape, sel.dtype)
                                for impl in (*sel.variants, *self.peers)])

    # --- showing it ---------------------------------------------------------------------------------

    def note(self, sel: Selection, section: records.Section | None) -> Html:
        """Where the numbers come from, what of the selection they cover, and the launch note."""
        spec = problems.get(sel.problem)
        rows, cols = spec.sizes[sel.size]
        parts = []
        if section is None:
            parts.append(f"No GPU here and no recorded results for {sel.problem}: only the cost model below. "
                         f"Run `python -m losslab bench {sel.problem}` on a GPU machine and commit the record.")
        elif section.source == "live":
            parts.append(f"LIVE on {section.device}: {sel.problem} {rows}x{cols} {sel.dtype}, median of "
                         f"{self.repeats} calls; {self.measurements} measurement(s) so far, each cached.")
        else:
            shape = section.rows[0].shape if section.rows else section.primary_shape
            r, c = shape or (rows, cols)
            parts.append(f"RECORDED on {section.device} ({section.date}) at {r}x{c}; no GPU here, so "
                         f"the table and plots filter that record.")
            if (r, c) != (rows, cols):
                parts.append(f"The size {sel.size!r} ({rows}x{cols}) applies to the cost model only.")
            if not section.rows:
                parts.append(f"The record holds no {sel.dtype} rows for these variants.")
        missing = [v for v in sel.variants if getattr(torch, sel.dtype) not in spec.dtypes(v)]
        if missing:
            parts.append(f"No {sel.dtype} kernels in: {', '.join(missing)}.")
        parts.append(launch_note(sel.problem, sel.variants))
        text = " ".join(parts)
        return Html(f"<p>{html.escape(text)}</p>", plain=text)

    def roofline_figure(self, section: records.Section):
        """The roofline of ``section`` on a Figure made without pyplot (shown once per display)."""
        from matplotlib.figure import Figure

        from losslab.present.roofline import plot_roofline

        fig = Figure(figsize=(8, 5), layout="constrained")
        plot_roofline(section, ax=fig.subplots())
        return fig

    def render(self, sel: Selection) -> list:
        """The outputs of a selection, in order: the note, the cost model at the selected size,
        and (with results) the timing table, the bandwidth chart and the roofline."""
        section = self.section(sel)
        shape = problems.get(sel.problem).sizes[sel.size]
        items = [self.note(sel, section), tables.cost_table(sel.problem, shape, dtype=sel.dtype)]
        if section is not None and section.rows:
            items += [tables.timing_table(section), charts.bandwidth_chart(section), self.roofline_figure(section)]
        return items

    def show(self, sel: Selection) -> None:
        """Display :meth:`render`'s outputs: the static path, for papermill."""
        from IPython.display import display

        for item in self.render(sel):
            display(item)

    def widget(self, sel: Selection, height: str = "1400px"):
        """Controls and an output area of fixed ``height``: a change reruns only what is new
        and replaces the outputs in place (``clear_output(wait=True)``: no flicker)."""
        import ipywidgets as w
        from IPython.display import display

        spec = problems.get(sel.problem)
        problem_w = w.Dropdown(options=problems.names(), value=sel.problem, description="problem")
        variants_w = w.SelectMultiple(options=spec.variants, value=sel.variants, rows=6, description="variants")
        size_w = w.Dropdown(options=list(spec.sizes), value=sel.size, description="size")
        dtype_w = w.Dropdown(options=self.dtypes(sel.problem), value=sel.dtype, description="dtype")
        repeats_w = w.IntSlider(value=self.repeats, min=3, max=50, continuous_update=False, description="repeats",
                                disabled=not self.live)
        out = w.Output(layout=w.Layout(height=height, overflow="auto"))
        launch = w.HTML(f"<small>{html.escape(launch_note(sel.problem, spec.variants))}</small>",
                        layout=w.Layout(width="420px"))
        updating = {"now": False}

        def refresh(_=None):
            if updating["now"]:
                return
            self.repeats = repeats_w.value
            current = Selection(problem_w.value, tuple(variants_w.value), size_w.value, dtype_w.value)
            with out:
                out.clear_output(wait=True)
                for item in self.render(current):
                    display(item)

        def on_problem(change):
            new = problems.get(change["new"])
            updating["now"] = True
            variants_w.options, variants_w.value = new.variants, tuple(new.variants)
            size_w.options = list(new.sizes)
            size_w.value = sel.size if sel.size in new.sizes else "small"
            dtype_w.options, dtype_w.value = self.dtypes(new.name), "float32"
            launch.value = f"<small>{html.escape(launch_note(new.name, new.variants))}</small>"
            updating["now"] = False
            refresh()

        problem_w.observe(on_problem, names="value")
        for control in (variants_w, size_w, dtype_w, repeats_w):
            control.observe(refresh, names="value")
        refresh()
        return w.VBox([w.HBox([problem_w, size_w, dtype_w]), w.HBox([variants_w, w.VBox([repeats_w, launch])]), out])
