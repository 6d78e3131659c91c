"""The explorer behind ``notebooks/04_explorer.ipynb``: pick a problem, variants, a size and a
dtype; the cost model, the timing table, the bandwidth chart and the roofline follow.

    ex = Explorer()                                   # live on a GPU, else the recorded results
    ex.show(Selection("kl_div", ("naive", "vectorized"), "small", "float32"))   # static: papermill
    ex.widget(Selection("kl_div", ("naive", "vectorized"), "small", "float32")) # JupyterLab

Live, each (problem, implementation, shape, dtype, repeats) is measured once and cached, so
changing the selection measures only what is new. Without a GPU the explorer filters the
newest recorded section (measured at its own shape) and draws the cost model at any size.
No shipped variant exposes a launch configuration (each .cu fixes THREADS at compile time),
so there is nothing to choose there yet.
"""
from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path

import torch

from losslab import problems
from losslab.present import workbook
from losslab.measure.bench import PEERS

LAUNCH_NOTE = ("Launch configuration: none of the shipped variants exposes one (each kernel file fixes "
               "THREADS = 256 at compile time), so there is nothing to choose here yet.")


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
        peers: PyTorch peers to time beside the variants (live): "eager", "compile".
        device, results_dir: which record to show when not live.
    """

    def __init__(self, live: bool | None = None, repeats: int = 10, peers: tuple[str, ...] = ("eager",),
                 device: str | None = None, results_dir: Path | str | None = None):
        self.live = torch.cuda.is_available() if live is None else live
        self.repeats, self.peers = repeats, tuple(peers)
        self.device, self.results_dir = device, results_dir
        self.measurements = 0  # how many (implementation, shape, dtype) were measured: the cache's effect
        self._rows: dict[tuple, list[dict]] = {}
        self._recorded: dict[str, dict | None] = {}
        self._bandwidth: dict[str, float] | None = None

    # --- what can be chosen ---------------------------------------------------------------------

    def dtypes(self, problem: str) -> list[str]:
        """dtype names selectable for ``problem``: those a variant has kernels for (live), or
        those the record holds."""
        spec = problems.get(problem)
        if self.live:
            found = {d for v in spec.variants for d in spec.dtypes(v)}
            return [str(d).removeprefix("torch.") for d in (torch.float32, torch.bfloat16, torch.float16) if d in found]
        section = self.recorded(problem)
        return ["float32", *(section or {}).get("rows_by_dtype", {})]

    def recorded(self, problem: str) -> dict | None:
        """The newest recorded section of ``problem`` (cached), or None."""
        if problem not in self._recorded:
            self._recorded[problem] = workbook.load_results(problem, device=self.device, live=False,
                                                            results_dir=self.results_dir)
        return self._recorded[problem]

    # --- the rows ---------------------------------------------------------------------------------

    def _measure(self, problem: str, implementation: str, shape: tuple[int, int], dtype: str) -> list[dict]:
        from losslab.measure.bench import bench_problem
        from losslab.present.roofline import measure_bandwidth

        key = (problem, implementation, shape, dtype, self.repeats)
        if key not in self._rows:
            if self._bandwidth is None:
                self._bandwidth = measure_bandwidth()
            peer = implementation in PEERS
            rows = bench_problem(problem, shape, [] if peer else [implementation], peers=(implementation,) if peer else (),
                                 repeats=self.repeats, bandwidth=self._bandwidth, progress=False,
                                 dtype=getattr(torch, dtype))
            self._rows[key] = [r.as_dict() for r in rows]
            self.measurements += 1
        return self._rows[key]

    def section(self, sel: Selection) -> dict | None:
        """A section (the format ``workbook`` renders) holding the selected variants and the
        peers: measured now (only what is not cached) or filtered from the record; None when
        not live and nothing is recorded."""
        spec = problems.get(sel.problem)
        if not self.live:
            section = self.recorded(sel.problem)
            if section is None:
                return None
            rows = section["rows"] if sel.dtype == "float32" else section.get("rows_by_dtype", {}).get(sel.dtype, [])
            rows = [r for r in rows if r["kind"] == "peer" or r["implementation"] in sel.variants]
            return {**section, "rows": rows, "dtype": sel.dtype,
                    "checks": [c for c in section["checks"] if c["variant"] in sel.variants]}
        from losslab import records

        shape = tuple(spec.sizes[sel.size])
        rows = [dict(r) for impl in (*sel.variants, *self.peers)
                for r in self._measure(sel.problem, impl, shape, sel.dtype)]
        for row in rows:  # speedups over the peers, across separately measured rows
            row["speedup"] = {p["implementation"]: p["median_ms"] / row["median_ms"] for p in rows
                              if p["kind"] == "peer" and p["direction"] == row["direction"] and p is not row}
        section = records.provenance(sel.problem)
        section.update(shape=list(shape), dtype=sel.dtype, repeats=self.repeats, bandwidth_gbps=self._bandwidth,
                       rows=rows, checks=[], problem=sel.problem, source="live")
        return section

    # --- showing it ---------------------------------------------------------------------------------

    def note(self, sel: Selection, section: dict | None) -> workbook.Html:
        """Where the numbers come from, and what of the selection they cover."""
        spec = problems.get(sel.problem)
        rows, cols = spec.sizes[sel.size]
        parts = []
        if section is None:
            parts.append(f"No GPU here and no recorded results for {sel.problem}: only the cost model below. "
                         f"Run `python -m losslab bench {sel.problem}` on a GPU machine and commit the record.")
        elif section["source"] == "live":
            parts.append(f"LIVE on {section['device']}: {sel.problem} {rows}x{cols} {sel.dtype}, median of "
                         f"{self.repeats} calls; {self.measurements} measurement(s) so far, each cached.")
        else:
            r, c = section["shape"]
            parts.append(f"RECORDED on {section['device']} ({section['date']}) at {r}x{c}; no GPU here, so "
                         f"the table and plots filter that record.")
            if (r, c) != (rows, cols):
                parts.append(f"The size {sel.size!r} ({rows}x{cols}) applies to the cost model only.")
            if not section["rows"]:
                parts.append(f"The record holds no {sel.dtype} rows for these variants.")
        missing = [v for v in sel.variants if getattr(torch, sel.dtype) not in spec.dtypes(v)]
        if missing:
            parts.append(f"No {sel.dtype} kernels in: {', '.join(missing)}.")
        parts.append(LAUNCH_NOTE)
        text = " ".join(parts)
        return workbook.Html(f"<p>{html.escape(text)}</p>", plain=text)

    def roofline_figure(self, section: dict):
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
        items = [self.note(sel, section), workbook.cost_table(sel.problem, shape)]
        if section is not None and section["rows"]:
            items += [workbook.timing_table(section), workbook.bandwidth_chart(section),
                      self.roofline_figure(section)]
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
            updating["now"] = False
            refresh()

        problem_w.observe(on_problem, names="value")
        for control in (variants_w, size_w, dtype_w, repeats_w):
            control.observe(refresh, names="value")
        refresh()
        launch = w.HTML(f"<small>{html.escape(LAUNCH_NOTE)}</small>", layout=w.Layout(width="420px"))
        return w.VBox([w.HBox([problem_w, size_w, dtype_w]), w.HBox([variants_w, w.VBox([repeats_w, launch])]), out])
