"""What the notebooks show (cpu tier): results loaded and bannered (``present.results``), the
ladder's sources (``present.ladder``), the tables (``present.tables``) and the charts
(``present.charts``); rows below the physical floor marked wherever they appear; records of
several devices and runs told apart.

The sections are the shared ``make_section`` fixture (made-up round numbers) or copies of it,
written only to tmp folders; two tests read the committed record under ``reports/results/``.
"""
import dataclasses
import html

import pytest
import torch
from matplotlib.figure import Figure

from losslab import problems, records
from losslab.present import charts, ladder, results, tables
from losslab.present import html as present_html

H200 = "NVIDIA H200"  # a device with datasheet figures, so the physical floor applies


@pytest.fixture
def section(make_section):
    """The fixture section as a typed, recorded Section."""
    return results.as_section({**make_section(), "problem": "kl_div", "source": "recorded"})


def below_floor_section(make_section, device: str = H200):
    """The fixture section on a real device, with vectorized's backward at 1 us: below any floor."""
    data = make_section(device=device)
    for row in data["rows"]:
        if row["implementation"] == "vectorized" and row["direction"] == "backward":
            row["median_ms"] = 0.001
    return results.as_section({**data, "problem": "kl_div"})


# --- results: loading and banners ------------------------------------------------------------------

def test_no_record_gives_none_and_names_the_folder_looked_in(results_dir):
    assert results.load_results("kl_div", live=False, results_dir=results_dir) is None
    text = results.banner(None, "kl_div", results_dir=results_dir).plain
    assert "No recorded results for kl_div" in text and results.shown_path(results_dir) in text
    assert "reports/results" not in text  # today's main said it looked there whatever the folder
    for render in (tables.check_table, tables.timing_table, charts.bandwidth_chart, tables.measured_floor):
        assert "No results yet" in render(None)


def test_a_device_without_a_record_names_the_devices_that_have_one(recorded_dir):
    assert results.load_results("kl_div", device="NVIDIA B200", live=False, results_dir=recorded_dir) is None
    text = results.banner(None, "kl_div", device="NVIDIA B200", results_dir=recorded_dir).plain
    assert "on NVIDIA B200" in text and "records there: Fixture GPU" in text


def test_load_recorded(recorded_dir):
    section = results.load_results("kl_div", live=False, results_dir=recorded_dir)
    assert isinstance(section, records.Section)
    assert section.source == "recorded" and section.problem == "kl_div" and section.device == "Fixture GPU"
    # a device by its file-name slug; an unknown device has no record
    assert results.load_results("kl_div", device="fixture-gpu", live=False, results_dir=recorded_dir)
    assert results.load_results("kl_div", device="Other GPU", live=False, results_dir=recorded_dir) is None


def test_load_recorded_keeps_the_variants_asked_for(recorded_dir):
    section = results.load_results("kl_div", variants=["vectorized"], live=False, results_dir=recorded_dir)
    assert {r.implementation for r in section.rows} == {"vectorized", "eager", "compile"}
    assert {c.variant for c in section.checks} == {"vectorized"}


def test_load_rejects_unknown_names():
    with pytest.raises(ValueError, match="size"):
        results.load_results("kl_div", size="huge", live=False)
    with pytest.raises(ValueError, match="variant"):
        results.load_results("kl_div", variants=["fastest"], live=False)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without a GPU")
def test_live_without_gpu_says_why():
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        results.load_results("kl_div", live=True)


def test_banner_states_source_device_date_versions_and_freshness(make_section):
    fresh = results.as_section({**make_section(), "problem": "kl_div"})
    text = results.banner(fresh, "kl_div").plain
    assert text.startswith("RECORDED results") and "Fixture GPU" in text and "2000-01-01 00:00 UTC" in text
    assert "torch fixture, CUDA fixture" in text and "matches the sources now" in text and "NOT" not in text
    stale = results.as_section({**make_section(fresh=False), "problem": "kl_div"})
    assert "does NOT match the sources now" in results.banner(stale, "kl_div").plain
    live = dataclasses.replace(fresh, source="live")
    assert results.banner(live, "kl_div").plain.startswith("LIVE results")
    # what the banner states travels in the output's metadata, where the report reads it
    _, metadata = results.banner(fresh, "kl_div")._repr_mimebundle_()
    assert metadata[results.METADATA_KEY]["fresh"] is True
    assert metadata[results.METADATA_KEY]["dates"] == ["2000-01-01T00:00:00+00:00"]


def test_banner_notes_a_size_the_record_was_not_taken_at(section):
    assert "applies to live runs only" in results.banner(section, "kl_div", "small").plain
    assert "applies to live runs only" not in results.banner(section, "kl_div", "seed").plain


def test_rows_of_several_runs_name_each_date(section):
    """A record merged from two runs: the banner names both dates and the timing table dates each row."""
    later = [dataclasses.replace(r, date="2000-02-02T12:00:00+00:00") if r.implementation == "vectorized" else r
             for r in section.rows]
    mixed = dataclasses.replace(section, rows=later)
    text = results.banner(mixed, "kl_div").plain
    assert "2 runs from 2000-01-01 00:00 UTC to 2000-02-02 12:00 UTC" in text
    table = tables.timing_table(mixed)
    assert "<th" in table and ">measured</th>" in table and "2000-02-02 12:00 UTC" in table
    assert ">measured</th>" not in tables.timing_table(section)  # one run: no date column


def test_records_of_two_devices_are_shown_apart(results_dir, make_section):
    """Each device's own record, never another's rows under its name; the records table lists both."""
    records.save_section("kl_div", make_section(device="GPU A"), results_dir)
    records.save_section("kl_div", {**make_section(device="GPU B"), "date": "2001-01-01T00:00:00+00:00"}, results_dir)
    a = results.load_results("kl_div", device="GPU A", live=False, results_dir=results_dir)
    newest = results.load_results("kl_div", live=False, results_dir=results_dir)
    assert a.device == "GPU A" and "GPU A" in results.banner(a, "kl_div").plain
    assert newest.device == "GPU B" and "2001-01-01" in results.banner(newest, "kl_div").plain
    listed = tables.records_table(results_dir)
    assert "GPU A" in listed and "GPU B" in listed and "2001-01-01 00:00 UTC" in listed


# --- the ladder ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("left,right", [("naive", "shared_memory"), ("warp_shuffle", "vectorized")])
def test_side_by_side_shows_both_sources_escaped(left, right):
    page = ladder.side_by_side("kl_div", left, right)
    for variant in (left, right):
        source = ladder.kernel_source("kl_div", variant)
        assert f"kernels/kl_div/{variant}.cu" in page
        assert html.escape(source.splitlines()[0]) in page  # the header comment names the rung
    assert '#include "' not in page and "#include &quot;" in page
    assert page.index(left) < page.index(right)


def test_side_by_side_rejects_unknown_variant():
    with pytest.raises(ValueError, match="variant"):
        ladder.side_by_side("kl_div", "naive", "magic")


@pytest.mark.parametrize("problem,variant", [(p, v) for p in problems.names() for v in problems.get(p).variants])
def test_every_rung_opens_with_what_it_fixes(problem, variant):
    assert len(ladder.rung_header(problem, variant)) > 40
    assert ladder.rung_header(problem, variant) in ladder.ladder_summary(problem).plain


# --- tables ---------------------------------------------------------------------------------------------

def test_cost_table_counts_the_bytes():
    """Forward at the seed size reads 2 x 16384 x 16384 x 4 bytes = 2 GiB; bf16 half of it."""
    table = tables.cost_table("kl_div", (16384, 16384))
    assert "2.00 GiB" in table and "ms at 1 TB/s" in table
    assert "1.00 GiB" in tables.cost_table("kl_div", (16384, 16384), dtype="bfloat16")
    measured = tables.cost_table("kl_div", (16384, 16384), {"read": 1000.0, "copy": 900.0}, measured_on="GPU X")
    assert "floor ms" in measured and "read 1000 GB/s" in measured and "measured on GPU X" in measured


def test_floor_is_bytes_over_bandwidth():
    bandwidth = {"read": 1000.0, "copy": 500.0}
    shape = (16384, 16384)
    forward = problems.get("kl_div").cost(shape, "forward").bytes
    assert tables.floor_ms("kl_div", shape, "forward", bandwidth) == pytest.approx(forward / 1e12 * 1e3)
    backward = problems.get("kl_div").cost(shape, "backward").bytes
    assert tables.floor_ms("kl_div", shape, "backward", bandwidth) == pytest.approx(backward / 5e11 * 1e3)


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


def test_ceilings_table_names_device_and_datasheet(make_section):
    table = tables.ceilings_table(results.as_section({**make_section(device=H200), "problem": "kl_div"}))
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


def test_the_recorded_liger_backward_is_flagged_where_it_is_shown():
    """The committed record: Liger's cross-entropy backward (0.118 ms for 1.07 GB) is no result."""
    section = results.load_results("cross_entropy", live=False)
    if section is None or not any(r.implementation == "liger" for r in section.rows):
        pytest.skip("no recorded cross_entropy section with Liger here")
    table = tables.timing_table(section)
    assert "liger backward:" in table and "below the physical floor" in table
    assert "below the physical floor" in charts.bandwidth_chart(section)._suptitle.get_text()


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


def test_coalescing_figure_counts_lines_and_sectors():
    fig = charts.coalescing_figure(16384)
    titles = [ax.get_title() for ax in fig.axes]
    assert "32 line(s), 32 sectors fetched: 128 of 1024 bytes used" in titles[0]
    assert "1 line(s), 4 sectors fetched: 128 of 128 bytes used" in titles[1]
    assert "4 line(s), 16 sectors fetched: 512 of 512 bytes used" in titles[2]
