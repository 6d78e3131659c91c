"""The workbook's words follow its data (cpu tier, issue 26).

- The eleven contradictions the issue lists stay fixed: each has a test here that fails when it
  comes back (Liger's backward, out-of-range targets, the SASS shown beside the text, the pitfalls'
  outcomes and banner, notebook 05's time in the README, the sweep's axes, the ladder's rungs).
- No markdown cell of a notebook, and no prose of the README outside its generated blocks, carries
  a literal measured figure (ms, µs, GB/s, TB/s, a percentage): such numbers are rendered from the
  record by a code cell. The exceptions are listed in ALLOWED, each with its reason.
- Every glossary term a notebook's markdown uses links to ``docs/glossary.md`` at its first use,
  and every anchor linked exists.

Reads the committed notebooks, README, glossary and records; writes nothing.
"""
import inspect
import re
from pathlib import Path

import pytest

from losslab import problems, records
from losslab.build import ROOT
from losslab.measure import timing
from losslab.measure.bench import SWEEP_DIRECTIONS
from losslab.present import evidence, listings, machine_code
from losslab.teach import pitfalls

nbformat = pytest.importorskip("nbformat", reason="the prose tests read notebooks (pip install -r requirements.txt)")

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
README = ROOT / "README.md"
GLOSSARY = ROOT / "docs" / "glossary.md"


def markdown_cells(path: Path) -> list[str]:
    return [c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "markdown"]


def code_cells(path: Path) -> list[str]:
    return [c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]


def plain(text: str) -> str:
    """``text`` without Markdown links (their words kept) and with its whitespace collapsed."""
    return " ".join(re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text).split())


def notebook(name: str) -> Path:
    return ROOT / "notebooks" / f"{name}.ipynb"


def readme_prose() -> str:
    """The README less its generated blocks (``<!-- name:begin -->`` ... ``<!-- name:end -->``)."""
    return re.sub(r"<!-- ([^>]*?):begin -->.*?<!-- \1:end -->", "", README.read_text(), flags=re.S)


# --- part 2: no literal measured figure in prose ------------------------------------------------------

FIGURE = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?(?:\s*[\u2013-]\s*\d[\d,]*(?:\.\d+)?)?\s*"
                    r"(?:ms|\u00b5s|\u03bcs|us|GB/s|TB/s|%)(?![\w/])")
# (what the figure's sentence contains, why it is no measured figure typed by hand)
ALLOWED = [
    (re.compile(r"within \d+ ?%"), "a claim's tolerance, which the claims table checks on the record"),
    (re.compile(r"(more|less) than \d+ ?%"), "a threshold a rule or a check applies, not a measurement"),
    (re.compile(r"datasheet"), "a datasheet peak, labelled as such: the vendor's number, not a measurement"),
    (re.compile(r"\b100 ?%"), "the measured ceiling itself: a definition, not a measurement"),
    (re.compile(r"≥ 50 ms of warm-up"), "the timing protocol's setting (measure.timing.time_cuda's warmup_ms)"),
]


def sentence_at(text: str, start: int, end: int) -> str:
    """The sentence around ``text[start:end]`` (up to the neighbouring '. ' or blank line)."""
    left = max(text.rfind(". ", 0, start), text.rfind("\n\n", 0, start))
    right = min((i for i in (text.find(". ", end), text.find("\n\n", end)) if i >= 0), default=len(text))
    return text[left + 1:right]


def literal_figures(text: str) -> list[str]:
    found = []
    for m in FIGURE.finditer(text):
        sentence = sentence_at(text, m.start(), m.end())
        if not any(pattern.search(sentence) for pattern, _ in ALLOWED):
            found.append(f"{m.group(0)!r} in {' '.join(sentence.split())[:140]!r}")
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_markdown_cell_types_a_measured_figure(path):
    found = [f for cell in markdown_cells(path) for f in literal_figures(cell)]
    assert not found, f"{path.name}: render these from the record in a code cell: {found}"


def test_the_readme_prose_types_no_measured_figure():
    found = literal_figures(readme_prose())
    assert not found, f"README.md: move these into a generated block or drop them: {found}"


def test_the_figure_check_catches_a_typed_figure_and_lets_the_allowed_ones_pass():
    assert literal_figures("the backward takes 0.373 ms on the H100")
    assert literal_figures("at 96 % of the copy bandwidth") and literal_figures("2.96 TB/s on the H100")
    assert literal_figures("host time 68.7 us per call") and literal_figures("3\u20135 % past it")
    assert not literal_figures("the step is flat (within 5% forward)")
    assert not literal_figures("the datasheet peaks are 3.35 and 4.8 TB/s")
    assert not literal_figures("a ladder of 5 rungs over 16 KiB rows, 0x400 bytes apart")


def test_the_allowed_warm_up_is_the_timing_protocols_own():
    warmup = inspect.signature(timing.time_cuda).parameters["warmup_ms"].default
    assert "≥ 50 ms of warm-up" in readme_prose() and warmup == 50.0


# --- part 3: the glossary, linked at each term's first use ---------------------------------------------------

TERMS = {  # anchor in docs/glossary.md -> the words that use the term in a notebook's markdown
    "sm": r"\bSMs?\b",
    "warp": r"(?i:\bwarps?\b)",
    "cta": r"\bCTAs?\b|(?i:\bblocks?\b)",
    "cluster": r"(?i:\bclusters?\b)",
    "dsmem": r"\bDSMEM\b|(?i:distributed shared memory)",
    "tma": r"\bTMA\b",
    "mufu": r"\bMUFU\b|\bSFU\b|(?i:special-function unit)",
    "sector": r"(?i:\bsectors?\b)",
    "coalescing": r"(?i:\b(un)?coalesc\w*)",
    "occupancy": r"(?i:\boccupancy\b)",
    "stall-reason": r"(?i:\bstall(s|ed)?\b)",
    "sass": r"\bSASS\b|\bPTX\b",
    "arithmetic-intensity": r"(?i:\b(arithmetic )?intensit(y|ies)\b)",
    "roofline": r"(?i:\brooflines?\b)",
    "gemm": r"\bGEMMs?\b|\bcuBLAS\b",
    "collective": r"(?i:\bcollectives?\b|\ball-(reduce|gather)s?\b)|\bNCCL\b",
    "tensor-parallelism": r"(?i:\btensor[- ]parallel\w*)|\bMegatron\b|\bDTensor\b",
}
LINK = re.compile(r"\[([^\]]+)\]\(\.\./docs/glossary\.md#([\w-]+)\)")
# not prose: fenced and inline code, math, headings, the targets of links, HTML tags
NOT_PROSE = re.compile(r"(?s:```.*?```)|`[^`\n]*`|(?s:\$\$.*?\$\$)|\$[^$\n]*\$|^#+ [^\n]*$|\]\([^)]*\)|<[^>\n]*>",
                       re.M)


def prose_of(path: Path) -> str:
    """A notebook's markdown, cells joined, with everything that is not prose blanked out (same length)."""
    text = "\n\n".join(markdown_cells(path))
    return NOT_PROSE.sub(lambda m: " " * len(m.group(0)), text), text


def first_uses(path: Path) -> dict[str, tuple[int, str]]:
    """anchor -> (position, word) of the term's first use in the notebook's prose."""
    prose, _ = prose_of(path)
    found = {}
    for anchor, pattern in TERMS.items():
        m = re.search(pattern, prose)
        if m:
            found[anchor] = (m.start(), m.group(0))
    return found


def anchors() -> set[str]:
    return set(re.findall(r'<a id="([\w-]+)"></a>', GLOSSARY.read_text()))


def test_the_glossary_defines_every_term_in_two_or_three_sentences():
    text = GLOSSARY.read_text()
    assert anchors() == set(TERMS)
    for anchor in TERMS:
        entry = text.split(f'<a id="{anchor}"></a>')[1].split("<a id=")[0]
        body = " ".join(line for line in entry.splitlines() if line and not line.startswith("#"))
        sentences = [s for s in re.split(r"(?<=[.!?])\s+(?=[A-Z`(])", body) if s.strip()]
        assert 2 <= len(sentences) <= 4, f"{anchor}: {len(sentences)} sentences"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_each_term_links_to_the_glossary_at_its_first_use(path):
    _, text = prose_of(path)
    links = [(m.start(1), m.end(1), m.group(2)) for m in LINK.finditer(text)]
    wrong = []
    for anchor, (at, word) in first_uses(path).items():
        if not any(start <= at < end and target == anchor for start, end, target in links):
            wrong.append(f"{anchor}: first use {word!r} at ...{' '.join(text[max(0, at - 40):at + 20].split())}...")
    assert not wrong, f"{path.name}: link the first use to ../docs/glossary.md#<anchor>: {wrong}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_glossary_link_names_an_anchor_that_exists(path):
    _, text = prose_of(path)
    missing = {m.group(2) for m in LINK.finditer(text)} - anchors()
    assert not missing, f"{path.name}: no such anchor in docs/glossary.md: {missing}"
    assert "glossary.md#" not in LINK.sub("", text), f"{path.name}: a glossary link in another form"


def test_the_first_use_check_finds_an_unlinked_term(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(
        "A [warp](../docs/glossary.md#warp) reads one line: the load is coalesced, 4 sectors.")])
    path = tmp_path / "x.ipynb"
    nbformat.write(nb, path)
    with pytest.raises(AssertionError, match="coalescing.*sector"):
        test_each_term_links_to_the_glossary_at_its_first_use(path)


# --- the eleven contradictions ---------------------------------------------------------------------------------

def test_1_ligers_backward_is_shown_with_what_nsight_compute_measured():
    """It neither "times almost nothing" (0.373 ms on the H100) nor goes unexplained in 03's ncu table:
    02, 03 and 04 render the timed row, ncu's bytes and why from the record."""
    for path in NOTEBOOKS:
        words = " ".join(markdown_cells(path))
        assert not re.search(r"almost nothing|almost empty|near-empty", words), path.name
    for name in ("02_cross_entropy", "03_roofline"):
        assert any("evidence.work_elsewhere_note(" in c for c in code_cells(notebook(name))), name
    assert "work_elsewhere_note" in inspect.getsource(__import__("losslab.teach.explorer", fromlist=["x"]))
    for device in records.devices():
        section = records.latest_section("cross_entropy", device)
        for e in evidence.work_elsewhere(section):
            note = evidence.work_elsewhere_note(section).data
            assert f"timed at {e.median_ms:.3f} ms" in note and "Nsight Compute measured" in note
            assert "almost nothing" not in note


def test_2_an_out_of_range_target_gives_nan_and_check_targets_raises():
    import torch

    import losslab

    bullet = next(p for p in " ".join(markdown_cells(notebook("02_cross_entropy"))).split("\n* ")
                  if "outside $[0, C)$" in p)
    assert "NaN" in bullet and "check_targets" in bullet, bullet
    assert not re.search(r"losslab\s+raises", bullet), "the call cannot raise: no loss waits for the GPU"
    with pytest.raises(ValueError, match="target"):
        losslab.check_targets(torch.tensor([0, 5]), 4)


def after(cells: list, starts: str) -> list[str]:
    """The code cells between the markdown cell starting with ``starts`` and the next markdown cell."""
    i = next(i for i, c in enumerate(cells) if c.cell_type == "markdown" and c.source.startswith(starts))
    out = []
    for c in cells[i + 1:]:
        if c.cell_type == "markdown":
            break
        out.append(c.source)
    return out


def test_3_the_sass_beside_02s_backward_text_is_the_backward():
    cells = nbformat.read(notebook("02_cross_entropy"), as_version=4).cells
    text = next(c.source for c in cells if c.source.startswith("**warp_shuffle → vectorized.**"))
    assert "backward SASS after the diff" in plain(text)
    calls = re.findall(r"listings\.listing\([^)]*\)", " ".join(after(cells, "**warp_shuffle → vectorized.**")))
    assert calls == ['listings.listing(spec, rungs[2], "backward", arch)',
                     'listings.listing(spec, rungs[3], "backward", arch)'], calls


def fixture_kernels(rung: str) -> list[machine_code.KernelCode]:
    """A rung's kernels as ``machine_code.rung_code`` returns them (sorted by direction, then name:
    the options kernel first), the rung's own forward with 20 loads."""
    loads = tuple(f"LDG.E R{i}, desc[UR8][R6.64+{o}]" for i, o in enumerate(("-0x800", "-0x400", "0x0", "0x400")))
    wide = tuple(f"LDG.E.128 R{i}, desc[UR8][R30.64+0x{i}000]" for i in range(16))
    options = ("LDG.E R3, desc[UR10][R8.64]",)
    return [machine_code.KernelCode("kl_div_options_forward_kernel", "forward", 32, 0, options),
            machine_code.KernelCode(f"kl_div_{rung}_forward_kernel", "forward", 38, 0, loads + wide)]


def test_4_the_listing_is_the_rungs_own_kernel_uncut_and_the_offsets_are_read_from_it(monkeypatch):
    monkeypatch.setattr(machine_code, "rung_code", lambda problem, rung, arch="sm_90": fixture_kernels(rung))
    shown = listings.listing(problems.get("kl_div"), "vectorized", "forward").plain
    assert shown.startswith("// kl_div_vectorized_forward_kernel") and "options" not in shown
    assert shown.count("LDG.E") == 20, "every line shown, none cut"
    sentence = listings.unrolled_loads(problems.get("kl_div"), "warp_shuffle", "forward").data
    assert "`-0x800`, `-0x400`, `+0x0`, `+0x400`" in sentence and "0x400 = 1024 bytes apart" in sentence
    for name in ("01_kl_div", "02_cross_entropy"):
        typed = [m for c in markdown_cells(notebook(name)) for m in re.findall(r"0x[0-9a-f]{3,}", c)]
        assert not typed, f"{name}: SASS offsets typed in prose ({typed}); render them with listings.unrolled_loads"
    cells = nbformat.read(notebook("01_kl_div"), as_version=4).cells
    shown = " ".join(after(cells, "**warp_shuffle → vectorized.**"))
    assert "listings.unrolled_loads(" in shown and "machine_code.sass_lines(" not in shown


def committed_pitfalls() -> dict:
    rec = pitfalls.load_record()
    if rec is None:
        pytest.skip("no committed pitfalls record")
    return rec


def test_5_the_bank_conflict_prediction_follows_the_record():
    assert "~0" not in pitfalls.get("bank_conflicts").symptom
    words = " ".join(markdown_cells(notebook("06_pitfalls")))
    assert not re.search(r"about 0 for the rung|~ ?0 for the rung", words)
    rec = committed_pitfalls()
    probe = rec["outcomes"]["bank_conflicts"]["probe"]
    rows = probe["shape"][0]
    shown = pitfalls.outcome(rec, "bank_conflicts").plain
    st = [probe[k][pitfalls.BANK_METRICS[1]] for k in ("pitfall", "reference")]
    assert f"{st[1] / rows:.1f} store conflicts a row" in shown
    assert f"the pitfall's extra: {(st[0] - st[1]) / rows:.1f} a row (predicted 56)" in shown


def test_6_a_pitfall_that_faulted_before_any_check_prints_no_nan():
    fault = {"key": "misaligned_float4", "problem": "kl_div", "checks": [], "failed": 0,
             "worst_forward_error": float("nan"), "first_failure": "cuda_error: misaligned address", "probe": None}
    for rec in ({"outcomes": {"misaligned_float4": fault}}, committed_pitfalls()):
        shown = pitfalls.outcome(rec, "misaligned_float4").plain
        assert "nan" not in shown and "0 of 0" not in shown and "misaligned address" in shown
    table = pitfalls.outcome_table({**committed_pitfalls(), "outcomes": {"misaligned_float4": fault}}).plain
    assert "misaligned_float4: none recorded (a fault); worst forward error -" in table


def test_7_a_stale_pitfalls_record_says_what_its_hash_covers_and_that_it_is_older():
    rec = {**committed_pitfalls(), "sources_sha256": "0" * 64}
    text = pitfalls.banner(rec)
    assert "does NOT match the sources now" in text and "record again" in text
    assert "does NOT match pitfalls/ (they changed" not in text  # pitfalls/ need not be what changed
    assert "shipped kernels" in text and "come from older sources" in text
    fresh = pitfalls.banner({**rec, "sources_sha256": pitfalls.sources_sha256()})
    assert "matches the sources now" in fresh and "older" not in fresh
    for name in ("00_start_here", "06_pitfalls"):
        assert any("pitfalls.banner(" in c for c in code_cells(notebook(name))), name


def test_8_a_determinism_probe_with_nan_losses_states_no_nan_range():
    probe = {"shape": [4096, 4096], "runs": 20, "distinct_losses": 20, "min": float("nan"), "max": float("nan")}
    rec = {"outcomes": {"atomic_add": {"key": "atomic_add", "checks": [], "failed": 0, "worst_forward_error": 0.0,
                                       "first_failure": "", "probe": probe}}}
    shown = pitfalls.outcome(rec, "atomic_add").plain
    assert "nan to nan" not in shown and "NaN among them" in shown
    assert "nan to nan" not in pitfalls.outcome(committed_pitfalls(), "missing_sync").plain


def readme_workshop_times() -> dict[str, tuple[str, str]]:
    """notebook -> (live time, headless time) from the README's workshop table."""
    rows = re.findall(r"^\| (\d\d_\w+) \|[^|]*\| ([^|]*) \| ([^|]*) \|$", README.read_text(), flags=re.M)
    return {name: (live.strip(), headless.strip()) for name, live, headless in rows}


def test_9_the_readme_states_each_headless_time_as_measured():
    times = readme_workshop_times()
    assert set(times) == {p.stem for p in NOTEBOOKS}
    for name, (_, headless) in times.items():
        assert re.fullmatch(r"\d+ s", headless), f"{name}: {headless!r} (one papermill run, in seconds, no ~)"
    # the README said ~90 s for 05 where one run takes a fraction of that; test_notebooks.py compares
    # each headless time with the report's own papermill run
    assert int(times["05_your_turn"][1].split()[0]) < 60


def test_10_03_describes_the_sweep_it_draws():
    words = " ".join(markdown_cells(notebook("03_roofline")))
    assert "linear axes" not in words and "flat floor" not in words
    assert "log" in words.split("## Time and bandwidth against size")[1].split("\n## ")[0]
    assert any("charts.sweep_growth(" in c for c in code_cells(notebook("03_roofline")))
    # the prose points at the host's floor that sweep_growth prints under forward+backward
    assert "the host's floor" in words and any("for direction in SWEEP_DIRECTIONS" in c and "sweep_growth" in c
                                                for c in code_cells(notebook("03_roofline")))
    assert "forward_backward" in SWEEP_DIRECTIONS


RUNG_CHAIN = re.compile(r"naive\W+→\W+shared_memory\W+→\W+warp_shuffle\W+→\W+vectorized[^\n]*")


@pytest.mark.parametrize("name", ["00_start_here", "02_cross_entropy", "04_explorer", "README"])
def test_11_every_ladder_that_includes_cross_entropy_names_cluster(name):
    text = readme_prose() if name == "README" else "\n\n".join(markdown_cells(notebook(name)))
    chains = list(RUNG_CHAIN.finditer(text))
    assert chains, f"{name}: no ladder listed"
    for m in chains:
        paragraph = sentence_at(text, m.start(), m.end())
        rest = text[m.start():text.find("\n\n", m.end())]
        assert re.search(r"`cluster`|\*\*cluster\*\*", rest), f"{name}: the rung not named: {paragraph.strip()[:120]!r}"
    assert problems.get("cross_entropy").variants[-1] == "cluster"


def test_the_readme_times_what_users_call_only_from_the_operator_rows():
    """What users call (losslab.nn) is timed in the README only inside the generated blocks, whose
    column reads the record's operator rows ("losslab.nn"); outside them no line naming it carries
    a measured time or ratio, which would be a rung's number quoted as the operator's."""
    from losslab.variants import OPERATOR

    text = (ROOT / "README.md").read_text()
    generated = re.compile(r"<!-- (summary|sweep)[^>]*:begin -->.*?<!-- (summary|sweep)[^>]*:end -->", re.DOTALL)
    blocks = [m.group(0) for m in generated.finditer(text)]
    assert blocks and all(OPERATOR in block for block in blocks)
    measured = re.compile(r"\d+(\.\d+)?\s*(ms|µs|us|GB/s|TB/s|%)|\bx\d+\.\d+|×\s*\d")
    outside = generated.sub("", text)
    quoted = [line for line in outside.splitlines()
              if ("losslab.nn" in line or "public operator" in line) and measured.search(line)]
    assert not quoted, quoted


def test_the_paths_and_commands_00_tells_a_participant_to_use_exist():
    """00_start_here's paths (`<name>` placeholders matched by any name), make targets and
    losslab command lines exist as written: its "Where things are" table once pointed at
    kernels/<problem>/<variant>.cu for the rungs the notebooks read, which live under ladder/."""
    from losslab import __main__ as cli

    text = "\n".join(markdown_cells(notebook("00_start_here")))
    paths = re.findall(r"`((?:kernels|losslab|exercises|pitfalls|reports|docs|scripts)/[^`\s]*)`", text)
    assert "kernels/<problem>/ladder/<rung>.cu" in paths
    for path in paths:
        assert list(ROOT.glob(re.sub(r"<[^>]+>", "*", path).rstrip("/"))), f"00_start_here: no {path}"
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), flags=re.M))
    for target in re.findall(r"\bmake ([\w-]+)", text):
        assert target in targets, f"00_start_here: no make target {target!r}"
    commands = re.findall(r"python -m losslab ([^#`\n]+)", text)
    assert commands
    for command in commands:
        cli._parser().parse_args(command.split())  # an unknown command or option exits (SystemExit)
