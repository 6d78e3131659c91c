"""The explorer behind ``notebooks/04_explorer.ipynb``: pick a problem, variants, a size and a
dtype; the cost model, the timing table, the bandwidth chart, the roofline and (``sweep``) the
problem over several sizes follow, live on a GPU or from the record (:class:`Explorer`).

    Explorer().show(Selection("kl_div", ("naive", "vectorized"), "small", "float32"))    # static: papermill
    Explorer().widget(Selection("kl_div", ("naive", "vectorized"), "small", "float32"))  # JupyterLab

One module: the selection, what it measures or looks up, and the widget that changes it share one cache.
"""
from __future__ import annotations

import dataclasses
import html
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from losslab import problems, records
from losslab.build import knobs
from losslab.measure import bench
from losslab.measure.peers import PEERS
from losslab.present import charts, evidence, tables
from losslab.present.html import Html, table
from losslab.present.results import bandwidth_gbps, measured_where


def block_sizes(problem: str, variants: tuple[str, ...] | list[str]) -> dict[str, str]:
    """Each rung's default threads per block, from the knobs its kernel file declares
    (``build.knobs``): its THREADS knob, or ``32 x WARPS`` for each knob setting warps per
    block (``FORWARD_WARPS``, ``BACKWARD_WARPS``: one per kernel); rungs with neither are left out."""
    found = {}
    for variant in variants:
        values = {k.name: k.default for k in knobs.knobs(problem, variant)}
        warps = {name: value for name, value in values.items() if name.endswith("WARPS")}
        if "THREADS" in values:
            found[variant] = str(values["THREADS"])
        elif warps:
            found[variant] = ", ".join(f"{32 * value} (32 x {name}={value})" for name, value in warps.items())
    return found


def launch_note(problem: str, variants: tuple[str, ...] | list[str]) -> str:
    """What the launch configuration of the selected rungs is, and where to change it."""
    sizes = block_sizes(problem, variants)
    listed = ", ".join(f"{v} {t}" for v, t in sizes.items())
    return ("Launch configuration: each rung's threads per block are compile-time knobs of its kernel file"
            + (f" (defaults: {listed})" if listed else "") + "; on a GPU the launch knobs below build and time "
            "another configuration. For changes beyond the knobs, copy the rung's file into your own variant "
            "(notebook 05, custom.compile_variant).")


@dataclass(frozen=True)
class Selection:
    """What to show: a problem, some of its variants, a size name and a dtype name; ``sweep``
    adds the problem over several sizes (time and fraction of bandwidth against size);
    ``knobs``: launch configurations to build and time beside the default rows (live), as
    (rung, {knob: value}) pairs, e.g. ``[("vectorized", {"THREADS": 128}), ("vectorized",
    {"THREADS": 512})]`` (stored as tuples). E.g. ``Selection("kl_div", ("vectorized",), "seed",
    "bfloat16", sweep=True)``: time and bandwidth against size too. ``problem``: a Problem, or its
    name (looked up once, here: a selection is the notebook's parameters)."""

    problem: problems.Problem
    variants: tuple[str, ...]
    size: str
    dtype: str = "float32"
    sweep: bool = False
    knobs: tuple = ()

    def __post_init__(self):
        object.__setattr__(self, "problem", problems.get(self.problem))
        object.__setattr__(self, "knobs", tuple(
            (rung, tuple(values.items()) if isinstance(values, Mapping) else tuple(map(tuple, values)))
            for rung, values in self.knobs))

    def configs(self) -> list[knobs.Config]:
        """The launch configurations of :attr:`knobs`, checked (duplicates once).

        Raises:
            ValueError: a rung, knob or value the problem does not have (one line naming it).
        """
        for rung, _ in self.knobs:
            self.problem.check_variant_name(rung)
        return list(dict.fromkeys(knobs.config(self.problem.name, rung, dict(values)) for rung, values in self.knobs))


class Explorer:
    """Measures (live) or looks up (recorded) the rows a selection needs, caching them.

    ``Explorer()`` is live on a GPU, else shows the recorded results. Live, each (problem,
    implementation, shape, dtype, repeats) is measured once (``records.measure_section``, no
    checks) and cached, so changing the selection measures only what is new; the cached sections
    are combined with speedups across them. Without a GPU the explorer filters the newest recorded
    section: at the selected size if the record holds it in the selected dtype, else at the record's
    own size; the cost model is drawn at any size, in the selected dtype.

    Args:
        live: True measures on the GPU, False shows the record, None: live when a GPU is visible.
        repeats: timed calls per measurement (live).
        peers: PyTorch peers to time beside the variants (live): some of ``measure.peers.PEERS``.
        device, results_dir: which record to show when not live.
        sweep_shapes: problem -> the (rows, columns) a live sweep measures (default
            ``bench.SWEEP_SHAPES``; a recorded sweep shows the sizes the record holds).
    """

    def __init__(self, live: bool | None = None, repeats: int = 10, peers: tuple[str, ...] = ("eager",),
                 device: str | None = None, results_dir: Path | str | None = None,
                 sweep_shapes: dict[str, tuple[tuple[int, int], ...]] | None = None):
        self.live = torch.cuda.is_available() if live is None else live
        self.repeats, self.peers = repeats, tuple(peers)
        self.device, self.results_dir = device, results_dir
        self.sweep_shapes = dict(bench.SWEEP_SHAPES if sweep_shapes is None else sweep_shapes)
        self.measurements = 0  # how many (implementation, shape, dtype) were measured: the cache's effect
        self._measured: dict[tuple, records.Section] = {}
        self._recorded: dict[str, records.Section | None] = {}
        self._ceilings: dict | None = None

    # --- what can be chosen ---------------------------------------------------------------------

    def dtypes(self, problem: problems.Problem) -> list[str]:
        """dtype names selectable for ``problem``: those a variant has kernels for (live), or
        those the record holds."""
        if self.live:
            found = {d for v in problem.variants for d in problem.dtypes(v)}
            return [str(d).removeprefix("torch.") for d in (torch.float32, torch.bfloat16, torch.float16) if d in found]
        section = self.recorded(problem)
        return section.dtypes if section is not None and section.rows else ["float32"]

    def recorded(self, problem: problems.Problem) -> records.Section | None:
        """The newest recorded section of ``problem`` (cached), or None."""
        if problem.name not in self._recorded:
            folder = Path(self.results_dir) if self.results_dir else records.RESULTS_DIR
            try:
                self._recorded[problem.name] = records.latest_section(problem, self.device, folder)
            except LookupError:
                self._recorded[problem.name] = None
        return self._recorded[problem.name]

    # --- the rows ---------------------------------------------------------------------------------

    def _measure(self, problem: problems.Problem, implementation: str, shape: tuple[int, int],
                 dtype: str) -> records.Section:
        from losslab.measure.ceilings import measure_ceilings

        key = (problem.name, implementation, shape, dtype, self.repeats)
        if key not in self._measured:
            if self._ceilings is None:
                self._ceilings = measure_ceilings()
            peer = implementation in PEERS
            self._measured[key] = records.measure_section(
                problem, shape, variants=[] if peer else [implementation], peers=(implementation,) if peer else (),
                dtypes=(dtype,), repeats=self.repeats, check=False, ceilings=self._ceilings, progress=False)
            self.measurements += 1
        return self._measured[key]

    def _measure_config(self, config: knobs.Config, shape: tuple[int, int], dtype: str) -> records.Section:
        """One launch configuration timed as :meth:`_measure` times a rung: built first (its
        compiler's progress and the build time on stderr), then ``records.measure_section``."""
        from losslab import build
        from losslab.measure.ceilings import measure_ceilings
        from losslab.ops import variant

        key = (config, shape, dtype, self.repeats)
        if key not in self._measured:
            if self._ceilings is None:
                self._ceilings = measure_ceilings()
            start = time.perf_counter()
            print(f"losslab: {config.label}: building {build.extension_name(config.problem, config.defines)} "
                  "(about a minute the first time, then cached) ...", file=sys.stderr, flush=True)
            build.load_extension(config.problem, defines=config.defines)
            print(f"losslab: {config.label}: built in {time.perf_counter() - start:.0f} s; timing ...",
                  file=sys.stderr, flush=True)
            fn = variant(config.problem, config.rung, knobs=dict(config.values))
            self._measured[key] = records.measure_section(
                config.problem, shape, variants=[fn], peers=(), dtypes=(dtype,), repeats=self.repeats, check=False,
                ceilings=self._ceilings, progress=False)
            self.measurements += 1
        return self._measured[key]

    def section(self, sel: Selection) -> records.Section | None:
        """The selected variants and the peers as one section: measured now (only what is not
        cached) or filtered from the record; None when not live and nothing is recorded."""
        spec = sel.problem
        if not self.live:
            section = self.recorded(sel.problem)
            if section is None:
                return None
            # the selected size where the record holds it in this dtype (float16 is recorded at the seed size only)
            shape = spec.sizes[sel.size] if section.select(spec.sizes[sel.size], sel.dtype) else section.primary_shape
            view = section.view(shape, sel.dtype)
            return dataclasses.replace(
                view, rows=[r for r in view.rows if r.kind == "peer" or r.implementation in sel.variants],
                checks=[c for c in view.checks if c.variant in sel.variants])
        shape = tuple(spec.sizes[sel.size])
        configs = [c for c in sel.configs() if getattr(torch, sel.dtype) in spec.dtypes(c.rung)]
        return records.combine([self._measure(sel.problem, impl, shape, sel.dtype)
                                for impl in (*sel.variants, *self.peers)]
                               + [self._measure_config(c, shape, sel.dtype) for c in configs])

    def rung_below(self, sel: Selection, section: records.Section | None) -> list[records.BenchRow]:
        """The rows of each selected rung's rung below in the ladder that the selection leaves
        out, at the section's shape and dtype: what "x rung below" divides by. Live, those rungs
        are measured (once, cached); a rung below without kernels for the dtype is left out.
        "x rung below" of a launch configuration's row is against the rung's default build."""
        if section is None or not section.rows:
            return []
        spec = sel.problem
        ladder = list(spec.variants)
        below = [ladder[ladder.index(v) - 1] for v in sel.variants if v in ladder and ladder.index(v) > 0]
        below = [v for v in dict.fromkeys(below) if v not in sel.variants]
        shape, dtype = tuple(section.rows[0].shape), section.rows[0].dtype
        if not self.live:
            return [r for r in self.recorded(sel.problem).select(shape, dtype) if r.implementation in below]
        below = [v for v in below if getattr(torch, dtype) in spec.dtypes(v)]
        return [r for v in below for r in self._measure(sel.problem, v, shape, dtype).rows]

    # --- over sizes ---------------------------------------------------------------------------------

    def sweep_section(self, sel: Selection) -> tuple[records.Section | None, list[bench.Skipped]]:
        """The selected variants and the peers at every size: recorded, every size the record
        holds (``bench --sweep`` rows); live, each of ``sweep_shapes`` (measured once each, cached),
        leaving out what a sweep leaves out (``bench.hopeless_reason``, memory); drawn by
        ``charts.sweep_chart``. Returns the section (None when there is nothing) and what was skipped."""
        if not self.live:
            section = self.recorded(sel.problem)
            if section is None:
                return None, []
            rows = [r for r in section.rows if r.kind == "peer" or r.implementation in sel.variants]
            skipped = [s for s in section.skipped if s.dtype == sel.dtype and s.implementation in (*sel.variants, "*")]
            return dataclasses.replace(section, rows=rows, checks=[]), skipped
        spec, dtype = sel.problem, getattr(torch, sel.dtype)
        measured, skipped = [], []
        for shape in self.sweep_shapes.get(spec.name, ()):
            shape = tuple(shape)
            torch.cuda.empty_cache()
            needed, (free, _) = bench.sweep_memory_bytes(sel.problem, shape, dtype), torch.cuda.mem_get_info()
            if needed > free:
                skipped.append(bench.Skipped(spec.name, shape, sel.dtype, "*", f"needs about {needed / 1e9:.1f} GB "
                                             f"of device memory; {free / 1e9:.1f} GB are free"))
                continue
            for impl in (*sel.variants, *self.peers):
                if impl in spec.variants and dtype not in spec.dtypes(impl):
                    continue
                if impl in spec.variants and (reason := bench.hopeless_reason(sel.problem, impl, shape)):
                    skipped.append(bench.Skipped(spec.name, shape, sel.dtype, impl, reason))
                    continue
                measured.append(self._measure(sel.problem, impl, shape, sel.dtype))
        return (records.combine(measured) if measured else None), skipped

    # --- showing it ---------------------------------------------------------------------------------

    def note(self, sel: Selection, section: records.Section | None) -> Html:
        """Where the numbers come from and what of the selection they cover (the launch note is
        shown once, by :meth:`show` and :meth:`widget`, not per render)."""
        spec = sel.problem
        rows, cols = spec.sizes[sel.size]
        parts = []
        if section is None:
            parts.append(f"No GPU here and no recorded results for {spec.name}: only the cost model below. "
                         f"Run `python -m losslab bench {spec.name}` on a GPU machine and commit the record.")
        elif section.source == "live":
            parts.append(f"LIVE on {section.device}: {spec.name} {rows}x{cols} {sel.dtype}, median of "
                         f"{self.repeats} calls; {self.measurements} measurement(s) so far, each cached.")
        else:
            shape = section.rows[0].shape if section.rows else section.primary_shape
            r, c = shape or (rows, cols)
            parts.append(f"RECORDED on {section.device} ({section.date}) at {r}x{c}; no GPU here, so "
                         f"the table and plots filter that record.")
            if (r, c) != (rows, cols):
                parts.append(f"The record holds no {sel.dtype} rows at the size {sel.size!r} ({rows}x{cols}), which "
                             "applies to the cost model only.")
            if not section.rows:
                parts.append(f"The record holds no {sel.dtype} rows for these variants.")
        if not sel.variants:
            parts.append("No rung selected: the peers only.")
        missing = [v for v in sel.variants if getattr(torch, sel.dtype) not in spec.dtypes(v)]
        if missing:
            parts.append(f"No {sel.dtype} kernels in: {', '.join(missing)}.")
        if section is not None and section.rows:
            parts.append("\u00d7 rung below: each rung's time against the rung below it in the ladder ("
                         + " \u2192 ".join(spec.variants) + "), timed even where it is not selected.")
        text = " ".join(parts)
        return Html(f"<p>{html.escape(text)}</p>", plain=text)

    def cost_table(self, sel: Selection, section: records.Section | None) -> Html:
        """The cost model at the selected size in the selected dtype, with the floor at the
        measured bandwidth of ``section``'s device when there is one."""
        shape = sel.problem.sizes[sel.size]
        if section is None or not section.ceilings.get("read_gbps"):
            return tables.cost_table(sel.problem, shape, dtype=sel.dtype)
        return tables.cost_table(sel.problem, shape, bandwidth_gbps(section), sel.dtype, measured_where(section))

    def knobs_html(self, sel: Selection) -> Html:
        """The launch knobs of the selected rungs: each knob, what it sets, its default and the
        values offered, then what choosing one does (live) or would do (no GPU; the recorded rows
        ran the defaults, and the banner-style note says whether the record ran these files).

        Live, a configuration (``Selection.knobs``; in JupyterLab the knob controls and "build and
        time") is compiled on demand as its own extension, cached by its compiler flags
        (``build.load_extension(defines=...)``), and timed by ``records.measure_section`` through
        the same host code and eager path as the default build (``losslab.variant(...,
        knobs=...)``), its rows labelled ``"vectorized [THREADS=512, UNROLL=4]"`` beside the
        default rows. Without a GPU, never a number that was not measured."""
        declared = [k for v in sel.variants for k in knobs.knobs(sel.problem.name, v)]
        rows = [[html.escape(k.rung), f"<code>{k.name}</code>", html.escape(k.meaning), str(k.default),
                 " ".join(map(str, k.allowed))] for k in declared]
        example = next((f'("{k.rung}", {{"{k.name}": {k.allowed[-1]}}})' for k in declared), "")
        what = ("A configuration is compiled as its own extension with -DLOSSLAB_<PROBLEM>_<RUNG>_<KNOB>=<value> "
                "(about a minute the first time, then cached by those flags), checked on the way by the kernel's "
                "static_asserts, and timed exactly as the default rows, through the same host code; its rows are "
                "labelled with the configuration (e.g. "
                + (knobs.config(sel.problem.name, declared[0].rung).label if declared else "vectorized [THREADS=512]")
                + ") and their \u00d7 rung below is against the rung's default build.")
        if self.live:
            asked = ", ".join(c.label for c in sel.configs()) or "none yet"
            how = (f"Choose a configuration with the knob controls and 'build and time' (headless: "
                   f"Selection(..., knobs=[{example}])). {what} Configurations timed here: {asked}.")
        else:
            section = self.recorded(sel.problem)
            ran = ("No record to compare with." if section is None else
                   f"The recorded rows ({section.device}, {section.date}) ran the defaults above"
                   + (": the record was made from these kernel files." if section.is_fresh() else
                      ", as the kernel files of that date set them: the sources changed since, so they may differ."))
            asked = [c.label for c in sel.configs() if not c.is_default]
            how = ("No GPU here: nothing is built or timed, and no number is shown for a configuration that was not "
                   f"measured. On a GPU, {what[0].lower() + what[1:]} {ran}"
                   + (f" Asked for, not timed here: {', '.join(asked)}." if asked else ""))
        if not rows:
            how = f"None of the selected rungs declares a launch knob. {how}"
        body = table(["rung", "knob", "sets", "default", "offered"], rows, caption="Launch knobs (kernel files)",
                     text_columns=3) if rows else ""
        plain = "Launch knobs: " + "; ".join(f"{k.rung} {k.name}={k.default} ({k.meaning})" for k in declared)
        return Html(f"<p><b>Launch knobs.</b> {html.escape(how)}</p>{body}", plain=f"{plain}\n{how}")

    def counters_items(self, sel: Selection) -> list[Html]:
        """The Nsight Compute counters of the selected rungs, forward and backward, from the
        record (a live session runs no profiler), each with what it says
        (``evidence.counters_table``); or one line."""
        section = self.recorded(sel.problem)
        if not sel.variants:  # counters_table would say "not recorded yet", which is not why
            text = "Counters: no rung selected, so no counters to show."
            return [Html(f"<p>{html.escape(text)}</p>", plain=text)]
        where = "" if section is None else f" ({section.device}, {section.date}" + (
            f"; profiled at {'x'.join(map(str, section.ncu.shape))} in float32, whatever size and dtype are selected)"
            if section.ncu else ")")
        text = (f"Nsight Compute counters of the selected rungs, from the record{where}: how each rung uses "
                "the GPU, which the times above only sum up.")
        grad = [r for r in map(sel.problem.rung, sel.variants) if r.writes_grad_in_forward]
        if grad:  # else their columns read as kernels of their own: a forward equal to the rung below, an idle backward
            forwards = " and ".join(dict.fromkeys(f"{r.inference or r.name}'s" for r in grad))
            text += (f" {' and '.join(r.name for r in grad)} write{'s' if len(grad) == 1 else ''} the gradient in "
                     f"the forward. Run without a gradient (the forward rows and columns), {forwards} forward kernel "
                     "runs; the backward column is the kernel that scales that gradient, which does nothing for a "
                     "gradient of 1 (so there is no backward row: compare forward_backward).")
        items = [Html(f"<p><b>Counters.</b> {html.escape(text)}</p>", plain=text)]
        return items + [evidence.counters_table(section, d, rungs=sel.variants, meanings=True)
                        for d in ("forward", "backward")]

    def roofline_figure(self, section: records.Section):
        """The roofline of ``section`` on a Figure made without pyplot (shown once per display)."""
        from matplotlib.figure import Figure

        from losslab.present.roofline import figure_size, plot_roofline, points

        fig = Figure(figsize=figure_size(len(points(section))), layout="constrained")
        plot_roofline(section, ax=fig.subplots())
        return fig

    def sweep_items(self, sel: Selection, directions: tuple[str, ...] = bench.SWEEP_DIRECTIONS) -> list:
        """The sweep's outputs: per direction, time and fraction of bandwidth against size
        (``charts.sweep_chart``: log axes, one line per implementation), or one line saying
        why there is none; then what the sweep left out, and why."""
        section, skipped = self.sweep_section(sel)
        charts_ = [charts.sweep_chart(section, sel.dtype, d) for d in directions]
        figures = [c for c in charts_ if not isinstance(c, Html)]
        if not figures:
            text = (f"No sweep of {sel.problem.name} in {sel.dtype} to plot: " + (
                "the record holds it at one size only" if section is not None and section.rows else "nothing recorded")
                + f"; record one with `python -m losslab bench {sel.problem.name} --sweep` on a GPU machine.")
            figures = [Html(f"<p>{html.escape(text)}</p>", plain=text)]
        if skipped:
            lines = [f"{'x'.join(map(str, s.shape))} {s.implementation}: {s.reason}" for s in skipped]
            figures.append(Html("<p><small>Left out of the sweep:<br>" + "<br>".join(map(html.escape, lines))
                                + "</small></p>", plain="Left out of the sweep:\n" + "\n".join(lines)))
        return figures

    def render(self, sel: Selection) -> list:
        """The outputs of a selection, in order: the note, the cost model at the selected size
        and dtype, and (with results) the timing table, the explanation of a near-empty
        backward where one appears, the bandwidth chart and the roofline; the launch knobs; the
        recorded counters (an intro and a table per direction); then the sweep if ``sel.sweep``."""
        section = self.section(sel)
        items = [self.note(sel, section), self.cost_table(sel, section)]
        if section is not None and section.rows:
            items.append(tables.timing_table(section, self.rung_below(sel, section)))
            items += gradient_in_forward_notes(section)
            items += [charts.bandwidth_chart(section), self.roofline_figure(section)]
        items += [self.knobs_html(sel), *self.counters_items(sel)]
        if sel.sweep:
            items += self.sweep_items(sel)
        return items

    def show(self, sel: Selection) -> None:
        """Display the launch note once, then :meth:`render`'s outputs: the static path, for papermill."""
        from IPython.display import display

        display(launch_html(sel.problem.name, sel.problem.variants))
        for item in self.render(sel):
            display(item)

    def widget(self, sel: Selection):
        """Controls, the launch note (once, above the outputs) and an output area as tall as its
        content: a change reruns only what is new and replaces the outputs in place
        (``clear_output(wait=True)``: no flicker). A row of launch-knob controls for one selected
        rung: "build and time" adds that configuration to those shown (live; disabled without a
        GPU, where the knobs section explains what it would do)."""
        import ipywidgets as w
        from IPython.display import display

        spec = sel.problem
        problem_w = w.Dropdown(options=problems.names(), value=spec.name, description="problem")
        variants_w = w.SelectMultiple(options=spec.variants, value=sel.variants, rows=6, description="variants")
        size_w = w.Dropdown(options=list(spec.sizes), value=sel.size, description="size")
        dtype_w = w.Dropdown(options=self.dtypes(sel.problem), value=sel.dtype, description="dtype")
        sweep_w = w.Checkbox(value=sel.sweep, description="sweep sizes", indent=False)
        repeats_w = w.IntSlider(value=self.repeats, min=3, max=50, continuous_update=False, description="repeats",
                                disabled=not self.live)
        out = w.Output()  # no fixed height: the page grows with the outputs instead of a scroll box
        launch = w.HTML(str(launch_html(spec.name, spec.variants)), layout=w.Layout(width="420px"))
        updating = {"now": False}
        # launch knobs: the controls of one rung's knobs; "build and time" adds a configuration (live)
        tried = list(sel.knobs)
        knob_rung_w = w.Dropdown(description="knobs of", disabled=not self.live)
        knob_box = w.HBox()
        build_w = w.Button(description="build and time", disabled=not self.live,
                           tooltip="compile this configuration (cached) and time it" if self.live else "needs a GPU")

        def knob_rungs():
            return [v for v in variants_w.value if knobs.knobs(problem_w.value, v)]

        def show_knobs(_=None):
            rung = knob_rung_w.value
            declared = knobs.knobs(problem_w.value, rung) if rung else ()
            knob_box.children = [w.Dropdown(options=k.allowed, value=k.default, description=k.name,
                                            disabled=not self.live, layout=w.Layout(width="180px"))
                                 for k in declared]

        def set_knob_rungs():
            rungs = knob_rungs()
            knob_rung_w.options = rungs
            knob_rung_w.value = knob_rung_w.value if knob_rung_w.value in rungs else (rungs[-1] if rungs else None)
            show_knobs()

        def refresh(_=None):
            if updating["now"]:
                return
            self.repeats = repeats_w.value
            current = Selection(problem_w.value, tuple(variants_w.value), size_w.value, dtype_w.value, sweep_w.value,
                                tuple(tried))
            with out:
                out.clear_output(wait=True)
                for item in self.render(current):
                    display(item)

        def on_build(_):
            if knob_rung_w.value is None:
                return
            tried.append((knob_rung_w.value, {c.description: c.value for c in knob_box.children}))
            refresh()

        def on_variants(_):
            set_knob_rungs()
            refresh()

        def on_problem(change):
            new = problems.get(change["new"])  # the dropdown names it
            updating["now"] = True
            variants_w.options, variants_w.value = new.variants, tuple(new.variants)
            size_w.options = list(new.sizes)
            size_w.value = sel.size if sel.size in new.sizes else "small"
            dtype_w.options, dtype_w.value = self.dtypes(new), "float32"
            launch.value = str(launch_html(new.name, new.variants))
            tried.clear()
            set_knob_rungs()
            updating["now"] = False
            refresh()

        problem_w.observe(on_problem, names="value")
        variants_w.observe(on_variants, names="value")
        for control in (size_w, dtype_w, sweep_w, repeats_w):
            control.observe(refresh, names="value")
        knob_rung_w.observe(show_knobs, names="value")
        build_w.on_click(on_build)
        set_knob_rungs()
        refresh()
        return w.VBox([w.HBox([problem_w, size_w, dtype_w, sweep_w]),
                       w.HBox([variants_w, w.VBox([repeats_w, launch])]),
                       w.HBox([knob_rung_w, knob_box, build_w]), out])


def launch_html(problem: str, variants: tuple[str, ...] | list[str]) -> Html:
    """:func:`launch_note` as a small paragraph."""
    text = launch_note(problem, variants)
    return Html(f"<p><small>{html.escape(text)}</small></p>", plain=text)


def gradient_in_forward_notes(section: records.Section):
    """What Nsight Compute measured of each timed row whose kernels moved almost none of its bytes
    (its work done in another direction, as Liger's cross-entropy backward: ``evidence.work_elsewhere``),
    with its timed ms and why (``evidence.WHY_ELSEWHERE``); [] where there is none."""
    note = evidence.work_elsewhere_note(section)
    return [note] if note.data else []
