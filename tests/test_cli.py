"""cpu tier: the command line. Every user mistake is one line, ``losslab <command>: <argument>: <what
was expected>``, on stderr with a non-zero exit, never a traceback, and is caught before any GPU work.
The parser is exercised on the Python this suite runs on (CI runs the versions the README names)."""
import json
import os
import subprocess
import sys

import pytest
import torch

from losslab import __main__ as cli
from losslab import build, problems, records
from losslab.__main__ import main


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of ``python -m losslab *argv``, in this process."""
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line(code: int, err: str, prefix: str) -> None:
    assert code not in (0, None), err
    assert err.startswith(prefix), err
    assert err.count("\n") == 1 and "Traceback" not in err, err


def test_list_names_every_problem_and_variant(capsys):
    code, out, _ = run(["list"], capsys)
    assert code == 0 and "kl_div" in out and "vectorized" in out and "16384x16384" in out


# --- the parser on this Python (3.10/3.11: nargs="*" with choices rejected an empty list) -------------------

def test_bench_all_and_bench_without_a_problem_parse():
    args = cli._parser().parse_args(["bench", "--all"])
    assert args.all and args.problems == []
    assert cli._parser().parse_args(["roofline"]).problems == []


def test_bench_without_a_problem_says_what_is_expected(capsys):
    assert_one_line(*run(["bench"], capsys)[::2], "losslab bench: problem: expected one or more of kl_div")


def test_an_unknown_problem_is_named(capsys):
    code, _, err = run(["check", "mse"], capsys)
    assert_one_line(code, err, f"losslab check: problem: expected one of {', '.join(problems.names())}, got 'mse'")


# --- sizes ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [("257x4099", (257, 4099)), (" 3X5 ", (3, 5)), ("seed", "seed"),
                                            ("small", "small")])
def test_sizes_parse(text, expected):
    assert cli._size(text) == expected


@pytest.mark.parametrize("size", ["0x0", "-1x5", "5x", "abc", "3x1000x7", "x5", "2.5x4", "5x0"])
def test_bad_sizes_are_one_line_before_any_gpu_work(size, capsys, monkeypatch):
    monkeypatch.setattr(cli, "_require_gpu", lambda command: pytest.fail("reached the GPU check"))
    code, _, err = run(["bench", "kl_div", "--size", size], capsys)
    assert_one_line(code, err, "losslab bench: --size: expected a size name")
    assert repr(size) in err


def test_a_size_name_the_problem_lacks_is_named_per_problem():
    with pytest.raises(cli.UsageError, match="--size: kl_div has no size 'huge'; expected one of seed"):
        cli._shape_for("kl_div", "huge")
    assert cli._shape_for("kl_div", "seed") == tuple(cli.problems.get("kl_div").sizes["seed"])
    assert cli._shape_for("kl_div", (3, 5)) == (3, 5)


def _fake_gpu(monkeypatch, total_bytes: int = 80 * 10**9):
    class Props:
        total_memory = total_bytes

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: Props)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Fixture GPU")


def test_a_size_too_large_for_the_gpu_says_how_much_it_needs(monkeypatch):
    _fake_gpu(monkeypatch)
    with pytest.raises(cli.UsageError, match=r"--size: kl_div at 99999999x99999999 needs about [\d,.]+ GB .*"
                                             r"Fixture GPU has 80.0 GB"):
        cli._check_memory("kl_div", (99999999, 99999999), ["float32"])
    cli._check_memory("kl_div", (16384, 16384), ["float32", "bfloat16"])  # the seed fits


def test_the_memory_check_runs_before_the_ceilings(monkeypatch, capsys):
    _fake_gpu(monkeypatch)
    monkeypatch.setattr("losslab.measure.ceilings.measure_ceilings", lambda: pytest.fail("measured ceilings"))
    code, _, err = run(["bench", "kl_div", "--size", "99999999x99999999"], capsys)
    assert_one_line(code, err, "losslab bench: --size: kl_div at 99999999x99999999 needs about")


def test_no_memory_check_without_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cli._check_memory("kl_div", (99999999, 99999999), ["float32"])


# --- repeats, trials, dtypes, variants -------------------------------------------------------------------------

@pytest.mark.parametrize("argv, prefix", [
    (["bench", "kl_div", "--repeats", "0"], "losslab bench: --repeats: expected a positive whole number, got '0'"),
    (["bench", "kl_div", "--repeats", "-1"], "losslab bench: --repeats: expected a positive whole number, got '-1'"),
    (["bench", "kl_div", "--repeats", "2.5"], "losslab bench: --repeats: expected a positive whole number"),
    (["bench", "kl_div", "--dtypes", "bogus"], "losslab bench: --dtypes: expected a comma-separated list of float32"),
    (["bench", "kl_div", "--dtypes", "float64"], "losslab bench: --dtypes: expected a comma-separated list"),
    (["bench", "kl_div", "--dtypes", "float32,float64"], "losslab bench: --dtypes: expected"),
    (["bench", "kl_div", "--variants", "turbo"], "losslab bench: --variants: kl_div has no variant 'turbo'"),
    (["check", "kl_div", "--variants", "turbo"], "losslab check: --variants: kl_div has no variant 'turbo'"),
    (["check", "kl_div", "--sizes", "huge"], "losslab check: --sizes: kl_div has no size 'huge'"),
    (["evaluate", "losslab/ops.py", "--problem", "kl_div", "--trials", "0"],
     "losslab evaluate: --trials: expected a positive whole number, got '0'"),
    (["evaluate", "losslab/ops.py", "--problem", "kl_div", "--dtype", "float64"], "losslab evaluate: --dtype:"),
    (["evaluate", "losslab/ops.py", "--problem", "kl_div", "--timeout", "0"],
     "losslab evaluate: --timeout: expected a positive number of seconds, got '0'"),
    # NaN, 0 or a negative value turned the too_slow gate off without a word
    (["evaluate", "losslab/ops.py", "--problem", "kl_div", "--min-speedup", "nan"],
     "losslab evaluate: --min-speedup: expected a positive number such as 1.5, got 'nan'"),
    (["evaluate", "losslab/ops.py", "--problem", "kl_div", "--min-speedup", "-1"],
     "losslab evaluate: --min-speedup: expected a positive number such as 1.5, got '-1'"),
    (["evaluate", "losslab/ops.py", "--problem", "kl_div", "--min-speedup", "0"],
     "losslab evaluate: --min-speedup: expected a positive number"),
    (["evaluate", "README.md", "--problem", "kl_div"],
     "losslab evaluate: solution: expected a Python file (.py), got README.md"),
    (["pitfalls", "--only", "bogus"], "losslab pitfalls: --only: no pitfall 'bogus'; expected one of"),
    (["export", "kl_div", "turbo"], "losslab export: variant:"),
])
def test_bad_values_are_rejected_before_any_gpu_work(argv, prefix, capsys, monkeypatch):
    monkeypatch.setattr(cli, "_require_gpu", lambda command: pytest.fail("reached the GPU check"))
    monkeypatch.chdir(build.ROOT)
    code, _, err = run(argv, capsys)
    assert_one_line(code, err, prefix)


# --- files and folders ---------------------------------------------------------------------------------------

def _read_only(monkeypatch, path):
    """os.access says ``path`` is not writable (tests may run as root, who can write anything)."""
    real = os.access
    monkeypatch.setattr(cli.os, "access", lambda p, mode: False if str(p) == str(path) else real(p, mode))


def test_output_paths_are_checked(tmp_path, capsys, monkeypatch):
    cases = [
        (["evaluate", str(tmp_path / "missing.py"), "--problem", "kl_div"],
         "losslab evaluate: solution: expected an existing file"),
        (["evaluate", str(tmp_path), "--problem", "kl_div"],
         "losslab evaluate: solution: " + str(tmp_path.resolve()) + " holds no .py answers"),
        (["evaluate", str(build.ROOT / "losslab" / "ops.py"), "--problem", "kl_div", "--json",
          str(tmp_path / "no" / "v.json")], "losslab evaluate: --json: expected a file in an existing folder"),
        (["export", "kl_div", "naive", "-o", str(tmp_path / "no" / "x.py")],
         "losslab export: --output: expected a file in an existing folder"),
        (["export", "kl_div", "naive", "-o", str(tmp_path)], "losslab export: --output: expected a file path to write"),
        (["report", "--output", str(tmp_path / "file.txt")], "losslab report: --output: expected a folder, but"),
    ]
    (tmp_path / "file.txt").write_text("x")
    for argv, prefix in cases:
        assert_one_line(*run(argv, capsys)[::2], prefix)


def test_read_only_outputs_are_refused(tmp_path, capsys, monkeypatch):
    target = tmp_path / "solution.py"
    target.write_text("")
    _read_only(monkeypatch, target)
    assert_one_line(*run(["export", "kl_div", "naive", "-o", str(target)], capsys)[::2],
                    "losslab export: --output: expected a writable file, but")
    folder = tmp_path / "reports"
    folder.mkdir()
    _read_only(monkeypatch, folder)
    assert_one_line(*run(["report", "--output", str(folder / "sub")], capsys)[::2],
                    "losslab report: --output: expected a writable folder, but")


# --- devices ------------------------------------------------------------------------------------------------

def test_report_for_an_unrecorded_device_names_the_recorded_ones(capsys):
    code, _, err = run(["report", "--device", "NVIDIA B200"], capsys)
    assert_one_line(code, err, "losslab report: --device: no record of device 'NVIDIA B200'")
    assert "'NVIDIA H200' (nvidia-h200)" in err


def test_summary_and_roofline_take_the_slugs_the_notebooks_take(tmp_path, capsys, make_section, results_dir):
    records.save_section("kl_div", make_section("kl_div", device="NVIDIA H200"), results_dir)
    code, out, _ = run(["summary", "--device", "nvidia-h200", "--results-dir", str(results_dir)], capsys)
    assert code == 0 and "recorded on NVIDIA H200" in out
    code, out, _ = run(["roofline", "kl_div", "--device", "nvidia-h200", "--results-dir", str(results_dir),
                        "--output", str(tmp_path / "figures")], capsys)
    assert code == 0 and (tmp_path / "figures" / "roofline_kl_div.png").exists()
    code, _, err = run(["roofline", "--device", "nvidia-b200", "--results-dir", str(results_dir)], capsys)
    assert_one_line(code, err, "losslab roofline: --device: no record of device 'nvidia-b200'")


# --- the records it reads ------------------------------------------------------------------------------------

def test_a_malformed_record_is_one_line_naming_the_file(results_dir, capsys):
    (results_dir / "broken.json").write_text('{"device": "X", "problems": {"kl_div": {"rows": [')
    code, _, err = run(["summary", "--results-dir", str(results_dir)], capsys)
    assert_one_line(code, err, f"losslab summary: {results_dir / 'broken.json'}: not a readable record")


def test_summary_says_what_it_shows(results_dir, capsys, make_section):
    small = make_section("kl_div", device="NVIDIA H100 80GB HBM3")
    for row in small.rows:
        row.shape = (257, 4099)
    records.save_section("kl_div", small, results_dir)
    records.save_section("cross_entropy", make_section("cross_entropy", device="NVIDIA H200"), results_dir)
    code, out, _ = run(["summary", "--results-dir", str(results_dir)], capsys)
    assert code == 0 and "seed sizes" not in out
    head = out.splitlines()
    assert head[0].startswith("recorded on several devices")
    assert head[1].startswith("  kl_div: 257x4099 float32 on NVIDIA H100 80GB HBM3")
    assert head[2].startswith("  cross_entropy: 32768x4096 float32 on NVIDIA H200")
    kl_rows = [line for line in head if line.startswith("kl_div ")]
    assert kl_rows and all("NVIDIA H100 80GB HBM3" in line for line in kl_rows)


def test_summary_marks_a_time_below_the_physical_floor(results_dir, capsys, make_section):
    section = make_section("kl_div", device="NVIDIA H200")
    for row in section.rows:
        if row.implementation == "eager" and row.direction == "forward":
            row.median_ms = 0.01
        if row.implementation == "compile" and row.direction == "forward":
            row.host_ms = row.median_ms + 1.0  # its host takes longer than its GPU time: host-bound
    records.save_section("kl_div", section, results_dir)
    code, out, _ = run(["summary", "--results-dir", str(results_dir)], capsys)
    assert "eager 0.010!" in out and "! kl_div eager forward: 0.010 ms is below the physical floor" in out
    assert " compile 2.000* (x" in out and "\n* host-bound: the host takes longer to issue the call" in out
    assert " compile 2.000 (x" in out  # forward+backward: no host time above its GPU time


def readme_block(marker: str) -> str:
    """The README's text between ``<!-- marker:begin -->`` and ``<!-- marker:end -->``, less a code fence."""
    readme = (build.ROOT / "README.md").read_text()
    assert f"<!-- {marker}:begin -->" in readme, f"README.md has no block {marker!r}"
    return readme.split(f"<!-- {marker}:begin -->")[1].split(f"<!-- {marker}:end -->")[0].strip().strip("`").strip()


@pytest.mark.parametrize("marker, argv", [("summary", ["summary", "--device", "nvidia-h100-80gb-hbm3"]),
                                          ("summary nvidia-h200", ["summary", "--device", "nvidia-h200"]),
                                          ("sweep", ["summary", "--sweep"])])
def test_readme_shows_the_recorded_summaries(marker, argv, capsys):
    code, out, _ = run(argv, capsys)
    assert code == 0
    assert readme_block(marker) == out.strip(), f"update README.md from `python -m losslab {' '.join(argv)}`"


def test_the_sweep_summary_names_each_cell_where_a_peer_leads_and_stale_results(make_section, results_dir, capsys):
    import dataclasses

    from losslab import records

    data = make_section(fresh=False)  # rungs 1 ms, compile 2 ms: compile made faster in one cell
    for row in data.rows:
        if (row.implementation, row.direction) == ("compile", "forward"):
            row.median_ms = 0.5
    # what users call: as fast as the best rung forward, 20 % behind it in forward+backward, where
    # its host time per call (1.5 ms) is above its GPU time: host-bound
    data.rows += [dataclasses.replace(r, implementation="losslab.nn", kind="operator",
                                      median_ms=1.0 if r.direction == "forward" else 1.2,
                                      host_ms=None if r.direction == "forward" else 1.5)
                  for r in data.rows if r.implementation == "fused"]
    for row in data.rows:
        if row.kind == "variant":
            row.host_ms = 0.9
    # eager: 2 ms on the GPU, 0.8 ms on the host (not host-bound)
    data.rows += [dataclasses.replace(r, implementation="eager", kind="peer", median_ms=2.0, host_ms=0.8)
                  for r in data.rows if r.implementation == "fused"]
    records.save_section("kl_div", data, results_dir)
    code, out, _ = run(["summary", "--sweep", "--results-dir", str(results_dir)], capsys)
    assert code == 0
    assert "median ms per call (L2 flushed), losslab.nn / best losslab rung / compile" in out
    assert "| Fixture GPU | float32 | forward | 1.000 / 1.000 / 0.500 |" in out
    assert "| Fixture GPU | float32 | forward+backward | 1.200* / 1.000 / 2.000 |" in out
    assert ("compile is faster than what a user calls in 1 of 2 cells (by any margin; the goal allows max(3 %, 1 µs)):"
            "\n- Fixture GPU float32 forward 16384×16384: "
            "compile 0.5000 ms, losslab.nn 1.0000") in out
    assert ("losslab.nn is behind the best rung by more than max(3 %, 1 µs) in 1 of 2 cells:\n"
            "- Fixture GPU float32 forward_backward 16384×16384: losslab.nn 1.2000 ms") in out
    assert "(x1.20); host-bound: host 1.5000 ms a call, shared_memory's 0.9000\n" in out
    assert ("One float32 forward+backward call at 16384×16384, the smallest size above: host ms per call (GPU ms in "
            "brackets): Fixture GPU losslab.nn 1.500 (1.200), eager 0.800 (2.000).\n") in out
    assert "measured on older sources than the repository's" in out
    # with the host's floor in the section's ceilings (ceilings.measure_autograd_floor), x.sum() beside them
    floor = {"host_ms": 0.15, "median_ms": 0.01, "back_to_back_ms": 0.009}
    data = dataclasses.replace(data, ceilings={**data.ceilings, "autograd_floor": floor})
    records.save_section("kl_div", data, results_dir, replace=True)
    code, out, _ = run(["summary", "--sweep", "--results-dir", str(results_dir)], capsys)
    assert code == 0
    assert ("eager 0.800 (2.000), x.sum() 0.150 (0.010). x.sum() is PyTorch's own forward+backward of a sum at "
            "128×4096: the least any call through autograd costs on that host.\n") in out


# --- end to end, in a child process ----------------------------------------------------------------------------

@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without a GPU")
def test_gpu_commands_say_what_is_missing():
    run_ = subprocess.run([sys.executable, "-m", "losslab", "bench", "kl_div"], capture_output=True, text=True,
                          cwd=build.ROOT)
    assert run_.returncode != 0 and "needs a CUDA GPU" in run_.stderr and "Traceback" not in run_.stderr


def test_a_mistake_in_a_child_process_is_one_line_and_exit_status_2():
    run_ = subprocess.run([sys.executable, "-m", "losslab", "bench", "kl_div", "--size", "-1x5"],
                          capture_output=True, text=True, cwd=build.ROOT)
    assert run_.returncode == 2 and run_.stdout == ""
    assert run_.stderr.startswith("losslab bench: --size: ") and run_.stderr.count("\n") == 1


def test_a_closed_stdout_is_one_line_not_a_traceback():
    """python -m losslab list | head -1: the reader is gone before the output is written."""
    read, write = os.pipe()
    os.close(read)
    try:
        run_ = subprocess.run([sys.executable, "-m", "losslab", "list"], stdout=write, stderr=subprocess.PIPE,
                              text=True, cwd=build.ROOT)
    finally:
        os.close(write)
    assert run_.returncode == 1 and "Traceback" not in run_.stderr and run_.stderr.count("\n") == 1, run_.stderr
    assert run_.stderr.startswith("losslab list: the output was closed before it was all written")


def _fake_run_notebook(fail: str = "", interrupt: str = ""):
    """A stand-in for report.run_notebook that writes its files at once, failing or raising
    KeyboardInterrupt (Ctrl-C) on the notebooks named."""
    from losslab.present import report

    def run_notebook(source, output_dir, parameters=None):
        if source.stem == interrupt:
            raise KeyboardInterrupt
        name = source.stem
        made = report.NotebookReport(name, output_dir / f"{name}.ipynb", output_dir / f"{name}.html",
                                     error="cell 3: ValueError: broken" if name == fail else "")
        made.executed.write_text("{}")
        made.html.write_text("<p>new</p>")
        return made
    return run_notebook


def test_report_with_a_failing_notebook_is_one_line(tmp_path, capsys, monkeypatch):
    from losslab.present import report

    monkeypatch.setattr(report, "run_notebook", _fake_run_notebook(fail="01_kl_div"))
    code, out, err = run(["report", "--output", str(tmp_path)], capsys)
    assert_one_line(code, err, "losslab report: notebooks failed: 01_kl_div (see their HTML under")
    assert (tmp_path / "index.html").exists() and (tmp_path / "01_kl_div.html").read_text() == "<p>new</p>"


def test_ctrl_c_during_report_is_one_line_and_leaves_the_old_report(tmp_path, capsys, monkeypatch):
    from losslab.present import report

    (tmp_path / "index.html").write_text("old index")
    (tmp_path / "00_start_here.html").write_text("old page")
    monkeypatch.setattr(report, "run_notebook", _fake_run_notebook(interrupt="02_cross_entropy"))
    code, _, err = run(["report", "--output", str(tmp_path)], capsys)
    assert code == 130 and err == "losslab report: interrupted\n"
    assert (tmp_path / "index.html").read_text() == "old index"
    assert (tmp_path / "00_start_here.html").read_text() == "old page"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["00_start_here.html", "index.html"]


@pytest.mark.gpu
def test_bench_adds_back_to_back_and_host_times(tmp_path, capsys):
    out = tmp_path / "bench.json"
    code, text, _ = run(["bench", "kl_div", "--size", "small", "--variants", "naive", "--no-record", "--no-check",
                         "--no-compile", "--repeats", "3", "--json", str(out)], capsys)
    assert code == 0 and "b2b ms" in text and "host ms" in text
    section = json.loads(out.with_suffix(".kl_div.json").read_text())
    assert all(r["back_to_back_ms"] > 0 and r["host_ms"] > 0 for r in section["rows"])


# --- bench --knobs -----------------------------------------------------------------------------------------

KNOB_MISTAKES = [
    (["bench", "kl_div", "--knobs", "vectorized"], "losslab bench: --knobs: expected RUNG:KNOB=VALUE"),
    (["bench", "kl_div", "--knobs", "vectorized:UNROLL=x"], "losslab bench: --knobs: expected RUNG:KNOB=VALUE"),
    (["bench", "kl_div", "--knobs", "vectorized:UNROLL=3"],
     "losslab bench: --knobs: UNROLL (16-byte loads in flight per tensor of kl_div vectorized): 3 is not offered"),
    (["bench", "kl_div", "--knobs", "vectorized:WARPS=8"], "losslab bench: --knobs: kl_div vectorized has no knob"),
    (["bench", "kl_div", "cross_entropy", "--knobs", "cluster:THREADS=128"],
     "losslab bench: --knobs: kl_div has no variant 'cluster'"),
    (["bench", "kl_div", "--knobs", "fused:UNROLL=8", "--ncu"], "losslab bench: --ncu: not with --knobs"),
    (["bench", "kl_div", "--knobs", "fused:UNROLL=8", "--sweep"], "losslab bench: --sweep: not with --knobs"),
    (["bench", "kl_div", "--knobs", "fused:UNROLL=8", "--replace"], "losslab bench: --replace: not with --knobs"),
]  # checked with the sweep's mistakes below


def test_list_shows_each_rungs_knobs(capsys):
    code, out, _ = run(["list"], capsys)
    assert code == 0
    assert ("  vectorized knobs (bench --knobs vectorized:FORWARD_WARPS=...): FORWARD_WARPS=8 (rows per forward "
            "block, one warp each: 1 2 4 8 16 32); BACKWARD_WARPS=4 (rows per backward block, one warp each: "
            "1 2 4 8 16 32); UNROLL=8") in out


@pytest.mark.gpu
def test_bench_times_a_launch_configuration_beside_the_default_and_records_neither(tmp_path, capsys):
    before = {p: p.read_bytes() for p in records.RESULTS_DIR.glob("*.json")}
    out = tmp_path / "bench.json"
    code, text, err = run(["bench", "kl_div", "--size", "small", "--knobs", "vectorized:UNROLL=8", "--no-compile",
                           "--repeats", "3", "--json", str(out)], capsys)
    assert code == 0, err
    assert "not recorded" in err and {p: p.read_bytes() for p in records.RESULTS_DIR.glob("*.json")} == before
    section = json.loads(out.with_suffix(".kl_div.json").read_text())
    timed = {r["implementation"] for r in section["rows"]}
    assert {"vectorized", "vectorized [THREADS=256, UNROLL=8]"} <= timed, timed
    assert all(c["passed"] for c in section["checks"] if c["variant"].startswith("vectorized [")), section["checks"]


# --- bench --sweep ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, expected", [
    (["bench", "kl_div", "--sweep", "--size", "small"], "losslab bench: --size: not with --sweep"),
    (["bench", "--all", "--sweep", "--ncu"], "losslab bench: --ncu: not with --sweep"),
    (["bench", "kl_div", "--sweep", "--replace"], "losslab bench: --replace: not with --sweep"),
    (["bench", "kl_div", "--sweep", "--variants", "naive"], "losslab bench: --variants: not with --sweep"),
    (["bench", "kl_div", "--shapes", "128x4096"], "losslab bench: --shapes: only with --sweep"),
    (["bench", "kl_div", "--sweep", "--shapes", "128x0"], "losslab bench: --shapes: expected a comma-separated"),
    (["bench", "kl_div", "--sweep", "--shapes", "-1x5"], "losslab bench: --shapes: expected a comma-separated"),
    *KNOB_MISTAKES,
])
def test_sweep_and_knob_mistakes_are_one_line_before_any_gpu_work(argv, expected, capsys, monkeypatch):
    monkeypatch.setattr(cli, "_require_gpu", lambda command: pytest.fail("reached the GPU"))
    code, _, err = run(argv, capsys)
    assert_one_line(code, err, expected)


def test_sweep_shapes_parse_and_default_to_fp32_and_bf16(monkeypatch):
    assert cli._shapes("128x4096, 2048X16384") == [(128, 4096), (2048, 16384)]
    seen = {}
    monkeypatch.setattr(cli, "cmd_sweep", lambda args: seen.update(vars(args)) or 0)
    assert main(["bench", "--sweep", "kl_div"]) == 0
    assert seen["problems"] == ["kl_div"] and seen["dtypes"] == ["float32", "bfloat16"] and seen["shapes"] is None


@pytest.mark.gpu
def test_bench_sweep_times_each_shape_and_writes_the_section(tmp_path, capsys):
    out = tmp_path / "sweep.json"
    code, text, _ = run(["bench", "kl_div", "--sweep", "--shapes", "128x4096,256x8192", "--no-record",
                         "--no-compile", "--repeats", "3", "--json", str(out)], capsys)
    assert code == 0 and "128x4096" in text and "256x8192" in text and "forward_backward" in text
    section = records.Section.from_dict(json.loads(out.with_suffix(".kl_div.json").read_text()))
    assert set(section.shapes) == {(128, 4096), (256, 8192)} and section.dtypes == ["float32", "bfloat16"]


# --- a bench run loses nothing to a bad record --------------------------------------------------------

@pytest.mark.parametrize("argv", [["bench", "kl_div"], ["bench", "kl_div", "--sweep"]])
def test_a_corrupt_record_stops_a_bench_before_any_gpu_work(tmp_path, monkeypatch, capsys, argv):
    (tmp_path / "nvidia-h100.json").write_text('{"device": "NVIDIA H100", "problems": {"kl_div": {"rows": [')
    monkeypatch.setattr(records, "RESULTS_DIR", tmp_path)
    monkeypatch.setattr(cli, "_require_gpu", lambda command: None)
    monkeypatch.setattr("losslab.measure.ceilings.measure_ceilings", lambda: pytest.fail("measured the device"))
    code, out, err = run(argv, capsys)
    assert code == 1 and "nvidia-h100.json" in err and len(err.strip().splitlines()) == 1


def test_a_failed_save_comes_after_the_tables_and_the_json(tmp_path, monkeypatch, capsys, make_section):
    monkeypatch.setattr(cli, "_require_gpu", lambda command: None)
    monkeypatch.setattr(cli, "_check_memory", lambda *args: None)
    monkeypatch.setattr("losslab.measure.ceilings.measure_ceilings",
                        lambda: {"read_gbps": 1000.0, "copy_gbps": 900.0})
    monkeypatch.setattr(records, "measure_section", lambda name, *args, **kwargs: make_section(name))

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(records, "save_section", disk_full)
    monkeypatch.setattr(records, "load_records", lambda *args: [])
    with pytest.raises(OSError, match="No space left"):
        main(["bench", "kl_div", "--no-check", "--json", str(tmp_path / "out.json")])
    out = capsys.readouterr().out
    assert "kl_div 16384x16384 float32" in out  # the tables were printed before the save
    assert json.loads((tmp_path / "out.kl_div.json").read_text())["problem"] == "kl_div"


# --- grade: one verdict and a hint, exit 0 / 1 -----------------------------------------------------------

def test_grade_list_names_every_exercise(capsys):
    from losslab.teach import exercises

    assert main(["grade", "--list"]) == 0
    out = capsys.readouterr().out
    for e in exercises.EXERCISES:
        assert f"{e.problem}" in out and f"exercises/{e.problem}/{e.key}.cu" in out and e.rung in out
    assert "python -m losslab grade FILE" in cli.USAGE and "python -m losslab grade --list" in cli.USAGE


def test_grade_prints_the_verdict_and_hint_of_the_child(monkeypatch, capsys):
    from losslab.teach import isolated

    seen = {}

    def fake_run(target, kwargs, timeout_s):
        seen.update(kwargs, target=target)
        return isolated.Outcome("ok", {"passed": False, "verdict": "RED: not yet", "hint": "the tail misses",
                                       "lines": []})
    monkeypatch.setattr(isolated, "run", fake_run)
    assert main(["grade", "exercises/kl_div/vectorize.cu"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out == ["vectorize (kl_div, vectorized rung) exercises/kl_div/vectorize.cu: RED: not yet",
                   "  hint: the tail misses"]
    assert seen == {"target": "losslab.teach.exercises:grade_in_child", "key": "vectorize", "source": None,
                    "solution": False}
    monkeypatch.setattr(isolated, "run", lambda *a: isolated.Outcome("ok", {"passed": True, "verdict": "GREEN: done",
                                                                         "hint": "all pass", "lines": []}))
    assert main(["grade", "exercises/solutions/kl_div/vectorize.cu"]) == 0


def test_grade_a_crash_is_one_line_and_red(monkeypatch, capsys):
    from losslab.teach import isolated

    monkeypatch.setattr(isolated, "run", lambda *a: isolated.Outcome(
        "crashed", message="the process died (killed by signal 11)", detail="Traceback ...\nboom"))
    assert main(["grade", "exercises/kl_div/coalesce.cu"]) == 1
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "RED: grading stopped: the process died" in out and "Traceback" not in out


def test_grade_a_hang_is_killed_at_the_time_limit(capsys):
    """A real child: it cannot even import in 0.3 s, so it stands for a kernel that never finishes."""
    assert main(["grade", "exercises/kl_div/coalesce.cu", "--timeout", "0.3"]) == 1
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "RED: no verdict after 0.3 s" in out


def test_grade_a_file_that_is_no_exercise_is_one_line(tmp_path, capsys):
    other = tmp_path / "notes.cu"
    other.write_text("int main() {}\n")
    assert main(["grade", str(other)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("losslab grade: FILE: ") and "is not an exercise" in err and err.count("\n") == 1
    assert main(["grade", str(tmp_path / "missing.cu")]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert main(["grade"]) == 2
    assert "expected an exercise's .cu file" in capsys.readouterr().err


def test_grade_an_emptied_exercise_file_is_red_not_a_traceback(tmp_path, capsys):
    """End to end in the child (no nvcc needed: an empty file is graded before the build)."""
    empty = tmp_path / "empty.cu"
    empty.write_text("")
    assert main(["grade", str(empty), "--exercise", "fused"]) == 1
    out = capsys.readouterr().out
    assert "fused (kl_div, fused rung)" in out and "RED: not yet" in out and "hint: the file is empty" in out
