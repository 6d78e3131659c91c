"""The teaching ladders (``kernels/<problem>/ladder/``, built by ``losslab.build.ladder``): one idea a step.

For every problem with a ladder and every rung of it (``<PROBLEM>_LADDER(X)`` in its ladder.h):

cpu tier
- the file opens with its idea: ``// <rung>: ...``, naming the rung below (the first rung: its flaw);
- at most 80 lines of device code (``__global__``/``__device__`` functions, no comments or blank lines);
- it differs from the rung below by at most 40 changed lines (``git diff --no-index --numstat``:
  max(added, removed)), or by at most the bound its header states as ``diff bound: N lines (reason)``;
- float32 only (every launcher refuses another dtype), no launch knobs or macros, a shape comment on
  every pointer parameter of a kernel;
- on the CPU simulator, in both thread orders, the loss and the gradient match float64 on the
  simulator's designed cases (a rung the simulator cannot model, e.g. a cluster, is skipped).

compile tier: each file compiles for sm_80 and sm_90 without spills, its SASS shows the rung's idea,
and the ladder's extension builds without a GPU.

gpu tier: each rung through the problem's own host functions against float64 at the odd, small and
seed sizes and on the edge cases; another dtype is refused; each rung is faster than the one below at
the seed size, unless its header says ``not faster: <directions> (reason)``; a rung whose header says
``faster at: <rows> x <cols>[, ...] in <directions> (reason)`` (one for long rows, say) matches float64
and is faster than the one below at those sizes too.

Every checker here is also run once on a deliberately broken copy, and fails there.
"""
from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from concurrent import futures
from pathlib import Path

import pytest
import torch

from losslab import build, problems
from losslab.build import ladder
from losslab.measure import check, timing
from losslab.teach.simulator import build as sim_build
from losslab.teach.simulator import cases as sim_cases
from losslab.teach.simulator import run as sim_run

LADDERS = {p: ladder.rungs(p) for p in ladder.problems_with_ladder()}
RUNGS = [(p, r) for p, names in LADDERS.items() for r in names]
STEPS = [(p, below, above) for p, names in LADDERS.items() for below, above in zip(names, names[1:], strict=False)]
RUNG_IDS = [f"{p}/{r}" for p, r in RUNGS]
STEP_IDS = [f"{p}/{below}->{above}" for p, below, above in STEPS]

MAX_DEVICE_LINES = 80
MAX_CHANGED_LINES = 40
DIRECTIONS = ("forward", "forward_backward")
LOSS_RTOL, GRAD_RTOL = check.TOLERANCES[torch.float32]  # README "Tolerances": float32


# --- reading a rung file -----------------------------------------------------------------------------

def header_lines(text: str) -> list[str]:
    """The opening comment: the ``//`` lines before any code, ``//`` and the line's end stripped
    (the indentation after ``//`` kept: an indented line continues the field above it)."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("//"):
            break
        lines.append(line[2:].rstrip())
    return lines


def header_field(text: str, name: str) -> str | None:
    """A field of the opening comment, ``// <name>: ...`` and its indented continuation lines,
    joined into one line (None if the header has no such field)."""
    lines = header_lines(text)
    for i, line in enumerate(lines):
        if line.strip().startswith(f"{name}:"):
            parts = [line.strip()]
            for more in lines[i + 1:]:
                if not more.startswith("  ") or not more.strip():
                    break
                parts.append(more.strip())
            return " ".join(parts)
    return None


def header_problems(text: str, rung: str, below: str | None) -> list[str]:
    """What the opening comment lacks: ``// <rung>: <idea>`` first, at least two lines and 120
    characters (as tests/test_architecture.py asks of the production rungs), and the flaw it fixes:
    the rung below named (the first rung: the word "flaw", naming its own)."""
    lines = header_lines(text)
    joined = " ".join(line.strip() for line in lines)
    found = []
    if not lines or not lines[0].strip().startswith(f"{rung}: "):
        found.append(f"does not open with '// {rung}: <its idea>'")
    elif len(lines) < 2 or len(joined) < 120:
        found.append(f"the opening comment is too short to state the idea and the flaw ({len(lines)} lines)")
    if below is not None and not re.search(rf"\b{re.escape(below)}\b", joined):
        found.append(f"the opening comment does not name the rung below, {below}, whose flaw it fixes")
    if below is None and "flaw" not in joined:
        found.append("the first rung's opening comment does not name its flaw")
    return found


def without_comments(text: str) -> str:
    """``text`` with comments blanked (newlines kept, so line numbers stay)."""
    return re.sub(r"//[^\n]*|/\*.*?\*/", lambda m: re.sub(r"[^\n]", " ", m[0]), text, flags=re.DOTALL)


def device_code_lines(text: str) -> int:
    """Lines of device code: the non-blank lines of every ``__global__`` or ``__device__``
    function (from its declaration, with a ``template`` line above it, to its closing brace),
    comments left out."""
    code = without_comments(text)
    lines = code.split("\n")
    spans: list[tuple[int, int]] = []
    for m in re.finditer(r"\b(__global__|__device__)\b", code):
        if any(a <= m.start() < b for a, b in spans):
            continue  # inside a function already counted (e.g. "__host__ __device__")
        depth, i = 0, m.end()
        while i < len(code) and not (depth == 0 and code[i] in "{;"):
            depth += {"(": 1, ")": -1}.get(code[i], 0)
            i += 1
        if i == len(code) or code[i] == ";":
            continue  # a declaration without a body
        depth, end = 0, i
        while True:
            depth += {"{": 1, "}": -1}.get(code[end], 0)
            if depth == 0:
                break
            end += 1
        start = code.rfind("\n", 0, m.start()) + 1
        first = code.count("\n", 0, start)
        if first > 0 and lines[first - 1].strip().startswith("template"):
            start = code.rfind("\n", 0, start - 1) + 1
        spans.append((start, end + 1))
    counted = {line for a, b in spans for line in range(code.count("\n", 0, a), code.count("\n", 0, b) + 1)}
    return sum(1 for n in counted if lines[n].strip())


def numstat(a: Path, b: Path) -> tuple[int, int]:
    """(added, removed) lines from ``a`` to ``b``, as ``git diff --no-index --numstat`` counts them."""
    result = subprocess.run(["git", "diff", "--no-index", "--numstat", str(a), str(b)], capture_output=True, text=True)
    if result.returncode not in (0, 1):
        raise RuntimeError(f"git diff --no-index failed: {result.stderr.strip()}")
    if not result.stdout.strip():
        return 0, 0
    added, removed = result.stdout.split()[:2]
    return int(added), int(removed)


def diff_bound(text: str) -> tuple[int, str]:
    """The most changed lines a rung may differ from the one below by: its header's
    ``diff bound: N lines (reason)`` (N and the reason), else 40 (and "").

    Raises:
        ValueError: a ``diff bound`` field that is not of that form, or that gives no reason.
    """
    field = header_field(text, "diff bound")
    if field is None:
        return MAX_CHANGED_LINES, ""
    found = re.fullmatch(r"diff bound: (\d+) lines \((.*\S.*)\)", field)
    if found is None:
        raise ValueError(f"expected '// diff bound: <N> lines (<reason>)', got {field!r}")
    return int(found[1]), found[2]


def not_faster(text: str) -> dict[str, str]:
    """The directions its header excuses from being faster than the rung below: from
    ``not faster: forward[, forward_backward] (reason)``, direction -> reason ({} without the field).

    Raises:
        ValueError: a field that is not of that form, names no known direction, or gives no reason.
    """
    field = header_field(text, "not faster")
    if field is None:
        return {}
    found = re.fullmatch(r"not faster: ([\w, ]+?) \((.*\S.*)\)", field)
    directions = [d.strip() for d in found[1].split(",")] if found else []
    if not found or not directions or any(d not in DIRECTIONS for d in directions):
        raise ValueError(f"expected '// not faster: <{' | '.join(DIRECTIONS)}>, ... (<reason>)', got {field!r}")
    return {d: found[2] for d in directions}


def faster_at(text: str) -> tuple[list[tuple[int, int]], list[str], str]:
    """Where, beyond the seed size, its header says the rung is faster than the one below: from
    ``faster at: <rows> x <cols>[, <rows> x <cols>] in <direction>[, <direction>] (reason)``, the
    shapes, the directions and the reason (([], [], "") without the field).

    Raises:
        ValueError: a field that is not of that form, names no known direction, or gives no reason.
    """
    field = header_field(text, "faster at")
    if field is None:
        return [], [], ""
    found = re.fullmatch(r"faster at: (\d+ x \d+(?:, \d+ x \d+)*) in ([\w, ]+?) \((.*\S.*)\)", field)
    directions = [d.strip() for d in found[2].split(",")] if found else []
    if not found or not directions or any(d not in DIRECTIONS for d in directions):
        raise ValueError(f"expected '// faster at: <rows> x <cols>, ... in <{' | '.join(DIRECTIONS)}>, ... "
                         f"(<reason>)', got {field!r}")
    shapes = [(int(rows), int(cols)) for rows, cols in re.findall(r"(\d+) x (\d+)", found[1])]
    return shapes, directions, found[3]


FLOAT32_REFUSAL = re.compile(r"if\s*\(\s*dtype\s*!=\s*DType::float32\s*\)\s*return\s+cudaErrorInvalidValue\s*;")
OTHER_DTYPES = re.compile(r"\b(template|__half|__nv_bfloat16|dispatch_dtype|DType::(bfloat16|float16))\b")
KNOBS = re.compile(r"^\s*#\s*(define|ifndef)\b|\bLOSSLAB_\w+", re.MULTILINE)


def float32_problems(text: str) -> list[str]:
    """Where a rung file is not float32 only: a launcher (a function with a ``DType dtype``
    parameter) without its one-line refusal, or code for another dtype."""
    code = without_comments(text)
    found = []
    launchers, refusals = len(re.findall(r"\bDType\s+dtype\b", code)), len(FLOAT32_REFUSAL.findall(code))
    if refusals < launchers:
        found.append(f"{launchers} launchers take a dtype but {refusals} refuse all but float32 "
                     "('if (dtype != DType::float32) return cudaErrorInvalidValue;')")
    found += [f"code for another dtype: {m[0]!r}" for m in OTHER_DTYPES.finditer(code)]
    return found


def knob_problems(text: str) -> list[str]:
    """Launch knobs or macros in a rung file (``#define``, ``#ifndef``, ``LOSSLAB_...``)."""
    return [f"line {without_comments(text).count(chr(10), 0, m.start()) + 1}: {m[0].strip()!r}"
            for m in KNOBS.finditer(without_comments(text))]


def kernel_parameters_without_shape(text: str) -> list[str]:
    """Pointer parameters of ``__global__`` kernels whose line has no shape comment ``// (...)``."""
    found = []
    for m in re.finditer(r"__global__[^{;]*?\(([^{;]*?)\)\s*\{", text, re.DOTALL):
        params = m[1].split("\n")
        found += [p.strip() for p in params if "*" in p.split("//")[0] and not re.search(r"//\s*\(", p)]
    return found


# --- the CPU simulator ---------------------------------------------------------------------------------

# Constructs cuda_sim.h does not model: thread-block clusters, distributed shared memory, inline PTX.
SIMULATOR_LACKS = re.compile(r"\b(asm|this_cluster|cluster_group|__cluster_dims__|cudaLaunchKernelEx)\b")


@functools.cache
def gxx_with_sanitizers() -> bool:
    if shutil.which(sim_build.CXX) is None:
        return False
    probe = subprocess.run([sim_build.CXX, "-x", "c++", "-fsanitize=address,undefined", "-o", "/dev/null", "-"],
                           input="int main() { return 0; }", text=True, capture_output=True)
    return probe.returncode == 0


def simulator_source(problem: str, rung: str, text: str | None = None) -> str:
    """The rung's file with its launchers renamed to the ones the simulator's driver calls
    (``<problem>_custom_forward``/``_backward``)."""
    text = ladder.source(problem, rung).read_text() if text is None else text
    return re.sub(rf"\b{problem}_{rung}_(forward|backward)\b", rf"{problem}_custom_\1", text)


def simulator_mismatches(outcome: sim_run.Outcome, problem: str) -> list[str]:
    """Each case where the simulated loss or gradient is not the float64 reference's within the
    float32 tolerances (inf and NaN where the reference has them), or where the run failed."""
    if not outcome.compiled:
        return [f"does not compile for the simulator:\n{outcome.compile_error}"]
    found = []
    for r in outcome.results:
        name = r.case.name
        if r.failure is not None:
            found.append(f"{name}: {r.failure.kind}: {r.failure.message} (line {r.failure.line})")
            continue
        if (r.forward_status, r.backward_status) != (0, 0):
            found.append(f"{name}: launchers returned {r.forward_status}, {r.backward_status}")
            continue
        ref = sim_cases.PROBLEMS[problem].reference(r.case)
        loss_error, detail = check.relative_error(torch.tensor([r.loss]), torch.from_numpy(ref["loss"]))
        if detail or loss_error > LOSS_RTOL:
            found.append(f"{name}: loss {r.loss}, reference {ref['loss'][0]} ({detail or f'{loss_error:.1e}'})")
        grad_error, detail = check.relative_error(torch.from_numpy(r.grad), torch.from_numpy(ref["grad"]))
        if detail or grad_error > GRAD_RTOL:
            found.append(f"{name}: gradient " + (detail or f"off by {grad_error:.1e} relative norm"))
    return found


# --- cpu tier: the rules, on the real files ---------------------------------------------------------------

def test_the_kl_div_ladder_is_found():
    assert "kl_div" in LADDERS and LADDERS["kl_div"][0] == "naive"


@pytest.mark.parametrize("problem", list(LADDERS))
def test_ladder_has_its_rungs_and_binding(problem):
    files = ladder.sources(problem)  # raises BuildError naming what is missing
    assert set(sim_build.support_sources(build.KERNELS, problem)) <= set(files)
    binding = (build.CSRC / f"{problem}_ladder.cpp").read_text()
    assert f'#include "{problem}/ladder/ladder.h"' in binding
    assert f"{problem.upper()}_LADDER(" in without_comments(binding)


def test_ladder_lookups_name_what_exists():
    with pytest.raises(ValueError, match="has no teaching ladder.*the problems with one: .*kl_div"):
        ladder.rungs("no_such_problem")
    with pytest.raises(ValueError, match="has no rung 'no_such_rung'; its rungs: naive, shared_memory"):
        ladder.source("kl_div", "no_such_rung")
    assert ladder.extension_name("kl_div") == "losslab_kl_div_ladder"


@pytest.mark.parametrize("problem, rung", RUNGS, ids=RUNG_IDS)
def test_rung_opens_with_the_flaw_below_and_its_idea(problem, rung):
    names = LADDERS[problem]
    below = names[names.index(rung) - 1] if names.index(rung) else None
    found = header_problems(ladder.source(problem, rung).read_text(), rung, below)
    assert not found, f"{problem}/ladder/{rung}.cu: " + "; ".join(found)


@pytest.mark.parametrize("problem, rung", RUNGS, ids=RUNG_IDS)
def test_rung_has_at_most_80_lines_of_device_code(problem, rung):
    lines = device_code_lines(ladder.source(problem, rung).read_text())
    print(f"{problem}/ladder/{rung}.cu: {lines} lines of device code")
    assert 0 < lines <= MAX_DEVICE_LINES, f"{problem}/ladder/{rung}.cu: {lines} lines of device code"


@pytest.mark.parametrize("problem, below, above", STEPS, ids=STEP_IDS)
def test_consecutive_rungs_differ_by_their_idea(problem, below, above):
    if shutil.which("git") is None:
        pytest.skip("needs git for git diff --no-index --numstat")
    added, removed = numstat(ladder.source(problem, below), ladder.source(problem, above))
    bound, reason = diff_bound(ladder.source(problem, above).read_text())
    changed = max(added, removed)
    print(f"{problem}: {below} -> {above}: +{added} -{removed}, {changed} changed lines (bound {bound}"
          + (f": {reason})" if reason else ")"))
    assert changed <= bound, (f"{problem}/ladder/{above}.cu differs from {below}.cu by {changed} lines "
                              f"(+{added} -{removed}), more than {bound}: keep identifiers and sections as they "
                              "were, or state '// diff bound: <N> lines (<reason>)' in its header")


@pytest.mark.parametrize("problem, rung", RUNGS, ids=RUNG_IDS)
def test_rung_is_float32_only_without_knobs(problem, rung):
    text = ladder.source(problem, rung).read_text()
    found = float32_problems(text) + knob_problems(text)
    found += [f"no shape comment: {p}" for p in kernel_parameters_without_shape(text)]
    not_faster(text)  # a malformed field raises here, not on a GPU machine
    if faster_at(text)[0] and LADDERS[problem].index(rung) == 0:
        found.append("a 'faster at' field on the first rung: there is no rung below to be faster than")
    assert not found, f"{problem}/ladder/{rung}.cu:\n" + "\n".join(found)


@pytest.fixture(scope="module")
def simulator_builds(request):
    """``{(problem, rung): future}``: the simulator's binaries of every rung of the problems the selected
    tests name, built (into the simulator's content-keyed cache) one g++ per CPU on first use, so that
    each test's ``sim_run.run`` finds its binary built; a build's error is the run's to report."""
    wanted = {item.callspec.params["problem"] for item in request.session.items
              if "simulator_builds" in getattr(item, "fixturenames", ()) and hasattr(item, "callspec")}
    if not gxx_with_sanitizers():
        return {}
    pool = futures.ThreadPoolExecutor(len(os.sched_getaffinity(0)))
    request.addfinalizer(pool.shutdown)
    return {(p, r): pool.submit(sim_build.build, p, simulator_source(p, r), f"{r}.cu")
            for p in sorted(wanted) for r in LADDERS[p]
            if not SIMULATOR_LACKS.search(without_comments(ladder.source(p, r).read_text()))}


@pytest.mark.parametrize("order", ["forward", "reverse"])
@pytest.mark.parametrize("problem, rung", RUNGS, ids=RUNG_IDS)
def test_rung_matches_float64_on_the_cpu_simulator(simulator_builds, problem, rung, order):
    if not gxx_with_sanitizers():
        pytest.skip("simulator tests skipped: g++ with -fsanitize=address,undefined is missing")
    lacks = SIMULATOR_LACKS.search(without_comments(ladder.source(problem, rung).read_text()))
    if lacks:
        pytest.skip(f"{problem} {rung} cannot run on the CPU simulator: it uses {lacks[0]}, and the simulator "
                    "models no thread-block clusters, distributed shared memory or inline PTX (the gpu tier runs it)")
    futures.wait([simulator_builds[problem, rung]])
    outcome = sim_run.run(simulator_source(problem, rung), problem, label=f"{rung}.cu", order=order)
    found = simulator_mismatches(outcome, problem)
    assert not found, f"{problem}/ladder/{rung}.cu, threads in {order} order:\n" + "\n".join(found)


# --- cpu tier: each checker fails on a deliberately broken copy ---------------------------------------------

RUNG = ("kl_div", "shared_memory")  # any rung serves: each check is broken on a copy of it


def test_header_check_fails_without_the_rung_below_or_the_idea():
    text = ladder.source(*RUNG).read_text()
    assert header_problems(text, "shared_memory", "naive") == []
    assert header_problems(text.replace("naive", "the first rung"), "shared_memory", "naive") == [
        "the opening comment does not name the rung below, naive, whose flaw it fixes"]
    assert header_problems("// shared_memory: short.\n#include <x.h>\n", "shared_memory", None) == [
        "the opening comment is too short to state the idea and the flaw (1 lines)",
        "the first rung's opening comment does not name its flaw"]
    assert header_problems("#include <x.h>\n" + text, "shared_memory", "naive")[0].startswith("does not open with")


def test_device_line_count_fails_on_an_inflated_copy():
    text = ladder.source(*RUNG).read_text()
    lines = device_code_lines(text)
    assert device_code_lines(text.replace("__device__ __forceinline__", "__host__ __device__ __forceinline__")) == lines
    padded = text.replace("    __syncthreads();\n", "    __syncthreads();\n" + "    // a comment\n\n" * 50, 1)
    assert device_code_lines(padded) == lines  # comments and blank lines do not count
    inflated = text.replace("    __syncthreads();\n", "    __syncthreads();\n" + "    __threadfence();\n" * 81, 1)
    assert device_code_lines(inflated) == lines + 81 > MAX_DEVICE_LINES
    assert device_code_lines("template <int N>\n__device__ int f() {\n    return N;\n}\n__device__ int g();\n") == 4


def test_diff_check_fails_on_an_inflated_copy_and_reads_the_bound(tmp_path):
    below, above = ladder.source("kl_div", "naive"), tmp_path / "shared_memory.cu"
    text = ladder.source(*RUNG).read_text()
    above.write_text(text)
    added, removed = numstat(below, above)
    above.write_text(text + "// more\n" * (MAX_CHANGED_LINES + 1))
    assert numstat(below, above) == (added + MAX_CHANGED_LINES + 1, removed)
    assert max(numstat(below, above)) > diff_bound(text)[0] == MAX_CHANGED_LINES
    bounded = "// shared_memory: x\n// diff bound: 60 lines (the head and the tail,\n//     twice)\n#include <x.h>\n"
    assert diff_bound(bounded) == (60, "the head and the tail, twice")
    with pytest.raises(ValueError, match="expected '// diff bound"):
        diff_bound("// shared_memory: x\n// diff bound: 60 lines\n")
    assert not_faster("// x: y\n// not faster: forward (memory-bound,\n//   as below)\n") == {
        "forward": "memory-bound, as below"}
    with pytest.raises(ValueError, match="expected '// not faster"):
        not_faster("// x: y\n// not faster: backwards (why)\n")
    assert faster_at("// x: y\n// faster at: 2048 x 262144, 4096 x 131072 in forward_backward (fused reads\n"
                     "//   each row twice)\n// not faster: forward (z)\n") == (
        [(2048, 262144), (4096, 131072)], ["forward_backward"], "fused reads each row twice")
    assert faster_at(text) == ([], [], "")
    for broken in ("2048 x 262144 (no direction)", "2048x262144 in forward (why)", "in forward (no size)",
                   "2048 x 262144 in backwards (why)", "2048 x 262144 in forward"):
        with pytest.raises(ValueError, match="expected '// faster at"):
            faster_at(f"// x: y\n// faster at: {broken}\n")


def test_float32_and_knob_checks_fail_on_broken_copies():
    text = ladder.source(*RUNG).read_text()
    assert float32_problems(text) == knob_problems(text) == kernel_parameters_without_shape(text) == []
    lenient = FLOAT32_REFUSAL.sub("", text, count=1)
    assert float32_problems(lenient) == ["2 launchers take a dtype but 1 refuse all but float32 "
                                         "('if (dtype != DType::float32) return cudaErrorInvalidValue;')"]
    templated = text.replace("__device__ __forceinline__ float block_sum", "template <typename T>\n"
                             "__device__ __forceinline__ float block_sum")
    assert float32_problems(templated) == ["code for another dtype: 'template'"]
    knobbed = text.replace("constexpr int THREADS = 256;", "#ifndef LOSSLAB_KL_DIV_SHARED_MEMORY_THREADS\n"
                           "#define LOSSLAB_KL_DIV_SHARED_MEMORY_THREADS 256\n#endif\n"
                           "constexpr int THREADS = LOSSLAB_KL_DIV_SHARED_MEMORY_THREADS;")
    assert len(knob_problems(knobbed)) == 5
    unshaped = re.sub(r"(float\* __restrict__ row_partials,)\s*// \(B,\)", r"\1", text)
    assert kernel_parameters_without_shape(unshaped) == ["float* __restrict__ row_partials,"]


def test_simulator_check_fails_on_a_copy_without_its_barriers():
    if not gxx_with_sanitizers():
        pytest.skip("simulator tests skipped: g++ with -fsanitize=address,undefined is missing")
    problem, rung = RUNG
    text = ladder.source(problem, rung).read_text()
    assert "__syncthreads();" in text
    broken = simulator_source(problem, rung, text.replace("__syncthreads();", ""))
    case_list = sim_cases.PROBLEMS[problem].cases()[:1]
    outcome = sim_run.run(broken, problem, case_list, label=f"{rung}.cu")
    assert outcome.compiled, outcome.compile_error
    found = simulator_mismatches(outcome, problem)
    assert found and "loss" in found[0], found


def test_simulator_skip_detects_clusters_only():
    assert SIMULATOR_LACKS.search("cg::cluster_group cluster = cg::this_cluster();")
    assert SIMULATOR_LACKS.search('asm volatile("mapa.shared::cluster.u32 %0, %1, %2;")')
    assert not any(SIMULATOR_LACKS.search(without_comments(ladder.source(p, r).read_text()))
                   for p, r in RUNGS if p == "kl_div")


# --- compile tier: machine code ---------------------------------------------------------------------------

ARCHS = ("sm_80", "sm_90")
SCALAR_LOAD = r"\bLDG\.E(\.CONSTANT)? "  # a 32-bit load: "LDG.E" then a space or ".CONSTANT " (not .128)
# What a rung's SASS (all its kernels, sm_90) must and must not contain: its idea. fused's sign is
# relative to the rung below (the forward stores the gradient), see test_sass_shows_the_rungs_idea.
SASS_SIGNS = {
    "naive": ({SCALAR_LOAD}, {r"LDG\.E\.128", r"\bSHFL\b", r"BAR\.SYNC"}),
    "shared_memory": ({r"BAR\.SYNC", r"\bSTS\b", r"\bLDS\b"}, {r"\bSHFL\b", r"LDG\.E\.128"}),
    "warp_shuffle": ({r"SHFL\.BFLY"}, {r"LDG\.E\.128"}),
    "vectorized": ({r"LDG\.E\.128"}, set()),
    "fused": ({r"LDG\.E\.128", r"STG\.E"}, set()),
    "cluster": ({r"UCGABAR_ARV", r"STS\.128"}, set()),  # the cluster barrier; the slice into shared memory
}


@pytest.fixture(scope="module")
def machine_code(request, tmp_path_factory):
    """``(cubin, sass)``: ``cubin(problem, rung, arch) -> (path, ptxas report)`` and ``sass(problem, rung)
    -> {kernel: SASS}`` (sm_90), each made once per module run. Every rung of the problems the selected
    tests name is compiled for both architectures, then disassembled, on first use, one nvcc or cuobjdump
    per CPU (each file alone, as one at a time would: the ladder's compile tier is most of its time); a
    failure is raised by the test that asks for that file."""
    out = tmp_path_factory.mktemp("ladder-cubin")
    wanted = {item.callspec.params["problem"] for item in request.session.items
              if "machine_code" in getattr(item, "fixturenames", ()) and hasattr(item, "callspec")}
    pool = futures.ThreadPoolExecutor(len(os.sched_getaffinity(0)))
    request.addfinalizer(pool.shutdown)
    compiled = {(p, r, arch): pool.submit(build.compile_cubin, ladder.source(p, r), arch, out / p)
                for p in sorted(wanted) for r in LADDERS[p] for arch in ARCHS}
    # Submitted after every compile: a worker waits only on a compile already taken by another.
    disassembled = {(p, r): pool.submit(lambda key: build.disassemble(compiled[key].result()[0]), (p, r, "sm_90"))
                    for p, r, arch in compiled if arch == "sm_90"}
    return (lambda problem, rung, arch: compiled[problem, rung, arch].result(),
            lambda problem, rung: disassembled[problem, rung].result())


@pytest.fixture
def cubin(machine_code):
    return machine_code[0]


@pytest.fixture
def sass(machine_code):
    return machine_code[1]


def forward_stores(sass: dict[str, str]) -> int:
    """Global stores (STG) in the forward kernels of a disassembly."""
    return sum(len(re.findall(r"\bSTG\.", body)) for name, body in sass.items() if "forward" in name)


@pytest.mark.compile
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("problem, rung", RUNGS, ids=RUNG_IDS)
def test_rung_compiles_without_spills(cubin, problem, rung, arch):
    _, report = cubin(problem, rung, arch)
    kernels = build.resource_usage(report, arch)
    assert kernels, f"no kernel found in ptxas output for {problem}/ladder/{rung}.cu"
    for k in kernels:
        print(f"{problem}/ladder/{rung}.cu {arch}: {k.kernel}: {k.registers} registers")
        assert k.spill_store_bytes == k.spill_load_bytes == 0, f"{k.kernel} spills on {arch}: {k}"
        assert k.stack_bytes == 0, f"{k.kernel} uses a {k.stack_bytes}-byte stack frame on {arch}"


@pytest.mark.compile
@pytest.mark.parametrize("problem, rung", RUNGS, ids=RUNG_IDS)
def test_sass_shows_the_rungs_idea(sass, problem, rung):
    if rung not in SASS_SIGNS:
        pytest.skip(f"no SASS sign is declared for a {rung} rung here")
    kernels = sass(problem, rung)
    text = "\n".join(kernels.values())
    required, forbidden = SASS_SIGNS[rung]
    for opcode in required:
        assert re.search(opcode, text), f"{problem} {rung}: expected {opcode} in its SASS"
    for opcode in forbidden:
        assert not re.search(opcode, text), f"{problem} {rung}: did not expect {opcode} in its SASS"
    names = LADDERS[problem]
    if rung == "fused" and names.index(rung) > 0:  # its forward also stores the gradient
        below = names[names.index(rung) - 1]
        stores = forward_stores(kernels)
        below_stores = forward_stores(sass(problem, below))
        assert stores > below_stores, (f"{problem} fused: its forward kernels hold {stores} global stores, {below}'s "
                                       f"{below_stores}: the forward should also store the gradient")


@pytest.mark.compile
def test_sass_signs_fail_on_a_copy_without_the_idea(tmp_path):
    text = ladder.source("kl_div", "warp_shuffle").read_text()
    source = tmp_path / "warp_shuffle.cu"
    source.write_text(text.replace("value += __shfl_xor_sync(0xffffffffu, value, offset);", "value += value;"))
    sass = "\n".join(build.disassemble(build.compile_cubin(source, "sm_90", tmp_path)[0]).values())
    assert re.search(SCALAR_LOAD, sass) and not any(re.search(s, sass) for s in SASS_SIGNS["warp_shuffle"][0])
    assert forward_stores({"forward_kernel": "STG.E [R2], R5 ;", "backward_kernel": "STG.E.128 [R2], R4 ;"}) == 1


@pytest.mark.compile
@pytest.mark.parametrize("problem", list(LADDERS))
def test_ladder_extension_builds_and_imports(problem):
    ext = ladder.load_ladder(problem)
    for rung in LADDERS[problem]:
        assert callable(getattr(ext, f"{rung}_forward")) and callable(getattr(ext, f"{rung}_backward"))
    with pytest.raises(TypeError):  # bind.h maps each parameter: a wrong count is refused by pybind11
        getattr(ext, f"{LADDERS[problem][0]}_forward")(0)


# --- gpu tier: the ladder against float64, and its timings ---------------------------------------------------

GRAD_LOSS = check.GRAD_LOSS  # an upstream gradient other than 1 also checks the scaling
SIZES = ("odd", "small", "seed")


def host_functions(problem: str):
    """The module of ``problem``'s host code (``forward(launcher, write_grad, ...)``, ``backward(...)``)."""
    return problems.get(problem).host


def launchers(problem: str, rung: str):
    """(forward, backward, write_grad): the rung's bound launchers and whether its forward writes the
    gradient (the problem's rung table of the rung of that name says so)."""
    ext = ladder.load_ladder(problem)
    spec = problems.get(problem)  # a teaching rung without an operator of its name writes no gradient in its forward
    return (getattr(ext, f"{rung}_forward"), getattr(ext, f"{rung}_backward"),
            rung in spec.variants and spec.rung(rung).writes_grad_in_forward)


def ladder_errors(problem: str, rung: str, inputs, forward=None, backward=None) -> list[str]:
    """How the rung's loss and gradient (for grad_loss = 0.75) miss float64 on ``inputs``, and whether a
    second run into NaN-poisoned outputs reproduces them bitwise (every element written, deterministic).
    ``forward``/``backward``: other launchers to run in the rung's place (a broken copy)."""
    host, spec = host_functions(problem), problems.get(problem)
    own_forward, own_backward, write_grad = launchers(problem, rung)
    forward, backward = forward or own_forward, backward or own_backward
    loss64, grad64 = spec.reference_float64(*inputs)
    grad_loss = torch.tensor(GRAD_LOSS, device=inputs[0].device)
    loss, saved = host.forward(forward, write_grad, *inputs)
    grad = host.backward(backward, write_grad, saved, grad_loss)
    found = []
    loss_error, detail = check.relative_error(loss, loss64)
    if detail or loss_error > LOSS_RTOL:
        found.append(f"loss {loss.item()}, reference {loss64.item()}: {detail or f'{loss_error:.1e} relative'}")
    grad_error, detail = check.relative_error(grad, grad64 * GRAD_LOSS)
    if detail or grad_error > GRAD_RTOL:
        found.append(f"gradient: {detail or f'{grad_error:.1e} relative norm'}")
    poisoned_loss = torch.full((), float("nan"), device=loss.device, dtype=loss.dtype)
    poisoned_grad = torch.full_like(grad, float("nan"))
    again, saved = host.forward(forward, write_grad, *inputs, out=poisoned_loss, grad_out=poisoned_grad)
    again_grad = host.backward(backward, write_grad, saved, grad_loss, out=poisoned_grad)
    if not torch.equal(again.nan_to_num(), loss.nan_to_num()):
        found.append(f"a second run into a NaN-poisoned loss gives {again.item()}, not {loss.item()}")
    if not torch.equal(again_grad.nan_to_num(), grad.nan_to_num()):
        found.append("a second run into a NaN-poisoned gradient differs (an element unwritten, or non-deterministic)")
    return found


@pytest.mark.gpu
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("problem, rung", RUNGS, ids=RUNG_IDS)
def test_rung_matches_float64_on_the_gpu(problem, rung, size):
    shape = problems.get(problem).sizes[size]
    inputs = problems.get(problem).make_inputs(shape, seed=0, device="cuda")
    found = ladder_errors(problem, rung, inputs)
    assert not found, f"{problem} ladder {rung} at {size} {shape}:\n" + "\n".join(found)


@pytest.mark.gpu
@pytest.mark.parametrize("problem, rung", RUNGS, ids=RUNG_IDS)
def test_rung_matches_float64_on_the_edge_cases(problem, rung):
    found = [f"{case}: {error}" for case, inputs in problems.get(problem).edge_cases("cuda").items()
             for error in ladder_errors(problem, rung, inputs)]
    assert not found, f"{problem} ladder {rung}:\n" + "\n".join(found)


@pytest.mark.gpu
@pytest.mark.parametrize("problem, rung", RUNGS, ids=RUNG_IDS)
def test_rung_refuses_another_dtype(problem, rung):
    forward, _, write_grad = launchers(problem, rung)
    inputs = problems.get(problem).make_inputs((4, 64), seed=0, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="invalid argument"):
        host_functions(problem).forward(forward, write_grad, *inputs)


@pytest.mark.gpu
def test_gpu_check_fails_on_a_launcher_that_skips_the_last_row():
    problem, rung = RUNG
    inputs = problems.get(problem).make_inputs(problems.get(problem).sizes["odd"], seed=0, device="cuda")
    assert ladder_errors(problem, rung, inputs) == []
    forward, backward, _ = launchers(problem, rung)

    def short(launcher, rows_at):  # the launcher, told one row fewer than there are
        return lambda *args: launcher(*args[:rows_at], args[rows_at] - 1, *args[rows_at + 1:])

    found = ladder_errors(problem, rung, inputs, short(forward, 5), short(backward, 4))
    assert found[0].startswith("loss ") and any(f.startswith("gradient: ") for f in found), found


def median_ms(fn) -> float:
    return timing.time_cuda(fn, back_to_back=False).median_ms


def rung_times(problem: str, rung: str, inputs) -> dict[str, float]:
    """Median GPU ms (L2 flushed) of the rung's forward and of its forward + backward (grad_loss 1,
    as loss.backward()) through the problem's host functions."""
    host = host_functions(problem)
    forward, backward, write_grad = launchers(problem, rung)
    ones = torch.ones((), device=inputs[0].device)
    return {"forward": median_ms(lambda: host.forward(forward, write_grad, *inputs)),
            "forward_backward": median_ms(
                lambda: host.backward(backward, write_grad, host.forward(forward, write_grad, *inputs)[1], ones))}


@pytest.mark.gpu
@pytest.mark.parametrize("problem", list(LADDERS))
def test_each_rung_is_faster_than_the_one_below(problem):
    spec, names = problems.get(problem), LADDERS[problem]
    shape = spec.sizes["seed"]
    inputs = spec.make_inputs(shape, seed=0, device="cuda")
    times = {rung: rung_times(problem, rung, inputs) for rung in names}
    table = [f"{problem} ladder at {shape[0]}x{shape[1]} float32 on {torch.cuda.get_device_name()}: median ms",
             f"{'rung':<14} {'forward':>9} {'fwd+bwd':>9}"]
    table += [f"{rung:<14} {t['forward']:>9.3f} {t['forward_backward']:>9.3f}" for rung, t in times.items()]
    print("\n".join(table))
    failures = []
    for below, above in zip(names, names[1:], strict=False):
        excused = not_faster(ladder.source(problem, above).read_text())
        for direction in DIRECTIONS:
            before, after = times[below][direction], times[above][direction]
            if after >= before and direction not in excused:
                failures.append(f"{above} {direction}: {after:.3f} ms, not faster than {below}'s {before:.3f}")
            elif after >= before:
                print(f"{above} {direction}: not faster than {below} ({after:.3f} vs {before:.3f} ms), as its header "
                      f"says: {excused[direction]}")
    assert not failures, "\n".join(table + failures)


FASTER_AT = [(p, r) for p, r in RUNGS if header_field(ladder.source(p, r).read_text(), "faster at") is not None]


@pytest.mark.gpu
@pytest.mark.parametrize("problem, rung", FASTER_AT, ids=[f"{p}/{r}" for p, r in FASTER_AT])
def test_rung_matches_and_is_faster_where_its_header_says(problem, rung):
    spec, names = problems.get(problem), LADDERS[problem]
    below = names[names.index(rung) - 1]
    shapes, directions, reason = faster_at(ladder.source(problem, rung).read_text())
    failures = []
    for shape in shapes:
        inputs = spec.make_inputs(shape, seed=0, device="cuda")
        failures += [f"{rung} at {shape[0]}x{shape[1]}: {error}" for error in ladder_errors(problem, rung, inputs)]
        times = {r: rung_times(problem, r, inputs) for r in (below, rung)}
        table = [f"{problem} ladder at {shape[0]}x{shape[1]} float32 on {torch.cuda.get_device_name()}: median ms",
                 f"{'rung':<14} {'forward':>9} {'fwd+bwd':>9}"]
        table += [f"{r:<14} {t['forward']:>9.3f} {t['forward_backward']:>9.3f}" for r, t in times.items()]
        print("\n".join(table))
        for direction in directions:
            before, after = times[below][direction], times[rung][direction]
            if after >= before:
                failures.append(f"{rung} {direction} at {shape[0]}x{shape[1]}: {after:.3f} ms, not faster than "
                                f"{below}'s {before:.3f}, though its header says so: {reason}")
        del inputs
        torch.cuda.empty_cache()  # the next size's inputs and float64 reference start from a clean pool
    assert not failures, "\n".join(failures)
