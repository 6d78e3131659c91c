"""What the notebooks show (cpu tier): results loaded and bannered (``present.results``), the
ladder's sources and diffs (``present.ladder``), the tables (``present.tables``), the charts
(``present.charts``), the evidence per step (``present.evidence``: every claim notebooks 01-03
make holds on the committed records, and fails on a doctored copy) and the SASS per rung
(``present.machine_code``, compile tier); rows below the physical floor marked wherever they
appear; records of several devices and runs told apart.

The sections are the shared ``make_section`` fixture (made-up round numbers) or copies of it,
written only to tmp folders; the evidence tests also read the committed records under
``reports/results/``.
"""
import dataclasses
import html
import json
import re

import pytest
import torch
from matplotlib.figure import Figure

from losslab import problems, records
from losslab.build import ROOT
from losslab.measure.bench import flag_physical_floor
from losslab.present import charts, evidence, ladder, machine_code, results, tables
from losslab.present import html as present_html

KL_DIV, CROSS_ENTROPY = problems.get("kl_div"), problems.get("cross_entropy")

H200 = "NVIDIA H200"  # a device with datasheet figures, so the physical floor applies
# (problem, device) of every committed section, newest device first: a loss not yet measured on a device has none
RECORDED = [(problem, r.device) for r in records.load_records(records.RESULTS_DIR) for problem in problems.names()
            if problem in r.sections]


@pytest.fixture
def section(make_section):
    """The fixture section: a recorded Section of kl_div."""
    return make_section()


def with_rows(section: records.Section, rows) -> records.Section:
    """``section`` holding ``rows`` instead, each flagged against its device's physical floor (as a
    record read from a file is)."""
    return dataclasses.replace(section, rows=[flag_physical_floor(r, section.device, section.spec) for r in rows])


def below_floor_section(make_section, device: str = H200):
    """The fixture section on a real device, with vectorized's backward at 1 us: below any floor."""
    section = make_section(device=device)
    return with_rows(section, [dataclasses.replace(r, median_ms=0.001)
                               if (r.implementation, r.direction) == ("vectorized", "backward") else r
                               for r in section.rows])


# --- results: loading and banners ------------------------------------------------------------------

def test_no_record_gives_none_and_names_the_folder_looked_in(results_dir):
    assert results.load_results(KL_DIV, live=False, results_dir=results_dir) is None
    text = results.banner(None, KL_DIV, results_dir=results_dir).plain
    assert "No recorded results for kl_div" in text and results.shown_path(results_dir) in text
    assert "reports/results" not in text  # today's main said it looked there whatever the folder
    for render in (tables.check_table, tables.timing_table, charts.bandwidth_chart, tables.measured_floor):
        assert "No results yet" in render(None)


def test_a_device_without_a_record_names_the_devices_that_have_one(recorded_dir):
    assert results.load_results(KL_DIV, device="NVIDIA B200", live=False, results_dir=recorded_dir) is None
    text = results.banner(None, KL_DIV, device="NVIDIA B200", results_dir=recorded_dir).plain
    assert "on NVIDIA B200" in text and "records there: Fixture GPU" in text


def test_load_recorded(recorded_dir):
    section = results.load_results(KL_DIV, live=False, results_dir=recorded_dir)
    assert isinstance(section, records.Section)
    assert section.source == "recorded" and section.problem == "kl_div" and section.device == "Fixture GPU"
    # a device by its file-name slug; an unknown device has no record
    assert results.load_results(KL_DIV, device="fixture-gpu", live=False, results_dir=recorded_dir)
    assert results.load_results(KL_DIV, device="Other GPU", live=False, results_dir=recorded_dir) is None


def test_load_recorded_keeps_the_variants_asked_for(recorded_dir):
    section = results.load_results(KL_DIV, variants=["vectorized"], live=False, results_dir=recorded_dir)
    assert {r.implementation for r in section.rows} == {"vectorized", "eager", "compile"}
    assert {c.variant for c in section.checks} == {"vectorized"}


def test_load_rejects_unknown_names():
    with pytest.raises(ValueError, match="size"):
        results.load_results(KL_DIV, size="huge", live=False)
    with pytest.raises(ValueError, match="variant"):
        results.load_results(KL_DIV, variants=["fastest"], live=False)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without a GPU")
def test_live_without_gpu_says_why():
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        results.load_results(KL_DIV, live=True)


def test_banner_states_source_device_date_versions_and_freshness(make_section):
    fresh = make_section()
    text = results.banner(fresh, KL_DIV).plain
    assert text.startswith("RECORDED results") and "Fixture GPU" in text and "2000-01-01 00:00 UTC" in text
    assert "torch fixture, CUDA fixture" in text and "matches the sources now" in text and "NOT" not in text
    stale = make_section(fresh=False)
    assert "does NOT match the sources now" in results.banner(stale, KL_DIV).plain
    live = dataclasses.replace(fresh, source="live")
    assert results.banner(live, KL_DIV).plain.startswith("LIVE results")
    # what the banner states travels in the output's metadata, where the report reads it
    _, metadata = results.banner(fresh, KL_DIV)._repr_mimebundle_()
    assert metadata[results.METADATA_KEY]["fresh"] is True
    assert metadata[results.METADATA_KEY]["dates"] == ["2000-01-01T00:00:00+00:00"]


def test_banner_notes_a_size_the_record_was_not_taken_at(section):
    assert "applies to live runs only" in results.banner(section, KL_DIV, "small").plain
    assert "applies to live runs only" not in results.banner(section, KL_DIV, "seed").plain


def test_rows_of_several_runs_name_each_date(section):
    """A record merged from two runs: the banner names both dates and the timing table dates each row."""
    later = [dataclasses.replace(r, date="2000-02-02T12:00:00+00:00") if r.implementation == "vectorized" else r
             for r in section.rows]
    mixed = dataclasses.replace(section, rows=later)
    text = results.banner(mixed, KL_DIV).plain
    assert "2 runs from 2000-01-01 00:00 UTC to 2000-02-02 12:00 UTC" in text
    table = tables.timing_table(mixed)
    assert "<th" in table and ">measured</th>" in table and "2000-02-02 12:00 UTC" in table
    assert ">measured</th>" not in tables.timing_table(section)  # one run: no date column


def test_records_of_two_devices_are_shown_apart(results_dir, make_section):
    """Each device's own record, never another's rows under its name; the records table lists both."""
    records.save_section("kl_div", make_section(device="GPU A"), results_dir)
    b = make_section(device="GPU B")
    later = "2001-01-01T00:00:00+00:00"
    records.save_section("kl_div", dataclasses.replace(b, rows=[dataclasses.replace(r, date=later) for r in b.rows],
                                                       checks=[dataclasses.replace(c, date=later) for c in b.checks]),
                         results_dir)
    a = results.load_results(KL_DIV, device="GPU A", live=False, results_dir=results_dir)
    newest = results.load_results(KL_DIV, live=False, results_dir=results_dir)
    assert a.device == "GPU A" and "GPU A" in results.banner(a, KL_DIV).plain
    assert newest.device == "GPU B" and "2001-01-01" in results.banner(newest, KL_DIV).plain
    listed = tables.records_table(results_dir)
    assert "GPU A" in listed and "GPU B" in listed and "2001-01-01 00:00 UTC" in listed


# --- the ladder ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("left,right", [("naive", "shared_memory"), ("warp_shuffle", "vectorized")])
def test_side_by_side_shows_both_sources_escaped(left, right):
    page = ladder.side_by_side(KL_DIV, left, right)
    for variant in (left, right):
        source = ladder.kernel_source(KL_DIV, variant)
        assert f"kernels/kl_div/ladder/{variant}.cu" in page  # the teaching rung the lesson reads
        assert html.escape(source.splitlines()[0]) in page  # the header comment names the rung
    assert '#include "' not in page and "#include &quot;" in page
    assert page.index(left) < page.index(right)


def test_side_by_side_rejects_unknown_variant():
    with pytest.raises(ValueError, match="variant"):
        ladder.side_by_side(KL_DIV, "naive", "magic")


@pytest.mark.parametrize("problem,variant", [(p, v) for p in problems.names() for v in problems.get(p).variants])
def test_every_rung_opens_with_what_it_fixes(problem, variant):
    assert len(ladder.rung_header(problems.get(problem), variant)) > 40
    assert ladder.rung_header(problems.get(problem), variant) in ladder.ladder_summary(problems.get(problem)).plain


# --- tables ---------------------------------------------------------------------------------------------

def test_cost_table_counts_the_bytes():
    """Forward at the seed size reads 2 x 16384 x 16384 x 4 bytes = 2 GiB; bf16 half of it."""
    table = tables.cost_table(KL_DIV, (16384, 16384))
    assert "2.00 GiB" in table and "ms at 1 TB/s" in table
    assert "1.00 GiB" in tables.cost_table(KL_DIV, (16384, 16384), dtype="bfloat16")
    measured = tables.cost_table(KL_DIV, (16384, 16384), {"read": 1000.0, "copy": 900.0},
                                 measured_on="recorded on GPU X")
    assert "floor ms" in measured and "read 1000 GB/s" in measured and "bandwidth recorded on GPU X" in measured


def test_floor_is_bytes_over_bandwidth():
    bandwidth = {"read": 1000.0, "copy": 500.0}
    shape = (16384, 16384)
    forward = problems.get("kl_div").cost(shape, "forward").bytes
    assert tables.floor_ms(KL_DIV, shape, "forward", bandwidth) == pytest.approx(forward / 1e12 * 1e3)
    backward = problems.get("kl_div").cost(shape, "backward").bytes
    assert tables.floor_ms(KL_DIV, shape, "backward", bandwidth) == pytest.approx(backward / 5e11 * 1e3)


def test_check_table_marks_failures(section):
    table = tables.check_table(section)
    total = 4 * len(problems.get("kl_div").variants)  # two cases, two directions per variant
    assert f"{total - 1} of {total} checks passed" in table and "checked on Fixture GPU" in table
    assert table.count("&#10007;") == 1 and 'title="fixture failure"' in table


def test_timing_table_has_the_columns_and_says_where(section):
    table = tables.timing_table(section)
    for column in ("median ms", "p10-p90 ms", "GB/s", "of bandwidth", "extra MiB", "&times; eager",
                   "&times; compile", "&times; rung below"):
        assert column in table
    assert "100.00" in table  # shared_memory is 100x the fixture's naive
    assert "recorded on Fixture GPU on 2000-01-01 00:00 UTC (torch fixture, CUDA fixture)" in table
    assert tables.FLAG not in table  # no datasheet for the fixture device: nothing flagged


def test_timing_table_says_why_a_peer_was_not_timed_at_its_shape_and_dtype(section):
    shape = section.primary_shape
    section.skipped = [records.Skipped("kl_div", shape, "float32", "quack", "quack-kernels has no kl_div"),
                       records.Skipped("kl_div", shape, "bfloat16", "liger", "not at this dtype")]
    table = tables.timing_table(section)
    assert "quack not timed: quack-kernels has no kl_div" in table and "liger" not in table
    assert "\n* quack not timed: quack-kernels has no kl_div" in table.plain


def test_ceilings_table_names_device_and_datasheet(make_section):
    table = tables.ceilings_table(make_section(device=H200))
    assert "read bandwidth" in table and "1,000.0" in table and "4,800.0" in table  # measured, datasheet
    assert "recorded on NVIDIA H200" in table.plain and "datasheet (H200 SXM" in table.plain


def test_html_shows_its_plain_form_as_text_and_carries_metadata():
    """What a console or a text export of a notebook shows: the plain form, not the HTML source."""
    from IPython.core.formatters import DisplayFormatter

    data, metadata = DisplayFormatter().format(present_html.Html("<b>x</b>", plain="x", metadata={"k": 1}))
    assert data["text/plain"] == "x" and data["text/html"] == "<b>x</b>" and metadata == {"k": 1}


def test_html_table_is_public_and_formats_are_shared():
    page = present_html.table(["a", "b"], [["x", "1"]], caption="c", text_columns=1)
    assert "<caption" in page and 'text-align:right' in page
    assert present_html.format_bytes(2**31) == "2.00 GiB" and present_html.format_bytes(100) == "100 B"
    assert present_html.format_date("2000-01-01T00:00:00+00:00") == "2000-01-01 00:00 UTC"


# --- rows below the physical floor -------------------------------------------------------------------------

def test_a_row_below_the_physical_floor_is_marked_and_explained_in_the_table(make_section):
    flagged = below_floor_section(make_section)
    table = tables.timing_table(flagged)
    assert table.count(tables.FLAG) == 2  # the mark on the row, and the note under the table
    assert "vectorized backward: 0.001 ms is below the physical floor" in table
    assert "H200 SXM datasheet peak" in table and "not a result" in table
    assert "below the physical floor" in table.plain


def test_a_bar_below_the_physical_floor_is_hatched_and_explained(make_section):
    fig = charts.bandwidth_chart(below_floor_section(make_section))
    backward = fig.axes[problems.DIRECTIONS.index("backward")]
    hatched = [p for p in backward.patches if p.get_hatch()]
    assert len(hatched) == 1
    labels = [t.get_text() for t in backward.get_xticklabels()]
    assert "vectorized \u2020" in labels
    assert "below the physical floor" in fig._suptitle.get_text()


def test_a_recorded_time_below_the_floor_is_flagged_where_it_is_shown():
    """The committed records: a row below the physical floor (Liger's cross-entropy backward,
    0.181 ms for 1.07 GB on the H100) is flagged in the timing table and the bandwidth chart."""
    from losslab import records

    flagged = [(problem, device) for problem, device in RECORDED
               if any(r.below_floor for r in records.latest_section(problem, device).rows)]
    if not flagged:
        pytest.skip("no committed record holds a time below the physical floor")
    for problem, device in flagged:
        section = results.load_results(problems.get(problem), device=device, live=False)
        table = tables.timing_table(section)
        assert "below the physical floor" in table, (problem, device)
        assert "below the physical floor" in charts.bandwidth_chart(section)._suptitle.get_text(), (problem, device)


# --- charts -------------------------------------------------------------------------------------------------

def test_bandwidth_chart_goes_log_when_naive_is_far_below(section):
    fig = charts.bandwidth_chart(section)
    assert isinstance(fig, Figure) and len(fig.axes) == len(problems.DIRECTIONS)
    assert fig.axes[0].get_yscale() == "log" and "log scale" in fig.axes[0].get_ylabel()
    lines = {round(line.get_ydata()[0]) for line in fig.axes[0].get_lines()}
    assert lines == {1000, 900}  # the measured read and copy bandwidth
    assert "recorded on Fixture GPU on 2000-01-01 00:00 UTC" in fig._suptitle.get_text()


def test_bandwidth_chart_linear_without_naive(section):
    fig = charts.bandwidth_chart(dataclasses.replace(section, rows=[r for r in section.rows
                                                                    if r.implementation != "naive"]))
    assert fig.axes[0].get_yscale() == "linear"


SWEEP_TIMES = {  # implementation: (fixed ms per call, GB/s past it): compile leads small, vectorized large
    "naive": (0.05, 20.0), "shared_memory": (0.03, 400.0), "warp_shuffle": (0.03, 500.0),
    "vectorized": (0.03, 950.0), "fused": (0.03, 940.0), "eager": (0.02, 600.0), "compile": (0.005, 800.0)}


def sweep_section(make_section, device: str = H200) -> records.Section:
    """The fixture section's float32 rows at three kl_div shapes (the seed among them), timed as a
    fixed cost plus bytes over a bandwidth (``SWEEP_TIMES``); fused's forward at the seed size at
    1 us, below the physical floor."""
    section = make_section(device=device)
    spec = problems.get("kl_div")
    rows = []
    for shape in ((128, 16384), (2048, 16384), spec.sizes["seed"]):
        for row in section.rows:
            fixed, gbps = SWEEP_TIMES[row.implementation]
            nbytes = spec.cost(shape, row.direction).bytes
            ms = 0.001 if (row.implementation, row.direction, shape) == ("fused", "forward", spec.sizes["seed"]) \
                else fixed + nbytes / gbps / 1e6
            rows.append(dataclasses.replace(row, shape=tuple(shape), median_ms=ms, p10_ms=ms, p90_ms=ms,
                                            gbps=nbytes / ms / 1e6, fraction_of_bandwidth=nbytes / ms / 1e6 / 1000.0))
    return with_rows(section, rows)


def test_sweep_chart_draws_time_and_bandwidth_against_size_per_implementation(make_section):
    section = sweep_section(make_section)
    fig = charts.sweep_chart(section, "float32", "forward")
    assert isinstance(fig, Figure)
    time_ax, fraction_ax = fig.axes
    # log size axis with a tick at every shape, log time, linear share of the bandwidth (issue 26)
    assert time_ax.get_xscale() == fraction_ax.get_xscale() == time_ax.get_yscale() == "log"
    assert fraction_ax.get_yscale() == "linear"
    lines = {line.get_label(): line for line in time_ax.get_lines() if not line.get_label().startswith("_")}
    assert list(lines) == [*problems.get("kl_div").variants, "eager", "compile"]  # ladder order, then the peers
    megabytes = [16.77722, 268.43546, 2147.483652]
    assert sorted(time_ax.get_xticks()) == pytest.approx(megabytes)
    for name, line in lines.items():
        assert list(line.get_xdata()) == pytest.approx(megabytes)
        assert line.get_linestyle() == ("--" if name in ("eager", "compile") else "-")
    fixed, gbps = SWEEP_TIMES["vectorized"]
    assert list(lines["vectorized"].get_ydata()) == pytest.approx([fixed + mb / gbps for mb in megabytes])
    fractions = [line for line in fraction_ax.get_lines() if len(line.get_xdata()) == 3]
    assert len(fractions) == len(lines)
    assert fractions[3].get_ydata()[-1] == pytest.approx(100 * 2147.483652 / (fixed + 2147.483652 / gbps) / 1000)
    # the point below the physical floor is crossed out in red on both panels and explained
    for ax in (time_ax, fraction_ax):
        crosses = [line for line in ax.get_lines() if line.get_marker() == "x"]
        assert len(crosses) == 1 and crosses[0].get_color() == "tab:red"
        assert list(crosses[0].get_xdata()) == pytest.approx([2147.483652])
    title = fig.get_suptitle()
    assert "kl_div float32 forward" in title and "recorded on NVIDIA H200" in title
    assert "below the physical floor" in title and "not a result" in title
    # compile's small fixed cost wins the launch-bound sizes; fused's impossible time never leads
    assert "fastest: compile 16.8 MB, vectorized 268\u20132,147 MB" in title


def test_sweep_shapes_of_the_same_bytes_stand_side_by_side(make_section):
    """16384 x 16384 and 2048 x 131072 move the same bytes: two ticks, neither hiding the other."""
    section = sweep_section(make_section)
    wide = [dataclasses.replace(r, shape=(2048, 131072)) for r in section.rows if tuple(r.shape) == (16384, 16384)]
    lines = dataclasses.replace(section, rows=section.rows + wide).sweep("float32", "forward")
    x = charts.sweep_positions(lines)
    assert x[16384, 16384] == pytest.approx(2147.483652)
    assert x[2048, 131072] == pytest.approx(2147.483652 * charts.SIDE_BY_SIDE)


def test_sweep_title_names_the_shape_where_two_share_their_bytes(make_section):
    """Two leaders at 2,147 MB (16384 x 16384 and 2048 x 131072) read as two sizes, not one size twice."""
    section = sweep_section(make_section)
    wide = [dataclasses.replace(r, shape=(2048, 131072), median_ms=r.median_ms * (0.9 if r.implementation == "compile"
                                                                                   else 2))
            for r in section.rows if tuple(r.shape) == (16384, 16384)]
    lines = dataclasses.replace(section, rows=section.rows + wide).sweep("float32", "forward")
    assert charts.leaders_text(lines) == ("compile 16.8 MB, vectorized 268 MB \u2013 2,147 MB (16384\u00d716384), "
                                          "compile 2,147 MB (2048\u00d7131072)")
    assert charts.leaders_text(section.sweep("float32", "forward")) == "compile 16.8 MB, vectorized 268\u20132,147 MB"


def test_sweep_growth_reads_the_steps_between_sizes_from_the_sweep(make_section):
    text = charts.sweep_growth(sweep_section(make_section), "float32", "forward").data
    assert "- 128\u00d716384 \u2192 2048\u00d716384: bytes \u00d716, time \u00d7" in text
    assert "fused" not in text.split("2048\u00d716384 \u2192")[1]  # a time below the floor never leads
    # forward+backward: the host's floor under the steps, where the section's ceilings hold it
    section = sweep_section(make_section)
    assert "host's floor (PyTorch's own `x.sum()` forward+backward at 128\u00d74096): not in this record" in \
        charts.sweep_growth(section, "float32", "forward_backward").data
    floor = {"host_ms": 0.146, "median_ms": 0.012, "back_to_back_ms": 0.011}
    section = dataclasses.replace(section, ceilings={**section.ceilings, "autograd_floor": floor})
    assert "host's floor" not in charts.sweep_growth(section, "float32", "forward").data
    assert ("- the host's floor: PyTorch's own `x.sum()` forward+backward at 128\u00d74096 takes 0.146 ms of host "
            "time a call (0.012 ms on the GPU)") in charts.sweep_growth(section, "float32", "forward_backward").data


def test_sweep_chart_without_a_sweep_says_how_to_record_one(make_section, section):
    for empty in (None, section, sweep_section(make_section).view()):
        shown = charts.sweep_chart(empty, "float32", "forward")
        assert not isinstance(shown, Figure)
        assert "no sweep recorded yet: run `python -m losslab bench --all --sweep` on a GPU machine" in shown.plain
    assert "kl_div bfloat16 forward: no sweep" in charts.sweep_chart(sweep_section(make_section), "bfloat16").plain
    assert charts.sweep_dtypes(sweep_section(make_section)) == ["float32"]
    assert charts.sweep_dtypes(section) == charts.sweep_dtypes(None) == []


def test_sweep_chart_rejects_unknown_names(make_section):
    with pytest.raises(ValueError, match="direction: expected one of forward, backward, forward_backward"):
        charts.sweep_chart(sweep_section(make_section), "float32", "sideways")
    with pytest.raises(ValueError, match="dtype: expected one of"):
        charts.sweep_chart(sweep_section(make_section), "fp32", "forward")


def test_coalescing_figure_counts_lines_and_sectors():
    fig = charts.coalescing_figure(16384)
    titles = [ax.get_title() for ax in fig.axes]
    assert "32 line(s), 32 sectors requested from L1/L2 for 128 bytes" in titles[0]
    assert "1 line(s), 4 sectors requested from L1/L2 for 128 bytes" in titles[1]
    assert "4 line(s), 16 sectors requested from L1/L2 for 512 bytes" in titles[2]
    assert "not DRAM bytes" in fig.get_suptitle()  # naive reads the minimum from DRAM (ncu)


# --- diffs between adjacent rungs -------------------------------------------------------------------

def test_rung_diff_shows_the_teaching_rungs_changed_lines():
    """The lesson's diff is of the teaching rungs (kernels/<loss>/ladder/): the idea and nothing else."""
    text = ladder.rung_diff(KL_DIV, "shared_memory", "warp_shuffle").plain
    assert text.startswith("--- kernels/kl_div/ladder/shared_memory.cu\n+++ kernels/kl_div/ladder/warp_shuffle.cu")
    added = [line for line in text.splitlines() if line.startswith("+") and not line.startswith("+++")]
    removed = [line for line in text.splitlines() if line.startswith("-") and not line.startswith("---")]
    assert any("__shfl_xor_sync" in line for line in added)
    assert any("partial[threadIdx.x] += partial[threadIdx.x + stride]" in line for line in removed)
    assert max(len(added), len(removed)) <= 40  # one idea (tests/test_ladder.py holds every step)


@pytest.mark.parametrize("problem, rung, helpers", [
    ("kl_div", "vectorized", ["load_pack", "block_reduce_sum"]),
    ("cross_entropy", "fused", ["lse_add", "block_reduce_logsumexp", "block_reduce_sum"]),
])
def test_the_diff_to_the_operator_counts_its_lines_and_inlines_its_helpers(problem, rung, helpers):
    text = ladder.rung_diff(problems.get(problem), rung, rung, to_operator=True).plain
    head, first = text.splitlines()[:2]
    assert re.fullmatch(r"\d+ lines added, \d+ removed", head) and int(head.split()[0]) > 40
    assert first == f"--- kernels/{problem}/ladder/{rung}.cu"
    for helper in helpers:
        assert text.count(f"|   --- {helper}, from kernels/") == 1  # inlined once, where first used


def test_helper_source_is_the_whole_definition():
    source = ladder.helper_source("common/reduce.cuh", "block_reduce")
    assert source.startswith("//") and "template <typename T, typename Op>" in source
    assert source.rstrip().endswith("}") and source.count("{") == source.count("}")


# --- evidence: the claims the notebooks make, checked on the records ---------------------------------

def committed(problem: str) -> records.Section:
    """The newest section of ``problem`` recorded on the device of the newest section of any
    problem: one device for both, as the notebooks pair them (the problems' newest sections
    may come from different devices)."""
    return records.latest_section(problem, records.devices()[0])  # devices(): newest record first


@pytest.mark.parametrize("problem, device", RECORDED)
def test_every_claim_the_notebooks_make_holds_on_every_committed_record(problem, device):
    found = evidence.claims(records.latest_section(problem, device).taught())  # the ladder 01 and 02 show
    # the generic claims of every ladder and what the loss's claims.py declares, no more
    assert {c.key for c in found} == evidence.claim_keys(problems.get(problem)) >= set(evidence.GENERIC)
    failing = [html.unescape(c.statement) for c in found if c.holds is False]
    assert not failing, failing
    # everything the record can answer without the per-rung counters is answered
    assert all(c.holds for c in found if c.key not in ("naive_active_sms", "coalescing", "fewer_barriers"))


@pytest.mark.parametrize("notebook, problem, direction", [("01_kl_div", "kl_div", "backward"),
                                                         ("02_cross_entropy", "cross_entropy", "forward")])
def test_the_vectorized_step_the_prose_quotes_per_device_is_the_recorded_one(notebook, problem, direction):
    """The step is rendered from every record by a code cell (issue 26: no number typed in prose)."""
    cells = json.loads((ROOT / "notebooks" / f"{notebook}.ipynb").read_text())["cells"]
    code = " ".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    assert f'evidence.step_on_devices(spec, rungs[2], rungs[3], "{direction}", results_dir)' in code
    shown = evidence.step_on_devices(problems.get(problem), "warp_shuffle", "vectorized", direction).data
    for device in records.devices():
        found = evidence.step(records.latest_section(problem, device).taught().view(), "warp_shuffle", "vectorized",
                              direction)
        assert f"- {device}: `warp_shuffle` &rarr; `vectorized` {direction} &times;{found.speedup:.2f}" in shown


def _doctored(problem: str, implementation: str, direction: str, factor: float) -> records.Section:
    section = committed(problem).taught().view()
    rows = [dataclasses.replace(r, median_ms=r.median_ms * factor)
            if (r.implementation, r.direction) == (implementation, direction) else r for r in section.rows]
    return dataclasses.replace(section, rows=rows)


@pytest.mark.parametrize("problem, implementation, direction, factor, key", [
    ("kl_div", "vectorized", "forward", 0.5, "vector_flat"),  # a real forward gain: "flat" would be wrong
    ("kl_div", "vectorized", "backward", 2.0, "vector_pays"),
    ("cross_entropy", "vectorized", "backward", 0.5, "vector_flat"),
    ("kl_div", "warp_shuffle", "forward", 2.0, "scalar_saturates"),
    ("kl_div", "vectorized", "forward", 4.0, "mufu_headroom"),
    ("cross_entropy", "warp_shuffle", "forward", 0.7, "shuffle_flat"),
    ("mse_loss", "vectorized", "backward", 2.0, "vector_pays"),  # the losses whose rung table is not their ladder
    ("smooth_l1_loss", "vectorized", "forward", 0.5, "vector_flat"),
    ("hinge_loss", "vectorized", "forward", 1.2, "vector_pays"),
    ("triplet_margin_loss", "vectorized", "forward", 1e-4, "mufu_headroom"),  # the MUFU roof it declares far
])
def test_a_claim_fails_when_the_data_parts_from_it(problem, implementation, direction, factor, key):
    claim = next(c for c in evidence.claims(_doctored(problem, implementation, direction, factor)) if c.key == key)
    assert claim.holds is False, claim.statement


def test_the_taught_view_follows_the_teaching_ladder_not_the_rung_table():
    """mse_loss's operators are two rungs (vectorized, fused), its teaching ladder five: the taught
    view's steps, predictions, counters and claims follow the ladder; the operators' view has no
    ladder to make claims of, and says so."""
    spec = problems.get("mse_loss")
    section = records.latest_section(spec, H200)
    taught = section.taught()
    assert tuple(spec.variants) != taught.ladder == ladder.taught_rungs(spec)
    assert section.ladder == tuple(spec.variants) and taught.view().ladder == taught.ladder
    assert [(s.lower, s.upper) for s in evidence.steps(taught) if s.direction == "forward"] == list(
        zip(taught.ladder, taught.ladder[1:], strict=False))
    assert list(evidence.predict(taught)) == list(taught.ladder)
    assert "naive" in evidence.counters_table(taught).plain
    assert "mufu_headroom" not in {c.key for c in evidence.claims(taught)}  # no transcendental: nothing declared
    with pytest.raises(ValueError, match="section.taught()"):
        evidence.claims(section)


def test_naive_parallelism_is_computed_from_the_launch_and_the_sm_count():
    par = evidence.naive_parallelism(committed("kl_div"))
    assert evidence.threads_per_block("kl_div", "naive") == 256
    assert (par.rows, par.blocks, par.sms, par.busy_sms, par.warps_per_sm) == (16384, 64, 132, 64, 8)
    assert 6 < par.gbps_per_sm < 9  # about 7.5 GB/s per busy SM
    other = evidence.naive_parallelism(committed("cross_entropy"))
    assert other.blocks == 128 and other.gbps_per_sm == pytest.approx(par.gbps_per_sm, rel=0.15)
    # the answer notebook 02 gives: the two steps' ratio is busy SMs times shared_memory's fraction
    text = evidence.naive_step_ratio(committed("kl_div"), committed("cross_entropy"))
    ratio = float(re.search(r"= ([0-9.]+);", text).group(1))
    assert ratio == pytest.approx(float(re.search(r"product ([0-9.]+)", text).group(1)), rel=0.1)


def _with_counters(problem: str, values: dict) -> records.Section:
    """The committed section with made-up per-rung counters added to its ncu records."""
    section = committed(problem).view()
    found = [dataclasses.replace(r, **values.get((r.implementation, r.direction), {})) for r in section.ncu.records]
    return dataclasses.replace(section, ncu=dataclasses.replace(section.ncu, records=found))


COUNTERS = {("naive", "forward"): {"load_requests": 100.0, "load_sectors": 3200.0, "active_sms": 64.0, "barriers": 0.0},
            ("shared_memory", "forward"): {"load_requests": 100.0, "load_sectors": 400.0, "active_sms": 132.0,
                                           "barriers": 9e6},
            ("warp_shuffle", "forward"): {"load_requests": 100.0, "load_sectors": 400.0, "active_sms": 132.0,
                                          "barriers": 2e6}}


def test_counter_claims_read_the_recorded_counters():
    found = {c.key: c for c in evidence.claims(_with_counters("kl_div", COUNTERS))}
    assert found["naive_active_sms"].holds and found["coalescing"].holds and found["fewer_barriers"].holds
    assert "32 &rarr; 4" in found["coalescing"].statement
    broken = {**COUNTERS, ("shared_memory", "forward"): {**COUNTERS["shared_memory", "forward"], "load_sectors": 4e4}}
    assert {c.key: c for c in evidence.claims(_with_counters("kl_div", broken))}["coalescing"].holds is False
    table = evidence.counters_table(_with_counters("kl_div", COUNTERS)).plain
    assert "sectors_per_request: naive 32  shared_memory 4  warp_shuffle 4" in table


def test_counters_not_recorded_say_so_and_how_to_record_them():
    older = dataclasses.replace(committed("kl_div").view(), ncu=records.Profile("ok", records=[  # DRAM bytes only
        records.Counters("naive", "variant", "forward", dram_bytes_read=1.0)]))
    assert not evidence.counters(older)
    text = str(evidence.counters_table(older))
    assert text.startswith("<p") and "not recorded yet" in text and "scripts/gpu_suite.sh" in text


def test_prediction_defaults_to_the_cost_model_and_is_scored():
    section = committed("kl_div")
    floor = tables.floor_ms(KL_DIV, (16384, 16384), "forward", results.bandwidth_gbps(section))
    assert evidence.predict(section) == dict.fromkeys(problems.get("kl_div").variants, floor)
    mine = evidence.predict(section, {"naive": 4.4}, "forward")
    assert mine["naive"] == 4.4 and mine["vectorized"] == floor
    scored = evidence.score_prediction(section, mine).plain
    measured = next(r.median_ms for r in section.view().rows
                    if r.implementation == "naive" and r.direction == "forward")
    assert f"naive: predicted 4.400 ms, measured {measured:.3f} ms: within 25%" in scored
    assert "x slower than predicted" in evidence.score_prediction(section, {"naive": 0.5}).plain
    with pytest.raises(ValueError, match="predicted_ms: naive: expected a positive time"):
        evidence.predict(section, {"naive": -1.0})
    with pytest.raises(ValueError, match="predicted_ms: nope not timed"):
        evidence.predict(section, {"nope": 1.0})


def test_steps_are_the_rung_below_over_the_rung():
    found = {(s.lower, s.direction): s for s in evidence.steps(committed("kl_div"))}
    s = found["warp_shuffle", "backward"]
    assert s.upper == "vectorized" and s.speedup == pytest.approx(s.lower_ms / s.upper_ms)
    table = evidence.steps_table(committed("kl_div")).plain
    forward = found["warp_shuffle", "forward"].speedup
    assert f"warp_shuffle -> vectorized: forward x{forward:.2f}  backward x{s.speedup:.2f}" in table


# --- cluster: rows too long for one SM (notebook 02's cluster section) ---------------------------------

def long_row_section(make_section, fractions: dict, doctored: dict | None = None) -> records.Section:
    """The cross_entropy fixture section on an H200 (datasheet floor) plus forward+backward rows at
    each long-row shape and dtype: rung -> the fraction of the read-once/write-once floor it reaches
    there (a rung left out: not recorded); ``doctored`` {(rung, shape, dtype): fraction} overrides one."""
    from losslab.measure.ceilings import physical_floor

    section = make_section("cross_entropy", device=H200)
    template = next(r for r in section.rows if r.direction == "forward_backward" and r.kind == "variant")
    spec = problems.get("cross_entropy")
    rows = list(section.rows)
    for shape in evidence.LONG_ROWS:
        for dtype in evidence.LONG_ROW_DTYPES:
            floor = physical_floor(spec.cost(shape, "forward_backward", getattr(torch, dtype)).bytes, H200).ms
            for rung, fraction in fractions.items():
                ms = floor / (doctored or {}).get((rung, shape, dtype), fraction)
                rows.append(dataclasses.replace(template, implementation=rung, shape=tuple(shape), dtype=dtype,
                                                median_ms=ms, p10_ms=ms, p90_ms=ms))
    return with_rows(section, rows)


BEFORE_AFTER = {"fused": 0.56, "cluster": 0.85}  # fused under the re-read bound (2/3), cluster above it


def test_the_cluster_claims_hold_where_the_numbers_support_them(make_section):
    section = long_row_section(make_section, BEFORE_AFTER)
    found = evidence.cluster_claims(section)
    assert len(found) == len(evidence.LONG_ROWS) * 2 * len(evidence.LONG_ROW_DTYPES) + len(evidence.READ_ONCE_CASES)
    assert {c.key for c in found if "reads_once" in c.key} == {"cluster_reads_once_4096x131072_float32"}
    assert all(c.holds for c in found), [c.statement for c in found if not c.holds]
    statements = "\n".join(html.unescape(c.statement) for c in found)
    assert "4096 x 131072 float32: fused reaches 56% of the read-once/write-once floor, at most the 67%" in statements
    assert "×1.52 fused (above 1: faster)" in statements and "cluster reaches 85% of the read-once/write-once" \
        in statements
    before = evidence.long_rows_before(section).plain
    assert "From NVIDIA H200's record (2000-01-01):" in before
    live = evidence.long_rows_before(dataclasses.replace(section, source="live")).plain
    assert live.startswith("From the sweep measured now on NVIDIA H200:")
    assert "4096 x 131072 bfloat16: fused forward+backward" in before and "56% of the read-once/write-once floor" \
        in before and "at most 67% of it" in before
    after = evidence.long_rows_after(section).plain
    assert after.count("x1.52 fused") == 4 and "(85%)" in after and "(56% of the floor)" in after
    assert after.count("above the 67% of a kernel that reads twice: yes") == 4


@pytest.mark.parametrize("fractions, doctored, failing", [
    # cluster slower than fused at one shape and dtype: its two claims there fail, and no other
    (BEFORE_AFTER, {("cluster", (2048, 262144), "bfloat16"): 0.5}, r"cluster_.*_2048x262144_bfloat16$"),
    # cluster faster than fused but under the bound of a kernel that reads the logits twice: not read once
    ({"fused": 0.56, "cluster": 0.62}, {}, "cluster_reads_once_"),
    # fused above that bound: it would not be re-reading the logits from DRAM
    ({"fused": 0.75, "cluster": 0.85}, {}, "fused_rereads_"),
], ids=["cluster-slower", "cluster-rereads", "fused-reads-once"])
def test_a_cluster_claim_fails_when_the_data_parts_from_it(make_section, fractions, doctored, failing):
    found = evidence.cluster_claims(long_row_section(make_section, fractions, doctored))
    assert {c.key for c in found if c.holds is False} == {c.key for c in found if re.match(failing, c.key)}
    assert all(c.holds for c in found if not re.match(failing, c.key))


def test_without_cluster_rows_the_after_says_so_in_one_line_and_invents_nothing(make_section):
    section = long_row_section(make_section, {"fused": 0.56})
    after = evidence.long_rows_after(section)
    assert str(after).startswith("<p") and "\n" not in after.plain
    assert "holds no cluster rows at 4096 x 131072 or 2048 x 262144 yet" in after.plain
    assert evidence.RERECORD in after.plain and not re.search(r"\d ms|%", after.plain)
    found = {c.key: c for c in evidence.cluster_claims(section)}
    assert found["fused_rereads_4096x131072_float32"].holds is True
    assert all(c.holds is None and "not recorded yet" in c.statement for k, c in found.items()
               if k.startswith("cluster_"))
    nothing = long_row_section(make_section, {})
    assert "holds no fused forward+backward rows" in evidence.long_rows_before(nothing).plain
    assert evidence.cluster_claims(None) == [] and "No results yet" in evidence.long_rows_after(None)
    with pytest.raises(ValueError, match="problem: kl_div has no rung that falls back"):
        evidence.cluster_claims(make_section())


COMMITTED = [r.device for r in records.load_records() if "cross_entropy" in r.sections]


@pytest.mark.parametrize("device", COMMITTED)
def test_fused_rereads_long_rows_on_the_committed_record(device):
    found = [c for c in evidence.cluster_claims(records.latest_section("cross_entropy", device))
             if c.key.startswith("fused_rereads_")]
    assert len(found) == 4 and all(c.holds for c in found), [html.unescape(c.statement) for c in found]


@pytest.mark.parametrize("device", COMMITTED)
def test_the_cluster_claims_hold_on_the_committed_record(device):
    section = records.latest_section("cross_entropy", device)
    if all(r.cluster_ms is None for r in evidence.long_rows(section)):
        pytest.skip(f"{device}'s committed record ({section.date[:10]}) holds no cluster rows at the long-row "
                    f"shapes yet: it predates the rung; re-record with `{evidence.RERECORD}` on a GPU")
    found = evidence.cluster_claims(section)
    assert all(c.holds for c in found), [html.unescape(c.statement) for c in found if not c.holds]


# --- SASS and registers per rung (compile tier: nvcc) --------------------------------------------------

@pytest.mark.compile
def test_sass_shows_what_each_rung_changes():
    code = {r: {k.direction: k for k in machine_code.rung_code(KL_DIV, r) if k.direction != "other"}
            for r in problems.get("kl_div").variants[:4]}
    naive, shared, shuffle, vector = (code[r]["forward"] for r in problems.get("kl_div").variants[:4])
    # the compiler already unrolled warp_shuffle's scalar loop into four independent loads per tensor
    assert machine_code.loads_per_base(shuffle) >= 4 and shuffle.count("LDG 16 B") == 0
    assert vector.count("LDG 16 B") > 0
    assert shared.count("BAR") > shuffle.count("BAR") and shuffle.count("SHFL") > 0 == shared.count("SHFL")
    assert all(k.count("MUFU") > 0 and any("MUFU.LG2" in line for line in k.lines) for k in (naive, vector))  # __logf
    assert all(k.registers > 0 and k.spill_bytes == 0 for k in (naive, shared, shuffle, vector))
    # the backward: one element per thread before, a 16-byte pack after
    assert code["vectorized"]["backward"].count("LDG 16 B") > 0 == code["warp_shuffle"]["backward"].count("LDG 16 B")
    assert "registers / thread" in str(machine_code.sass_table(KL_DIV, ["naive"]))


def test_sass_without_nvcc_says_so(monkeypatch, tmp_path):
    monkeypatch.setattr(machine_code, "_CACHE", tmp_path)

    def missing(*args):
        raise machine_code.BuildError("nvcc not found")

    monkeypatch.setattr(machine_code, "_compile", missing)
    assert machine_code.rung_code(KL_DIV, "naive") is None
    assert "nvcc (or cuobjdump) is missing" in str(machine_code.sass_table(KL_DIV, ["naive"]))
    assert "nvcc (or cuobjdump) is missing" in str(machine_code.sass_lines(KL_DIV, "naive"))


FAKE_KERNELS = [machine_code.KernelCode("k", "forward", 32, 0, ("LDG.E R1, desc[UR4][R2.64]",))]


@pytest.fixture
def sass_cache(monkeypatch, tmp_path):
    """machine_code's cache in tmp_path, a fake compiler (key "nvcc-a"), and the list of compilations."""
    compiled = []
    monkeypatch.setattr(machine_code, "_CACHE", tmp_path / "sass")
    monkeypatch.setattr(machine_code, "compiler_key", lambda: "nvcc-a")
    monkeypatch.setattr(machine_code, "_compile", lambda *args: compiled.append(args) or list(FAKE_KERNELS))
    return compiled


def test_a_truncated_sass_cache_entry_is_compiled_again(sass_cache, tmp_path):
    """It broke notebooks 01 and 02 with a bare JSONDecodeError on every run."""
    assert machine_code.rung_code(KL_DIV, "naive") == FAKE_KERNELS and len(sass_cache) == 1
    (entry,) = (tmp_path / "sass").rglob("*.json")
    entry.write_text(entry.read_text()[:20])
    assert machine_code.rung_code(KL_DIV, "naive") == FAKE_KERNELS and len(sass_cache) == 2
    assert json.loads(entry.read_text())[0]["registers"] == 32  # replaced by a whole entry
    entry.write_text('[{"name": "k"}]')  # valid JSON, not an entry
    assert machine_code.rung_code(KL_DIV, "naive") == FAKE_KERNELS and len(sass_cache) == 3


def test_the_sass_cache_is_keyed_by_the_compiler(sass_cache, monkeypatch):
    machine_code.rung_code(KL_DIV, "naive")
    machine_code.rung_code(KL_DIV, "naive")
    assert len(sass_cache) == 1
    monkeypatch.setattr(machine_code, "compiler_key", lambda: "nvcc-with-G")  # another nvcc, or a wrapper
    machine_code.rung_code(KL_DIV, "naive")
    assert len(sass_cache) == 2


def test_a_sass_cache_write_that_fails_halfway_leaves_no_truncated_entry(sass_cache, tmp_path, monkeypatch):
    """A full disk during the write: the entry is missing (compiled again next time), never half there."""
    def half_then_full(value, out):
        out.write(json.dumps(value)[:10])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(machine_code.json, "dump", half_then_full)
    monkeypatch.setattr(machine_code, "_warned", set())
    assert machine_code.rung_code(KL_DIV, "naive") == FAKE_KERNELS
    assert not [p for p in (tmp_path / "sass").rglob("*") if p.is_file()]


def test_an_unwritable_sass_cache_costs_the_cache_not_the_table(monkeypatch, tmp_path, capsys):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setattr(machine_code, "_CACHE", blocker)
    monkeypatch.setattr(machine_code, "compiler_key", lambda: "nvcc-a")
    monkeypatch.setattr(machine_code, "_compile", lambda *args: list(FAKE_KERNELS))
    monkeypatch.setattr(machine_code, "_warned", set())
    assert machine_code.rung_code(KL_DIV, "naive") == FAKE_KERNELS
    assert machine_code.rung_code(KL_DIV, "vectorized") == FAKE_KERNELS
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"the SASS cache folder {blocker} cannot be written" in err and "TMPDIR" in err


@pytest.mark.compile
def test_cluster_machine_code_shows_the_instructions_of_its_idea():
    shown = evidence.cluster_machine_code(CROSS_ENTROPY)
    counts = {line.split()[0]: int(line.split()[1]) for line in shown.plain.splitlines()}
    assert list(counts) == [op for op, _, _ in evidence.CLUSTER_SASS] and all(counts.values()), counts
    assert "UBLKCP.S.G [UR" in shown.plain and "float32 forward kernel, SASS for sm_90" in shown


def test_cluster_machine_code_without_nvcc_says_so(monkeypatch):
    from losslab import build

    def missing(*args):
        raise build.BuildError("nvcc not found")

    monkeypatch.setattr(build, "compile_cubin", missing)
    assert "nvcc (or cuobjdump) is missing" in evidence.cluster_machine_code(CROSS_ENTROPY).plain
