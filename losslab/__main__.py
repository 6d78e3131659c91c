"""The losslab command line.

    python -m losslab list                      problems, variants and sizes
    python -m losslab check kl_div              every variant against float64, edge cases
    python -m losslab bench kl_div              check, time, record under reports/results/
    python -m losslab bench kl_div --ncu        ... and measure DRAM traffic with Nsight Compute
    python -m losslab bench --all               every problem, then the best variant against each peer
    python -m losslab summary                   that summary from the newest recorded results
    python -m losslab roofline                  roofline figures (PNG) from the recorded results
    python -m losslab report                    execute the notebooks headless into reports/
    python -m losslab export kl_div vectorized  a single-file KernelBench solution (ModelNew) on stdout
    python -m losslab evaluate solution.py --problem kl_div   judge a ModelNew file (GPU; runs its code)
    python -m losslab pitfalls --record         run the deliberate mistakes (GPU), record what the checker saw

``check`` and ``bench`` need a CUDA GPU; ``list``, ``roofline`` and ``report`` run anywhere
(without a GPU the notebooks render the recorded results).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from losslab import problems


def _shape(text: str) -> tuple[int, int]:
    rows, _, cols = text.lower().partition("x")
    try:
        return int(rows), int(cols)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected ROWSxCOLUMNS such as 257x4099, got {text!r}") from None


def _resolve_shape(spec: problems.Problem, size: str) -> tuple[int, int]:
    return spec.sizes[size] if size in spec.sizes else _shape(size)


def _require_gpu(command: str) -> None:
    import torch

    if not torch.cuda.is_available():
        sys.exit(f"losslab {command}: needs a CUDA GPU and none is visible here "
                 f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'no'}). "
                 "Without a GPU, `python -m losslab report` renders the recorded results.")


def cmd_list(args) -> int:
    for name in problems.names():
        spec = problems.get(name)
        sizes = ", ".join(f"{k} {r}x{c}" for k, (r, c) in spec.sizes.items())
        print(f"{name}\n  variants: {', '.join(spec.variants)}\n  sizes: {sizes}")
    return 0


def cmd_summary(args) -> int:
    from losslab import records

    sections = {}
    for name in problems.names():
        try:
            sections[name] = records.latest_section(name, args.device)
        except LookupError as err:
            print(f"losslab summary: {err}", file=sys.stderr)
    if not sections:
        return 1
    print(summary_text(sections))
    return 0


def summary_text(sections: dict[str, dict]) -> str:
    """The summary table of recorded sections with the device and date it comes from."""
    from losslab.measure.bench import summary_table

    first = next(iter(sections.values()))
    dates = sorted(s["date"][:10] for s in sections.values())
    return (f"recorded on {first['device']} (torch {first['torch']}, CUDA {first['cuda']}), "
            f"{dates[0]}{'' if dates[0] == dates[-1] else ' to ' + dates[-1]}; "
            f"seed sizes, float32, median ms\n{summary_table(sections)}")


def cmd_check(args) -> int:
    from losslab.measure.check import check_problem, format_table

    _require_gpu("check")
    failed = 0
    for name in args.problems:
        print(f"checking {name} ...", flush=True)
        results = check_problem(name, args.variants, args.sizes or None, edge_cases=not args.no_edge_cases)
        print(format_table(results))
        failed += sum(not r.passed for r in results)
        if args.json:
            Path(args.json).write_text(json.dumps([r.as_dict() for r in results], indent=1))
    print(f"{failed} check(s) failed" if failed else "all checks passed")
    return 1 if failed else 0


def cmd_bench(args) -> int:
    from losslab import records
    import torch

    from losslab.measure.bench import PEERS, bench_problem, format_table, summary_table
    from losslab.measure.check import check_problem, format_table as format_checks
    from losslab.present.roofline import measure_ceilings

    _require_gpu("bench")
    if args.all:
        args.problems = list(problems.names())
    if not args.problems:
        sys.exit("losslab bench: name one or more problems, or --all")
    print("measuring the device's ceilings (bandwidth, FP32 FMA, MUFU) ...", file=sys.stderr, flush=True)
    ceilings = measure_ceilings()
    bandwidth = {"read": ceilings["read_gbps"], "copy": ceilings["copy_gbps"]}
    peers = tuple(p for p in PEERS if not (p == "compile" and args.no_compile))
    tables, failed, sections = [], 0, {}
    for name in args.problems:
        spec = problems.get(name)
        shape = _resolve_shape(spec, args.size)
        section = records.provenance(name)
        checks = [] if args.no_check else check_problem(name, args.variants)
        failed += sum(not c.passed for c in checks)
        rows = bench_problem(name, shape, args.variants, peers=peers, repeats=args.repeats,
                             bandwidth=bandwidth)
        # 16-bit inputs, for the variants (and peers) that take them
        rows_by_dtype = {dtype: bench_problem(name, shape, args.variants, peers=peers, repeats=args.repeats,
                                              bandwidth=bandwidth, dtype=getattr(torch, dtype))
                         for dtype in args.dtypes if dtype != "float32"
                         and any(getattr(torch, dtype) in spec.dtypes(v) for v in (args.variants or spec.variants))}
        section.update(shape=list(shape), dtype="float32", repeats=args.repeats,
                       bandwidth_gbps=bandwidth, rows=[r.as_dict() for r in rows],
                       rows_by_dtype={d: [r.as_dict() for r in rs] for d, rs in rows_by_dtype.items()},
                       checks=[c.as_dict() for c in checks], ceilings=ceilings)
        sections[name] = section
        if checks:
            tables.append(f"{name}: correctness\n{format_checks(checks)}")
        tables.append(f"{name} {shape[0]}x{shape[1]} float32 on {section['device']}: "
                      f"read {bandwidth['read']:.0f} GB/s, copy {bandwidth['copy']:.0f} GB/s, "
                      f"FP32 FMA {ceilings.get('fp32_fma_tflops', float('nan')):.1f} TFLOP/s, "
                      f"MUFU ex2 {ceilings.get('mufu_ex2_tops', float('nan')):.2f} Tops/s\n"
                      f"{format_table(rows)}")
        for dtype, extra in rows_by_dtype.items():
            tables.append(f"{name} {shape[0]}x{shape[1]} {dtype}\n{format_table(extra)}")
    # Nsight Compute last: its replays and clock handling must not disturb the timings
    for name, section in sections.items():
        if args.ncu:
            from losslab.measure.ncu import format_table as format_ncu, profile_problem

            print(f"  profiling {name} with Nsight Compute ...", file=sys.stderr, flush=True)
            section["ncu"] = profile_problem(name, tuple(section["shape"]), args.variants, peers)
            tables.append(f"{name}: DRAM traffic measured by ncu\n{format_ncu(section['ncu'])}")
        if not args.no_record:
            print(f"recorded {records.save_section(name, section)}", file=sys.stderr)
        if args.json:
            Path(args.json).with_suffix(f".{name}.json").write_text(json.dumps(section, indent=1))
    if len(sections) > 1:
        tables.append(f"best variant against each peer\n{summary_table(sections)}")
    print("\n\n".join(tables))
    if failed:
        print(f"{failed} check(s) failed")
    return 1 if failed else 0


def cmd_roofline(args) -> int:
    from losslab.present.roofline import write_figures

    for name in args.problems:
        try:
            problems.get(name)
        except ValueError as err:
            sys.exit(f"losslab roofline: {err}")
    written = write_figures(args.problems or None, args.output, args.device, args.results_dir)
    for path in written:
        print(f"wrote {path}")
    if not written:
        print("losslab roofline: no recorded results to plot; run `python -m losslab bench <problem>` "
              "on a GPU machine first", file=sys.stderr)
    return 0 if written else 1


def cmd_report(args) -> int:
    from losslab.present.report import build_report

    build_report(Path(args.output), parameters={"device": args.device} if args.device else None)
    return 0


def cmd_export(args) -> int:
    from losslab.kernelbench.export import export_solution

    try:
        text = export_solution(args.problem, args.variant)
    except ValueError as err:
        sys.exit(f"losslab export: {err}")
    if args.output:
        Path(args.output).write_text(text)
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def cmd_evaluate(args) -> int:
    from losslab.kernelbench.evaluate import evaluate

    size = args.size if args.size in problems.get(args.problem).sizes else _shape(args.size)
    verdict = evaluate(args.solution, args.problem, size=size, dtype=args.dtype, trials=args.trials,
                       repeats=args.repeats, timeout_s=args.timeout, compare_compile=not args.no_compile,
                       min_speedup=args.min_speedup)
    print(verdict.format())
    if args.json:
        Path(args.json).write_text(json.dumps(verdict.as_dict(), indent=1))
    return 0 if verdict.passed else 1


def cmd_pitfalls(args) -> int:
    from losslab.teach import pitfalls

    _require_gpu("pitfalls")
    if args.record:
        path, rec = pitfalls.record(args.only, Path(args.results_dir) if args.results_dir else pitfalls.RECORDS)
        print(f"recorded {path}", file=sys.stderr)
    else:
        rec = pitfalls.measure(args.only)
    print(pitfalls.outcome_table(rec).plain)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m losslab", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="problems, variants and sizes").set_defaults(fn=cmd_list)
    summary = sub.add_parser("summary", help="best variant of each problem against each peer, from the records")
    summary.add_argument("--device", default=None, help="the record of this device (default: the newest)")
    summary.set_defaults(fn=cmd_summary)

    def problem_args(p, nargs="+"):
        p.add_argument("problems", nargs=nargs, choices=problems.names(), metavar="problem",
                       help=f"one or more of: {', '.join(problems.names())}")
        p.add_argument("--variants", type=lambda s: s.split(","), default=None,
                       help="comma-separated variants (default: the whole ladder)")
        p.add_argument("--json", help="also write the full results as JSON to this path")

    check = sub.add_parser("check", help="check variants against a float64 reference (GPU)")
    problem_args(check)
    check.add_argument("--sizes", type=lambda s: s.split(","), default=None,
                       help="comma-separated size names (default: all of the problem's sizes)")
    check.add_argument("--no-edge-cases", action="store_true")
    check.set_defaults(fn=cmd_check)

    bench = sub.add_parser("bench", help="check, time and record variants and peers (GPU)")
    problem_args(bench, nargs="*")
    bench.add_argument("--all", action="store_true", help="every problem, then a summary of the best "
                       "variant of each against the peers")
    bench.add_argument("--dtypes", type=lambda s: s.split(","), default=["float32"],
                       help="comma-separated input dtypes (default float32; 16-bit types time only "
                       "the variants that take them)")
    bench.add_argument("--size", default="seed", help="a size name or ROWSxCOLUMNS (default: seed)")
    bench.add_argument("--repeats", type=int, default=20)
    bench.add_argument("--no-compile", action="store_true", help="skip the torch.compile peer")
    bench.add_argument("--no-check", action="store_true", help="skip the correctness checks")
    bench.add_argument("--no-record", action="store_true", help="do not write reports/results/")
    bench.add_argument("--ncu", action="store_true",
                       help="also profile each kernel once with Nsight Compute (DRAM bytes, FP32 instructions)")
    bench.set_defaults(fn=cmd_bench)

    roofline = sub.add_parser("roofline", help="roofline figures (PNG) from the newest recorded results")
    roofline.add_argument("problems", nargs="*", metavar="problem",
                          help=f"any of: {', '.join(problems.names())} (default: all)")
    roofline.add_argument("--output", default="reports/figures", help="folder for the PNG files")
    roofline.add_argument("--device", default=None, help="plot the record of this device")
    roofline.add_argument("--results-dir", default=None, help="folder of the records (default: reports/results)")
    roofline.set_defaults(fn=cmd_roofline)

    report = sub.add_parser("report", help="execute every notebook headless into reports/")
    report.add_argument("--output", default="reports")
    report.add_argument("--device", default=None, help="render the record of this device")
    report.set_defaults(fn=cmd_report)

    export = sub.add_parser("export", help="write a single-file KernelBench solution (ModelNew) for a variant")
    export.add_argument("problem", choices=problems.names())
    export.add_argument("variant", help="a variant of the problem (python -m losslab list)")
    export.add_argument("--output", "-o", default=None, help="write to this file instead of stdout")
    export.set_defaults(fn=cmd_export)

    evaluate = sub.add_parser("evaluate", help="judge a ModelNew solution file in a child process "
                              "(GPU; this RUNS the file's code)")
    evaluate.add_argument("solution", help="a Python file defining class ModelNew")
    evaluate.add_argument("--problem", required=True, choices=problems.names())
    evaluate.add_argument("--size", default="seed", help="a size name or ROWSxCOLUMNS (default: seed)")
    evaluate.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    evaluate.add_argument("--trials", type=int, default=5, help="correctness trials on fresh seeded inputs")
    evaluate.add_argument("--repeats", type=int, default=20)
    evaluate.add_argument("--timeout", type=float, default=600.0, help="seconds for the whole child, build included")
    evaluate.add_argument("--min-speedup", type=float, default=None, help="fail as too_slow below this speedup "
                          "over eager")
    evaluate.add_argument("--no-compile", action="store_true", help="skip timing torch.compile")
    evaluate.add_argument("--json", help="also write the verdict as JSON to this path")
    evaluate.set_defaults(fn=cmd_evaluate)

    pitfalls = sub.add_parser("pitfalls", help="run the deliberate mistakes of pitfalls/ through the checker (GPU)")
    pitfalls.add_argument("--record", action="store_true", help="write reports/results/pitfalls/<device>.json")
    pitfalls.add_argument("--only", type=lambda s: s.split(","), default=None, help="comma-separated pitfall keys")
    pitfalls.add_argument("--results-dir", default=None, help="folder of the records (default: reports/results/pitfalls)")
    pitfalls.set_defaults(fn=cmd_pitfalls)

    args = parser.parse_args(argv)
    if getattr(args, "variants", None):
        for name in args.problems:
            for v in args.variants:
                problems.get(name).check_variant_name(v)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
