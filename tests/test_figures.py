"""Figures people can read (cpu tier, issue 26): every figure a notebook shows has a title, labelled
axes (with units where the axis is numeric) and a legend where it draws more than one series; no
two texts of a figure overlap once it is drawn; the roofline has log axes, its ceilings named on
their lines, and a point whose kernels moved no bytes marked instead of stretching the axis; the
sweep charts have a log size axis with a tick at every recorded shape.

The figures are made from the committed records under ``reports/results/`` (every device, every
problem) and from the shared ``make_section`` fixture; nothing is written anywhere.
"""
import itertools
import re

import matplotlib
import pytest

matplotlib.use("Agg")

from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402 (after the backend)
from matplotlib.category import StrCategoryConverter  # noqa: E402
from matplotlib.container import BarContainer  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from losslab import problems, records  # noqa: E402
from losslab.measure.bench import SWEEP_DIRECTIONS  # noqa: E402
from losslab.present import charts, evidence, results, roofline, vocab_parallel  # noqa: E402
from losslab.teach import explorer  # noqa: E402

# a numeric axis names its unit: time, bytes, rates, shares, or what it counts
UNIT = re.compile(r"\bms\b|GB/s|\bMB\b|FLOP/s|FLOP / byte|%|\bbytes?\b|\bfloats?\b|\blines?\b|\bGPUs\b")


@pytest.fixture(autouse=True)
def _close_figures():
    """The rooflines are pyplot figures (a notebook shows them with plt.show()): close them after each test."""
    import matplotlib.pyplot as plt

    yield
    plt.close("all")


def recorded(device: str) -> list[str]:
    """The problems recorded on ``device`` (a loss just added has none until a GPU records it)."""
    return [p for p in problems.names() if any(p in r.sections and records.device_slug(r.device) ==
                                               records.device_slug(device) for r in records.load_records())]


def committed() -> list[records.Section]:
    """The newest section of every recorded problem on every recorded device."""
    return [records.latest_section(p, d) for d in records.devices() for p in recorded(d)]


def drawn(fig):
    """``fig`` rendered once (Agg), as a notebook or the report renders it; returns the renderer."""
    if not isinstance(fig.canvas, FigureCanvasAgg):
        FigureCanvasAgg(fig)
    fig.canvas.draw()
    return fig.canvas.get_renderer()


def texts(fig) -> list:
    """Every visible, non-empty text of ``fig``: titles, axis labels, and the texts on the axes."""
    found = [fig._suptitle] if fig._suptitle is not None else []
    found += list(fig.texts)
    for ax in fig.axes:
        found += [ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label, *ax.texts]
    unique = {id(t): t for t in found}  # the suptitle is among fig.texts too
    return [t for t in unique.values() if t.get_visible() and t.get_text().strip()]


def overlaps(fig) -> list[str]:
    """Pairs of texts whose rendered boxes overlap by more than a pixel each way."""
    renderer = drawn(fig)
    # Text's own box: an annotation's get_window_extent adds its leader line, which may cross labels
    boxes = [(t.get_text(), Text.get_window_extent(t, renderer)) for t in texts(fig)]
    out = []
    for (a, box_a), (b, box_b) in itertools.combinations(boxes, 2):
        dx = min(box_a.x1, box_b.x1) - max(box_a.x0, box_b.x0)
        dy = min(box_a.y1, box_b.y1) - max(box_a.y0, box_b.y0)
        if dx > 1 and dy > 1:
            out.append(f"{a[:50]!r} / {b[:50]!r}")
    return out


def series(ax) -> int:
    """Lines with a label and data, plus one per colour of bars: what a legend has to tell apart."""
    lines = [line for line in ax.get_lines() if len(line.get_xdata()) and not line.get_label().startswith("_")]
    colours = {tuple(bar.get_facecolor()) for c in ax.containers if isinstance(c, BarContainer) for bar in c}
    return len(lines) + len(colours)


def categorical(axis) -> bool:
    return isinstance(axis.get_converter(), StrCategoryConverter)


def check_readable(fig, what: str) -> None:
    """Title, labelled axes (units where numeric), a legend for several series, no overlapping texts."""
    assert fig.get_suptitle().strip() or all(ax.get_title().strip() for ax in fig.axes), f"{what}: no title"
    for ax in fig.axes:
        for axis, siblings in ((ax.xaxis, ax.get_shared_x_axes()), (ax.yaxis, ax.get_shared_y_axes())):
            shared = [a for a in siblings.get_siblings(ax)]
            labels = [(a.xaxis if axis is ax.xaxis else a.yaxis).get_label_text() for a in shared]
            label = axis.get_label_text() or next((t for t in labels if t), "")
            assert label.strip(), f"{what}: an axis without a label"
            if not categorical(axis):
                assert UNIT.search(label), f"{what}: axis label {label!r} names no unit"
    if sum(series(ax) for ax in fig.axes) > 1:
        assert fig.legends or any(ax.get_legend() for ax in fig.axes), f"{what}: several series and no legend"
    found = overlaps(fig)
    assert not found, f"{what}: overlapping texts: {found[:5]}"


# --- every figure of the workbook, on the committed records --------------------------------------------------

@pytest.mark.parametrize("section", committed(), ids=lambda s: f"{s.problem}-{records.device_slug(s.device)}")
def test_the_bandwidth_chart_is_readable(section):
    check_readable(charts.bandwidth_chart(section), f"bandwidth chart {section.problem} {section.device}")


@pytest.mark.parametrize("section", committed(), ids=lambda s: f"{s.problem}-{records.device_slug(s.device)}")
def test_the_roofline_is_readable(section):
    check_readable(roofline.plot_roofline(section), f"roofline {section.problem} {section.device}")


@pytest.mark.parametrize("device", records.devices())
def test_the_roofline_of_all_problems_is_readable(device):
    sections = [records.latest_section(p, device) for p in recorded(device)]
    check_readable(roofline.plot_roofline(sections), f"roofline of all problems on {device}")


@pytest.mark.parametrize("section", committed(), ids=lambda s: f"{s.problem}-{records.device_slug(s.device)}")
def test_every_sweep_chart_is_readable_on_a_log_size_axis_with_every_recorded_size(section):
    for dtype in charts.sweep_dtypes(section):
        for direction in SWEEP_DIRECTIONS:
            fig = charts.sweep_chart(section, dtype, direction)
            what = f"sweep {section.problem} {section.device} {dtype} {direction}"
            check_readable(fig, what)
            lines = section.sweep(dtype, direction)
            shapes = {tuple(p.shape) for line in lines for p in line.points}
            positions = charts.sweep_positions(lines)
            for ax in fig.axes:
                assert ax.get_xscale() == "log", what
                assert sorted(ax.get_xticks()) == pytest.approx(sorted(positions.values())), what
            labels = " ".join(t.get_text() for t in fig.axes[-1].get_xticklabels())
            assert all(f"{a}\u00d7{b}" in labels for a, b in shapes), f"{what}: a recorded shape has no tick"


def test_the_coalescing_figure_and_the_model_only_roofline_are_readable():
    for cols in (4096, 16384):
        check_readable(charts.coalescing_figure(cols), f"coalescing figure at D = {cols}")
    check_readable(roofline.plot_model_only(problems.registered()), "model-only roofline")


def test_the_explorers_roofline_is_readable():
    section = records.latest_section("cross_entropy")
    check_readable(explorer.Explorer(live=False).roofline_figure(section.view()), "explorer roofline")


def test_the_vocab_parallel_figures_are_readable(vocab_parallel_record):
    check_readable(vocab_parallel.timeline_figure(vocab_parallel_record), "vocab_parallel timeline")
    check_readable(vocab_parallel.scaling_figure(vocab_parallel_record), "vocab_parallel scaling model")


def test_the_fixture_figures_are_readable(make_section):
    section = make_section()  # naive 100x slower: a log bar axis
    check_readable(charts.bandwidth_chart(section), "fixture bandwidth chart")
    check_readable(roofline.plot_roofline(section), "fixture roofline")


# --- the roofline: log axes, ceilings named on their lines, no point drawn at zero bytes -----------------------

@pytest.mark.parametrize("section", committed(), ids=lambda s: f"{s.problem}-{records.device_slug(s.device)}")
def test_the_rooflines_ceilings_are_named_on_their_lines_and_every_point_labelled(section):
    fig = roofline.plot_roofline(section)
    ax = fig.axes[0]
    assert ax.get_xscale() == ax.get_yscale() == "log"
    shown = [t.get_text() for t in ax.texts]
    bw = results.bandwidth_gbps(section)
    assert any(f"read {bw['read']:.0f}" in t and f"copy {bw['copy']:.0f} GB/s" in t for t in shown), shown
    assert any(t.startswith("FP32 roof") for t in shown)
    for label, _ in roofline.mufu_roofs([section.view()]):
        name = label.split(":")[0]
        assert any(t.startswith(name + ":") for t in shown), name
    pts = roofline.points(section)
    assert sum(bool(re.search(r"\((fwd|bwd|fwd\+bwd)\)", t)) for t in shown) == len(pts)
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert not any("roof" in t for t in legend), "the ceilings are named on their lines, not in the legend"


def test_a_point_whose_kernels_moved_no_bytes_is_marked_and_explained_not_drawn_at_zero():
    """Liger's cross-entropy backward (its gradient written in its forward): Nsight Compute measured
    a few KB for a 1 GB backward. No measured-traffic point at ~1e5 FLOP/B, a ring, a label and a note."""
    found = [s for s in (records.latest_section("cross_entropy", d) for d in records.devices())
             if evidence.work_elsewhere(s)]
    if not found:
        pytest.skip("no committed record holds a row whose kernels moved no bytes")
    for section in found:
        away = {(e.implementation, e.direction) for e in evidence.work_elsewhere(section)}
        pts = [p for p in roofline.points(section) if (p.implementation, p.direction) in away]
        assert pts and all(p.elsewhere and p.measured_intensity is None for p in pts)
        ax = roofline.plot_roofline(section).axes[0]
        assert ax.get_xlim()[1] < 1e3, "the x axis was stretched towards the no-bytes point"
        shown = [t.get_text() for t in ax.texts]
        for p in pts:
            assert any(t.startswith(f"{p.implementation} ({roofline.SHORT[p.direction]})") and
                       roofline.ELSEWHERE in t for t in shown)
        assert any("work was done in another direction" in t for t in shown)
        rings = [line for line in ax.lines if line.get_marker() == "o" and line.get_markersize() == 15]
        assert len(rings) == len(pts)


def test_the_overlap_check_can_fail():
    """A figure with two texts at the same place fails the check (so a pass means something)."""
    from matplotlib.figure import Figure

    fig = Figure()
    ax = fig.subplots()
    ax.text(0.5, 0.5, "one label")
    ax.text(0.5, 0.5, "another label")
    assert overlaps(fig)


def test_the_linear_cross_entropy_figures_are_readable():
    from losslab.linear_cross_entropy import figures

    heads = {"Llama-3-8B": (8192, 4096, 128256), "Gemma-2-2B": (8192, 2304, 256000)}
    check_readable(figures.bytes_figure(heads), "linear cross-entropy bytes per step")
    check_readable(figures.roofline_figure("NVIDIA H200"), "linear cross-entropy roofline without a record")
    peer = {"median_ms": 40.0, "extra_bytes": 2**30}
    head = {"label": "Llama-3-8B", "tokens": 8192, "hidden": 4096, "vocab": 128256,
            "peers": {"gemms": peer, "eager": dict(peer, median_ms=50.0), "losslab": dict(peer, median_ms=42.0)}}
    check_readable(figures.roofline_figure("NVIDIA H100 80GB HBM3", head), "linear cross-entropy roofline")
