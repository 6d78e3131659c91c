"""Grade an exercise on the CPU simulator from a shell:

    python -m losslab.teach.simulator coalesce                  # the skeleton as it is now
    python -m losslab.teach.simulator vectorize my_vectorize.cu

Prints the grade; exits 0 when it passes, 1 when it does not, 2 on bad arguments.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from losslab.teach.simulator import build, diagnose


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m losslab.teach.simulator",
                                     description="Grade an exercise's CUDA source on the CPU simulator (no GPU).")
    parser.add_argument("exercise", help=f"exercise key: {', '.join(diagnose.PROBLEM_OF)}")
    parser.add_argument("source", nargs="?", help="a .cu file (default: the exercise's skeleton)")
    args = parser.parse_args(argv)
    source = None if args.source is None else Path(args.source)  # a path, never CUDA text
    if source is not None and not source.is_file():
        what = "a folder" if source.is_dir() else "not a file (no such file)"
        print(f"error: source: {args.source} is {what}; expected a .cu file", file=sys.stderr)
        return 2
    try:
        grade = diagnose.grade_on_cpu(args.exercise, source)
    except (ValueError, build.SimulatorError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(grade)
    return 0 if grade.passed else 1


if __name__ == "__main__":
    sys.exit(main())
