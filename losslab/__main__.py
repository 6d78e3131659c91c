"""The losslab command line: parse, validate, call the package, print.

Its commands, which of them need a GPU and how a mistake is reported (one line, status 2):
:data:`USAGE`, which ``python -m losslab --help`` prints.

One module: each command is a short function over the package; all share one parser and its argument checks.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

from losslab import problems, records
from losslab.measure.peers import PEERS
from losslab.summary import summary_text, sweep_markdown

USAGE = """\
    python -m losslab list                      problems, variants and sizes
    python -m losslab check PROBLEM             every variant against float64, edge cases
    python -m losslab bench PROBLEM             check, time, add to the record under reports/results/
    python -m losslab bench PROBLEM --ncu       ... and Nsight Compute's counters per rung (DRAM bytes, coalescing, ...)
    python -m losslab bench --all --sweep       every problem over sizes from 128 rows to LLM-sized, fp32 and bf16
    python -m losslab bench --all               every problem, then the best variant against each peer
    python -m losslab bench PROBLEM --knobs fused:UNROLL=8  a launch configuration beside the default (not recorded)
    python -m losslab summary                   that summary from the newest recorded results
    python -m losslab summary --sweep           the sweep's best rung against the peers at every size, per device
    python -m losslab roofline                  roofline figures (PNG) from the recorded results
    python -m losslab report                    execute the notebooks headless into reports/
    python -m losslab export PROBLEM vectorized a single-file KernelBench solution (ModelNew) on stdout
    python -m losslab evaluate solution.py --problem PROBLEM   judge a ModelNew file (GPU; runs its code)
    python -m losslab pitfalls --record         run the deliberate mistakes (GPU), record what the checker saw
    python -m losslab grade FILE                grade an exercise (exercises/<problem>/<key>.cu): verdict and hint
    python -m losslab grade --list              the exercises: key, problem, rung, file

``check`` and ``bench`` need a CUDA GPU; ``list``, ``summary``, ``roofline`` and ``report`` run
anywhere (without a GPU the notebooks render the recorded results). ``grade`` runs anywhere (on the
GPU when one is visible, else on the CPU simulator) in a child process with a time limit
(``--timeout``); it exits 0 when the exercise is green, 1 when it is not (a file that does not
compile, crashes or never finishes included). Every argument is checked
before any GPU work starts; a mistake prints one line, ``losslab <command>: <argument>: <what was
expected>``, and exits with status 2.
"""
SIZE_HELP = "a size name of the problem (python -m losslab list) or ROWSxCOLUMNS such as 257x4099"


class UsageError(Exception):
    """A command-line value that cannot be used: ``argument`` names it, the message says what was expected."""

    def __init__(self, argument: str, expected: str):
        super().__init__(f"{argument}: {expected}")


class _Parser(argparse.ArgumentParser):
    """argparse that reports a mistake as one line, ``losslab <command>: <argument>: <expected>``."""

    def error(self, message: str):
        command = self.prog.split()[-1] if self.prog.split()[-1] != "losslab" else ""
        message = re.sub(r"^argument ([^:]+): ", lambda m: f"{m.group(1).split('/')[0]}: ", message)
        self.exit(2, f"losslab{' ' + command if command else ''}: {message}\n")


# --- value parsers (argparse types): each raises ArgumentTypeError with what was expected ------------------

def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1 or str(value) != text.strip().lstrip("+"):
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}")
    return value


def _positive_float(text: str, expected: str) -> float:
    """A finite number above 0 (NaN, 0, a negative value or inf would turn a gate off)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return value


def _positive_seconds(text: str) -> float:
    return _positive_float(text, "a positive number of seconds")


def _positive_number(text: str) -> float:
    return _positive_float(text, "a positive number such as 1.5")


def _size(text: str) -> str | tuple[int, int]:
    """A size name (checked per problem later) or ROWSxCOLUMNS with two positive integers."""
    names = {name for p in problems.names() for name in problems.get(p).sizes}
    if text in names:
        return text
    match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", text)
    if not match or min(int(match[1]), int(match[2])) < 1:
        raise argparse.ArgumentTypeError(f"expected {SIZE_HELP} (two positive dimensions; "
                                         f"size names: {', '.join(sorted(names))}), got {text!r}")
    return int(match[1]), int(match[2])


def _problem(text: str) -> str:
    if text not in problems.names():
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(problems.names())}, got {text!r}")
    return text


def _dtypes(text: str) -> list[str]:
    names = [d.strip() for d in text.split(",") if d.strip()]
    bad = [d for d in names if d not in records.DTYPES]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of {', '.join(records.DTYPES)}, "
                                         f"got {text!r}")
    return names


def _shapes(text: str) -> list[tuple[int, int]]:
    """A comma-separated list of ROWSxCOLUMNS (for ``--sweep``)."""
    shapes = []
    for part in [p for p in text.split(",") if p.strip()]:
        match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", part)
        if not match or min(int(match[1]), int(match[2])) < 1:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of ROWSxCOLUMNS such as "
                                             f"128x4096,2048x4096 (positive dimensions), got {text!r}")
        shapes.append((int(match[1]), int(match[2])))
    if not shapes:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of ROWSxCOLUMNS, got {text!r}")
    return shapes


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of names, got {text!r}")
    return names


def _knob_setting(text: str) -> tuple[str, dict[str, int]]:
    """``RUNG:KNOB=VALUE[,KNOB=VALUE...]`` -> (rung, {knob: value}); checked against the kernel
    files in ``_bench_plan``, once the problems are known."""
    rung, _, settings = text.partition(":")
    values = {}
    for item in settings.split(","):
        knob, _, value = item.partition("=")
        if not rung.strip() or not knob.strip() or not value.strip().lstrip("-").isdigit():
            raise argparse.ArgumentTypeError(f"expected RUNG:KNOB=VALUE[,KNOB=VALUE...] such as "
                                             f"vectorized:UNROLL=16, got {text!r}")
        values[knob.strip()] = int(value)
    return rung.strip(), values


def _output_file(text: str) -> Path:
    """A path a file can be written to: its folder exists, and it is not a folder or a read-only file."""
    path = Path(text)
    folder = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"expected a file path to write, got the directory {text!r}")
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"expected a file in an existing folder, but {str(folder)!r} does not exist")
    if path.exists() and not os.access(path, os.W_OK):
        raise argparse.ArgumentTypeError(f"expected a writable file, but {text!r} is read-only")
    if not path.exists() and not os.access(folder, os.W_OK):
        raise argparse.ArgumentTypeError(f"expected a file in a writable folder, but {str(folder)!r} is read-only")
    return path


def _output_folder(text: str) -> Path:
    """A folder to write into: it exists and is writable, or can be made inside a writable folder."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"expected a folder, but {text!r} is a file")
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not os.access(existing, os.W_OK):
        raise argparse.ArgumentTypeError(f"expected a writable folder, but {str(existing)!r} is read-only")
    return path


# --- checks that need more than one argument ---------------------------------------------------------

def _shape_for(problem: str, size) -> tuple[int, int]:
    """``size`` (a name or a pair) as (rows, columns) of ``problem``.

    Raises:
        UsageError: a name the problem does not have.
    """
    spec = problems.get(problem)
    if isinstance(size, tuple):
        return size
    if size not in spec.sizes:
        raise UsageError("--size", f"{problem} has no size {size!r}; expected one of {', '.join(spec.sizes)} "
                                   "or ROWSxCOLUMNS")
    return tuple(spec.sizes[size])


def _check_variants(names: list[str], variants: list[str] | None) -> None:
    from losslab.variants import find_variant

    for name in names:
        for v in variants or []:
            try:
                find_variant(problems.get(name), v)
            except ValueError as err:
                raise UsageError("--variants", str(err).removeprefix("variant: ")) from None


def _needed_bytes(problem: str, shape: tuple[int, int], dtypes: list[str]) -> int:
    """Device memory a bench of ``shape`` needs, about: the inputs and a gradient per implementation,
    and the float64 reference (4x the minimum bytes of forward+backward in the widest dtype),
    plus the L2 flush buffer."""
    import torch

    from losslab.measure.timing import FLUSH_BYTES

    cost = max(problems.get(problem).cost(shape, "forward_backward", getattr(torch, d)).bytes for d in dtypes)
    return 4 * cost + FLUSH_BYTES


def _check_memory(problem: str, shape: tuple[int, int], dtypes: list[str]) -> None:
    """Raise UsageError when a bench of ``shape`` cannot fit on the visible GPU (no GPU: no check)."""
    import torch

    if not torch.cuda.is_available():
        return
    needed = _needed_bytes(problem, shape, dtypes)
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    if needed > total:
        raise UsageError("--size", f"{problem} at {shape[0]}x{shape[1]} needs about {needed / 1e9:,.1f} GB of "
                                   f"device memory; {torch.cuda.get_device_name()} has {total / 1e9:,.1f} GB")


def _device(argument: str, device: str | None, results_dir=records.RESULTS_DIR) -> str | None:
    """The recorded device name for ``device`` (a name or a slug), or None for None."""
    if device is None:
        return None
    try:
        return records.resolve_device(device, results_dir)
    except LookupError as err:
        raise UsageError(argument, str(err)) from None


def _require_gpu(command: str) -> None:
    import torch

    if not torch.cuda.is_available():
        sys.exit(f"losslab {command}: needs a CUDA GPU and none is visible here "
                 f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'no'}). "
                 "Without a GPU, `python -m losslab report` renders the recorded results.")


# --- the commands --------------------------------------------------------------------------------------

def cmd_list(args) -> int:
    from losslab.build import knobs

    for name in problems.names():
        spec = problems.get(name)
        sizes = ", ".join(f"{k} {r}x{c}" for k, (r, c) in spec.sizes.items())
        print(f"{name}\n  variants: {', '.join(spec.variants)}\n  sizes: {sizes}")
        for rung in spec.variants:
            declared = knobs.knobs(name, rung)
            if declared:
                print(f"  {rung} knobs (bench --knobs {rung}:{declared[0].name}=...): " + "; ".join(
                    f"{k.name}={k.default} ({k.meaning}: {' '.join(map(str, k.allowed))})" for k in declared))
    return 0


def cmd_summary(args) -> int:
    results_dir = args.results_dir or records.RESULTS_DIR
    device = _device("--device", args.device, results_dir)
    if args.sweep:
        return _sweep_summary(device, results_dir)
    sections = {}
    for name in problems.names():
        try:
            sections[name] = records.latest_section(name, device, results_dir)
        except LookupError as err:
            print(f"losslab summary: {err}", file=sys.stderr)
    if not sections:
        return 1
    print(summary_text(sections))
    return 0


def _sweep_summary(device: str | None, results_dir: Path) -> int:
    """``summary --sweep``: each problem's sweep table over the recorded devices (or ``device``)."""
    tables = []
    recorded = [r for r in records.load_records(results_dir) if device is None or r.device == device]
    for name in problems.names():
        found = [r.sections[name] for r in recorded if name in r.sections]
        found = [s for s in found if any(r.direction == "forward_backward" for r in s.rows)]
        if found:
            tables.append(sweep_markdown(name, sorted(found, key=lambda s: s.device)))
        else:
            print(f"losslab summary: no {name} sweep recorded{f' on {device}' if device else ''}", file=sys.stderr)
    if not tables:
        return 1
    print("\n\n".join(tables))
    return 0


def cmd_check(args) -> int:
    from losslab.measure.check import check_problem, check_table_text

    _check_variants(args.problems, args.variants)
    for name in args.problems:
        for size in args.sizes or []:
            if size not in problems.get(name).sizes:
                raise UsageError("--sizes", f"{name} has no size {size!r}; expected some of "
                                            f"{', '.join(problems.get(name).sizes)}")
    _require_gpu("check")
    failed = 0
    for name in args.problems:
        print(f"checking {name} ...", flush=True)
        results = check_problem(problems.get(name), args.variants, args.sizes or None,
                                edge_cases=not args.no_edge_cases)
        print(check_table_text(results))
        failed += sum(not r.passed for r in results)
        if args.json:
            args.json.write_text(json.dumps([r.as_dict() for r in results], indent=1))
    print(f"{failed} check(s) failed" if failed else "all checks passed")
    return 1 if failed else 0


def _knob_configs(names: list[str], settings: list[tuple[str, dict[str, int]]]) -> dict[str, list]:
    """problem -> the launch configurations (``build.knobs.Config``) ``--knobs`` asks for, checked.

    Raises:
        UsageError: a rung a problem lacks, a knob the rung does not declare or a value it does not offer.
    """
    from losslab.build import knobs

    found = {}
    for name in names:
        found[name] = []
        for rung, values in settings:
            try:
                problems.get(name).check_variant_name(rung)
                found[name].append(knobs.config(name, rung, values))
            except ValueError as err:
                raise UsageError("--knobs", str(err).removeprefix('variant: ').removeprefix('knobs: ')) from None
    return found


def _bench_plan(args) -> dict[str, tuple[int, int]]:
    """Every argument of ``bench`` checked (before any GPU work): problem -> shape."""
    if args.all:
        args.problems = list(problems.names())
    if not args.problems:
        raise UsageError("problem", f"expected one or more of {', '.join(problems.names())}, or --all")
    _check_variants(args.problems, args.variants)
    if args.shapes is not None and not args.sweep:
        raise UsageError("--shapes", "only with --sweep (one size for a bench: --size)")
    if args.knobs:
        for option, given in (("--sweep", args.sweep), ("--ncu", args.ncu), ("--replace", args.replace)):
            if given:
                raise UsageError(option, "not with --knobs: launch configurations are timed beside their rung's "
                                         "default build and printed, never recorded; leave it out")
    args.knob_configs = _knob_configs(args.problems, args.knobs or [])
    if args.sweep:
        for option, given in (("--size", args.size is not None), ("--ncu", args.ncu), ("--replace", args.replace),
                              ("--variants", args.variants is not None)):
            if given:
                raise UsageError(option, "not with --sweep: a sweep times every rung that takes the dtype, "
                                         "at its own shapes, and adds to the record; leave it out")
        args.dtypes = args.dtypes or ["float32", "bfloat16"]
        return {}
    args.dtypes = args.dtypes or ["float32"]
    return {name: _shape_for(name, args.size or "seed") for name in args.problems}


def cmd_sweep(args) -> int:
    """``bench --sweep``: each problem over its sweep shapes (``bench.SWEEP_SHAPES``, or the list
    given), added to the record; a table of median ms per call (and fraction of bandwidth)."""
    from losslab.measure.bench import SWEEP_SHAPES, sweep_table_text
    from losslab.measure.ceilings import measure_ceilings

    _require_gpu("bench")
    _require_readable_records(args)
    print("measuring the device's ceilings (bandwidth, FP32 FMA, MUFU, host floor) ...", file=sys.stderr, flush=True)
    ceilings = measure_ceilings()
    peers = tuple(p for p in PEERS if not (p == "compile" and args.no_compile))
    tables, sections = [], {}
    for name in args.problems:
        shapes = args.shapes or SWEEP_SHAPES[name]
        section = records.measure_sweep(name, shapes, dtypes=args.dtypes, peers=peers, repeats=args.repeats,
                                        ceilings=ceilings)
        tables.append(f"{name} sweep on {section.device} (read {ceilings['read_gbps']:.0f} GB/s, copy "
                      f"{ceilings['copy_gbps']:.0f} GB/s)\n{sweep_table_text(section.rows, section.skipped)}")
        sections[name] = section
    _show_then_record(args, tables, sections, replace=False)
    return 0


def _require_readable_records(args) -> None:
    """Read the records a run will add to before any GPU work: a file that is not a record stops
    the run now (one line naming it), not after minutes of measuring."""
    if not args.no_record and not getattr(args, "knobs", None):
        records.load_records(records.RESULTS_DIR)


def _show_then_record(args, tables: list[str], sections: dict, replace: bool) -> None:
    """Print the tables and write ``--json`` first, then add to the records: what was measured
    is shown and saved even if writing a record then fails."""
    print("\n\n".join(tables), flush=True)
    for name, section in sections.items():
        if args.json:
            args.json.with_suffix(f".{name}.json").write_text(json.dumps(section.as_dict(), indent=1))
    if getattr(args, "knobs", None):
        print("launch configurations are not recorded (the record holds the shipped builds)", file=sys.stderr)
        return
    for name, section in sections.items() if not args.no_record else ():
        path = records.save_section(name, section, replace=replace)
        print(f"{'recorded' if replace else 'added to'} {path}", file=sys.stderr)


def cmd_bench(args) -> int:
    from losslab import ops
    from losslab.measure.bench import bench_table_text
    from losslab.measure.ceilings import measure_ceilings
    from losslab.measure.check import check_table_text
    from losslab.measure.ncu import evidence_table_text, ncu_table_text, profile_problem

    shapes = _bench_plan(args)
    if args.sweep:
        return cmd_sweep(args)
    _require_gpu("bench")
    _require_readable_records(args)
    for name, shape in shapes.items():
        _check_memory(name, shape, args.dtypes)
    print("measuring the device's ceilings (bandwidth, FP32 FMA, MUFU, host floor) ...", file=sys.stderr, flush=True)
    ceilings = measure_ceilings()
    peers = tuple(p for p in PEERS if not (p == "compile" and args.no_compile))
    tables, sections = [], {}
    for name, shape in shapes.items():
        variants, configs = args.variants, args.knob_configs[name]
        if configs:  # each configuration beside its rung's default build (and --variants)
            variants = list(dict.fromkeys([*(args.variants or []), *(c.rung for c in configs)]))
            variants += [ops.variant(name, c.rung, knobs=dict(c.values)) for c in configs if not c.is_default]
        section = records.measure_section(name, shape, variants, peers=peers, dtypes=args.dtypes,
                                          repeats=args.repeats, check=not args.no_check, ceilings=ceilings)
        sections[name] = section
        if section.checks:
            tables.append(f"{name}: correctness\n{check_table_text(section.checks)}")
        tables.append(f"{name} on {section.device}: read {ceilings['read_gbps']:.0f} GB/s, copy "
                      f"{ceilings['copy_gbps']:.0f} GB/s, FP32 FMA {ceilings.get('fp32_fma_tflops', float('nan')):.1f} "
                      f"TFLOP/s, MUFU ex2 {ceilings.get('mufu_ex2_tops', float('nan')):.2f} Tops/s")
        for dtype in section.dtypes:
            tables.append(f"{name} {shape[0]}x{shape[1]} {dtype}\n{bench_table_text(section.select(shape, dtype))}")
    # Nsight Compute last: its replays and clock handling must not disturb the timings
    for name, section in sections.items():
        if args.ncu:
            print(f"  profiling {name} with Nsight Compute ...", file=sys.stderr, flush=True)
            section.ncu = profile_problem(problems.get(name), shapes[name], args.variants, peers)
            tables.append(f"{name}: DRAM traffic measured by ncu\n{ncu_table_text(section.ncu)}")
            if section.ncu.status == "ok":
                tables.append(f"{name}: each rung's counters (ncu, {shapes[name][0]}x{shapes[name][1]} float32)\n"
                              f"{evidence_table_text(section.ncu)}")
    if len(sections) > 1:
        tables.append(f"best variant against each peer (this run)\n{summary_text(sections)}")
    _show_then_record(args, tables, sections, replace=args.replace)
    failed = sum(not c.passed for s in sections.values() for c in s.checks)
    if failed:
        print(f"{failed} check(s) failed")
    return 1 if failed else 0


def cmd_roofline(args) -> int:
    from losslab.present.roofline import write_figures

    results_dir = args.results_dir or records.RESULTS_DIR
    device = _device("--device", args.device, results_dir)
    written = write_figures(args.problems or None, args.output, device, results_dir)
    for path in written:
        print(f"wrote {path}")
    if not written:
        print("losslab roofline: no recorded results to plot; run `python -m losslab bench <problem>` "
              "on a GPU machine first", file=sys.stderr)
    return 0 if written else 1


def cmd_report(args) -> int:
    from losslab.present.report import build_report

    device = _device("--device", args.device)
    try:
        build_report(args.output, parameters={"device": device} if device else None)
    except RuntimeError as err:  # a notebook failed: the report is written, with its error
        print(f"losslab report: {err}", file=sys.stderr)
        return 1
    return 0


def cmd_export(args) -> int:
    from losslab.kernelbench.export import export_solution

    try:
        text = export_solution(problems.get(args.problem), args.variant)
    except ValueError as err:
        raise UsageError("variant", str(err).removeprefix("variant: ")) from None
    if args.output:
        args.output.write_text(text)
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def cmd_evaluate(args) -> int:
    from losslab.kernelbench.evaluate import evaluate, solution_file

    if not args.solution.exists():
        raise UsageError("solution", f"expected an existing file or folder, got {str(args.solution)!r} (no such file)")
    if args.solution.is_dir():
        return _evaluate_folder(args)
    if args.problem is None:
        raise UsageError("--problem", "expected a problem name for an answer file (python -m losslab list)")
    if args.problems or args.html:
        raise UsageError("--problems" if args.problems else "--html", "expected a folder of answers, not one file")
    try:
        solution_file(args.solution)
    except (OSError, ValueError) as err:
        raise UsageError("solution", str(err).removeprefix("solution_path: ")) from None
    size = _shape_for(args.problem, args.size)
    _check_memory(args.problem, size, [args.dtype])
    verdict = evaluate(str(args.solution), args.problem, size=args.size if isinstance(args.size, str) else size,
                       dtype=args.dtype, trials=args.trials, repeats=args.repeats, timeout_s=args.timeout,
                       compare_compile=not args.no_compile, min_speedup=args.min_speedup)
    print(verdict.format())
    if args.json:
        args.json.write_text(json.dumps(verdict.as_dict(), indent=1))
    return 0 if verdict.passed else 1


def _evaluate_folder(args) -> int:
    """``evaluate DIR``: every answer of the folder, one table and fast_p; 0 if every answer passed."""
    from losslab.kernelbench import folder

    try:
        problem_map = folder.read_problem_map(args.problems) if args.problems else None
        found = folder.answers(args.solution, args.problem, problem_map)
    except (OSError, ValueError) as err:
        argument, _, expected = str(err).partition(": ")
        if argument in ("problems", "problem"):  # the map file, or a problem it names
            raise UsageError("--problems", expected) from None
        raise UsageError("solution", expected if argument == "folder" else str(err)) from None
    for name in sorted({name for _, name in found}):
        _check_memory(name, _shape_for(name, args.size), [args.dtype])
    report = folder.evaluate_folder(args.solution, args.problem, problem_map, jobs=args.jobs, json_path=args.json,
                                    html_path=args.html, size=args.size, dtype=args.dtype, trials=args.trials,
                                    repeats=args.repeats, timeout_s=args.timeout, compare_compile=not args.no_compile,
                                    min_speedup=args.min_speedup, progress=lambda line: print(line, file=sys.stderr))
    print(report.format())
    return 0 if all(g.verdict.passed for g in report.graded) else 1


def cmd_pitfalls(args) -> int:
    from losslab.teach import pitfalls

    for key in args.only or []:
        try:
            pitfalls.get(key)
        except ValueError as err:
            raise UsageError("--only", str(err).removeprefix("pitfall: ")) from None
    _require_gpu("pitfalls")
    if args.record:
        path, rec = pitfalls.record(args.only, args.results_dir or pitfalls.RECORDS)
        print(f"recorded {path}", file=sys.stderr)
    else:
        rec = pitfalls.measure(args.only)
    print(pitfalls.outcome_table(rec).plain)
    return 0


def cmd_grade(args) -> int:
    from losslab import build
    from losslab.teach import exercises, isolated

    if args.list:
        rows = [(e.key, e.problem, e.rung, str(e.skeleton.relative_to(build.ROOT))) for e in exercises.EXERCISES]
        widths = [max(len(row[i]) for row in rows + [("key", "problem", "rung", "file")]) for i in range(3)]
        for row in [("key", "problem", "rung", "file"), *rows]:
            print("  ".join(cell.ljust(w) for cell, w in zip(row[:3], widths, strict=True)) + "  " + row[3])
        return 0
    if args.file is None:
        raise UsageError("FILE", "expected an exercise's .cu file (python -m losslab grade --list names them)")
    try:
        exercise, solution = (exercises.get(args.exercise), False) if args.exercise else exercises.find(args.file)
        exercise_file = solution or args.file.resolve() == exercise.skeleton.resolve()
        source = None if exercise_file else args.file.read_text(errors="replace")
    except ValueError as err:
        raise UsageError("FILE" if not args.exercise else "--exercise", str(err).removeprefix("exercise: ")) from None
    except OSError as err:
        raise UsageError("FILE", f"cannot read {args.file}: {err.strerror or err}") from None
    outcome = isolated.run("losslab.teach.exercises:grade_in_child",
                           {"key": exercise.key, "source": source, "solution": solution}, args.timeout)
    head = f"{exercise.key} ({exercise.problem}, {exercise.rung} rung) {args.file}"
    if not outcome.ok:
        what = "no verdict after" if outcome.status == "timed_out" else "grading stopped:"
        reason = f"{args.timeout:g} s (killed: an endless loop?)" if outcome.status == "timed_out" else \
            outcome.message.splitlines()[0] if outcome.message else outcome.status
        print(f"{head}: RED: {what} {reason}")
        return 1
    if args.verbose:
        print("\n".join(outcome.value["lines"]))
    print(f"{head}: {outcome.value['verdict']}")
    print(f"  hint: {outcome.value['hint']}")
    return 0 if outcome.value["passed"] else 1


def _parser() -> argparse.ArgumentParser:
    """The command line's parser: one subparser per command, every value checked by its ``type``."""
    parser = _Parser(prog="losslab", description="The losslab command line.\n\n" + USAGE,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    sub.add_parser("list", help="problems, variants and sizes").set_defaults(fn=cmd_list)
    summary = sub.add_parser("summary", help="best variant of each problem against each peer, from the records")
    summary.add_argument("--device", default=None, help="the record of this device, a name or its slug "
                         "such as nvidia-h200 (default: the newest)")
    summary.add_argument("--results-dir", type=Path, default=None,
                         help="folder of the records (default: reports/results)")
    summary.add_argument("--sweep", action="store_true", help="the size sweep instead: per device, dtype and "
                         "direction, the best rung against torch.compile, Liger-Kernel and quack at each shape "
                         "(markdown, as the README shows it)")
    summary.set_defaults(fn=cmd_summary)

    def problem_args(p, nargs="+"):
        # no `choices` here: with nargs="*" Python 3.10/3.11 check the empty default against them and fail
        p.add_argument("problems", nargs=nargs, type=_problem, metavar="problem",
                       help=f"one or more of: {', '.join(problems.names())}")
        p.add_argument("--variants", type=_names, default=None,
                       help="comma-separated variants: rungs, teaching rungs ('fused [ladder]') or the public "
                            "operator ('losslab.nn') (default: all of them)")
        p.add_argument("--json", type=_output_file, help="also write the full results as JSON to this path")

    check = sub.add_parser("check", help="check variants against a float64 reference (GPU)")
    problem_args(check)
    check.add_argument("--sizes", type=_names, default=None,
                       help="comma-separated size names (default: all of the problem's sizes)")
    check.add_argument("--no-edge-cases", action="store_true")
    check.set_defaults(fn=cmd_check)

    bench = sub.add_parser("bench", help="check, time and record variants and peers (GPU)")
    problem_args(bench, nargs="*")
    bench.add_argument("--all", action="store_true", help="every problem, then a summary of the best "
                       "variant of each against the peers")
    bench.add_argument("--dtypes", type=_dtypes, default=None,
                       help=f"comma-separated input dtypes of {', '.join(records.DTYPES)} (default float32, "
                       "with --sweep float32,bfloat16; "
                       "16-bit types time only the variants that take them)")
    bench.add_argument("--size", type=_size, default=None, help=f"{SIZE_HELP} (default: seed)")
    bench.add_argument("--sweep", action="store_true",
                       help="time each problem over a range of shapes, from launch-bound to LLM-sized (--shapes), "
                       "forward and forward+backward, every rung that takes the dtype and every peer; adds to the "
                       "record")
    bench.add_argument("--shapes", type=_shapes, default=None, help="with --sweep: comma-separated ROWSxCOLUMNS "
                       "(default: each problem's measure.bench.SWEEP_SHAPES)")
    bench.add_argument("--repeats", type=_positive_int, default=20, help="timed calls per measurement")
    bench.add_argument("--no-compile", action="store_true", help="skip the torch.compile peer")
    bench.add_argument("--no-check", action="store_true", help="skip the correctness checks")
    bench.add_argument("--no-record", action="store_true", help="do not add to reports/results/")
    bench.add_argument("--knobs", type=_knob_setting, action="append", default=None, metavar="RUNG:KNOB=V[,KNOB=V]",
                       help="also time the rung in this launch configuration (its own build, checked against "
                       "float64 unless --no-check) beside its default build, e.g. vectorized:UNROLL=16; "
                       "repeatable; printed, not recorded (python -m losslab list shows each rung's knobs)")
    bench.add_argument("--replace", action="store_true", help="replace each problem's recorded section "
                       "for this device instead of adding to it (a full re-record: no older row stays)")
    bench.add_argument("--ncu", action="store_true",
                       help="also profile each kernel once with Nsight Compute: DRAM bytes, FP32 instructions and "
                       "the counters per rung (coalescing, active SMs, barriers, shuffles, stalls)")
    bench.set_defaults(fn=cmd_bench)
    _add_output_commands(sub)
    _add_solution_commands(sub)
    return parser


def _add_output_commands(sub) -> None:
    """roofline and report: what renders the records."""
    roofline = sub.add_parser("roofline", help="roofline figures (PNG) from the newest recorded results")
    roofline.add_argument("problems", nargs="*", type=_problem, metavar="problem",
                          help=f"any of: {', '.join(problems.names())} (default: all)")
    roofline.add_argument("--output", type=_output_folder, default="reports/figures", help="folder for the PNG files")
    roofline.add_argument("--device", default=None, help="plot the record of this device (a name or its slug)")
    roofline.add_argument("--results-dir", type=Path, default=None,
                          help="folder of the records (default: reports/results)")
    roofline.set_defaults(fn=cmd_roofline)

    report = sub.add_parser("report", help="execute every notebook headless into reports/")
    report.add_argument("--output", type=_output_folder, default="reports")
    report.add_argument("--device", default=None, help="render the record of this device (a name or its slug)")
    report.set_defaults(fn=cmd_report)


def _add_solution_commands(sub) -> None:
    """export, evaluate, pitfalls and grade."""
    export = sub.add_parser("export", help="write a single-file KernelBench solution (ModelNew) for a variant")
    export.add_argument("problem", type=_problem)
    export.add_argument("variant", help="a variant of the problem (python -m losslab list)")
    export.add_argument("--output", "-o", type=_output_file, default=None, help="write to this file instead of stdout")
    export.set_defaults(fn=cmd_export)

    evaluate = sub.add_parser("evaluate", help="judge a ModelNew solution file, or every .py answer of a folder, in "
                              "child processes (GPU; this RUNS the files' code)")
    evaluate.add_argument("solution", type=Path, help="a Python file defining class ModelNew, or a folder of them")
    evaluate.add_argument("--problem", type=_problem, help="the problem (required for a file; for a folder, of "
                          "every answer whose problem --problems does not give)")
    evaluate.add_argument("--problems", type=Path, help="a folder's answers: a JSON file of answer file name -> "
                          "problem (else each file's '# problem: NAME' line, PROBLEM = ..., or KernelBench's name)")
    evaluate.add_argument("--jobs", type=_positive_int, default=4, help="a folder's answers checked at once "
                          "(timing is one at a time; default: 4)")
    evaluate.add_argument("--html", type=_output_file, help="a folder: also write the table as an HTML page")
    evaluate.add_argument("--size", type=_size, default="seed", help=f"{SIZE_HELP} (default: seed)")
    evaluate.add_argument("--dtype", default="float32", choices=records.DTYPES)
    evaluate.add_argument("--trials", type=_positive_int, default=5,
                          help="correctness trials on fresh seeded inputs (default 5)")
    evaluate.add_argument("--repeats", type=_positive_int, default=20, help="timed calls per measurement (default 20)")
    evaluate.add_argument("--timeout", type=_positive_seconds, default=600.0,
                          help="seconds for the whole child, build included (default 600)")
    evaluate.add_argument("--min-speedup", type=_positive_number, default=None, help="fail as too_slow below this "
                          "speedup over eager (a positive number)")
    evaluate.add_argument("--no-compile", action="store_true", help="skip timing torch.compile")
    evaluate.add_argument("--json", type=_output_file, help="also write the verdict as JSON to this path")
    evaluate.set_defaults(fn=cmd_evaluate)

    pitfalls = sub.add_parser("pitfalls", help="run the deliberate mistakes of pitfalls/ through the checker (GPU)")
    pitfalls.add_argument("--record", action="store_true", help="write reports/results/pitfalls/<device>.json")
    pitfalls.add_argument("--only", type=_names, default=None, help="comma-separated pitfall keys")
    pitfalls.add_argument("--results-dir", type=_output_folder, default=None,
                          help="folder of the records (default: reports/results/pitfalls)")
    pitfalls.set_defaults(fn=cmd_pitfalls)

    grade = sub.add_parser("grade", help="grade an exercise's .cu file: one verdict and a hint, exit 0 when green")
    grade.add_argument("file", nargs="?", type=Path, default=None,
                       help="the exercise's file (exercises/<problem>/<key>.cu) or a copy of it")
    grade.add_argument("--list", action="store_true", help="list the exercises: key, problem, rung, file")
    grade.add_argument("--exercise", default=None, help="the exercise's key, when the file does not name it")
    grade.add_argument("--timeout", type=_positive_seconds, default=300.0,
                       help="seconds for the whole grade (compile included), then RED (default 300)")
    grade.add_argument("--verbose", "-v", action="store_true", help="also print the whole grade")
    grade.set_defaults(fn=cmd_grade)


VALUE_OPTIONS = ("--size", "--shapes", "--repeats", "--trials", "--timeout", "--min-speedup")


def _attach_dashed_values(argv: list[str]) -> list[str]:
    """``--size -1x5`` as ``--size=-1x5``: argparse would take a value starting with "-" for an
    option and answer "expected one argument" instead of checking the value."""
    out = []
    for token in argv:
        if out and out[-1] in VALUE_OPTIONS and token.startswith("-") and not token.startswith("--"):
            out[-1] = f"{out[-1]}={token}"
        else:
            out.append(token)
    return out


def _stdout_closed() -> None:
    """The reader of stdout went away (``| head -1``): send what is left to /dev/null, so that
    Python's own flush at exit finds nowhere to fail."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns its exit status. A usage mistake, an unreadable record, a closed
    stdout or Ctrl-C prints one line to stderr and returns 2 (usage), 1 (record, stdout) or 130
    (interrupted)."""
    args = _parser().parse_args(_attach_dashed_values(sys.argv[1:] if argv is None else list(argv)))
    try:
        code = args.fn(args)
        sys.stdout.flush()  # here, where a closed pipe is caught, not at exit
        return code
    except UsageError as err:
        print(f"losslab {args.command}: {err}", file=sys.stderr)
        return 2
    except records.RecordError as err:
        print(f"losslab {args.command}: {err}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        _stdout_closed()
        print(f"losslab {args.command}: the output was closed before it was all written (broken pipe)",
              file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"losslab {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
