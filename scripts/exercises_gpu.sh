#!/usr/bin/env bash
# The exercises on a GPU, in one call: the compile and gpu tiers of tests/test_exercises.py and
# tests/test_simulator.py (sm_90's SASS, one verdict with the simulator, the cluster exercise), then
# every exercise's solution, skeleton and wrong answer (tests/simulator_cases/) graded as a participant
# would: $OUT/exercises_gpu.json holds each grade (verdict, hint, GPU checks, simulator), and a short
# table prints last (expected: solutions GREEN, every skeleton and wrong answer RED with its hint).
# Full logs go to $OUT (default: ./gpu-out).
#   usage: scripts/exercises_gpu.sh
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/losslab-extensions}

{ nvidia-smi --query-gpu=name,driver_version --format=csv; nvcc --version | tail -1
  echo 'int main() { return 0; }' | g++ -x c++ -fsanitize=address,undefined -o /dev/null - \
      && echo "g++ with sanitizers: the CPU simulator runs here" || echo "no g++ with sanitizers: no CPU simulator"
} 2>&1 | tee "$OUT/machine.txt"

echo "== pytest: compile and gpu tiers of the exercises and the simulator"
python3 -m pytest -v -rs -m "gpu or compile" -p no:cacheprovider tests/test_exercises.py tests/test_simulator.py \
    --junitxml="$OUT/exercises-junit.xml" > "$OUT/pytest.log" 2>&1
tests=$?
tail -n 25 "$OUT/pytest.log"

echo "== every solution, skeleton and wrong answer, graded"
python3 - "$OUT/exercises_gpu.json" <<'PY'
import json
import sys
import time

from losslab import build
from losslab.teach import exercises

keys = sorted((e.key for e in exercises.EXERCISES), key=len, reverse=True)
files = [(e.key, e.solution, True) for e in exercises.EXERCISES] + [(e.key, e.skeleton, False)
                                                                       for e in exercises.EXERCISES]
for path in sorted((build.ROOT / "tests" / "simulator_cases").glob("*.cu")):
    key = next((k for k in keys if path.stem.startswith(k + "_")), None)
    if key and "endless" not in path.stem:  # an endless loop: its time limit is tested on its own
        files.append((key, path, path.stem == "warp_shuffle_down"))  # a shift down: a right answer
rows = []
for key, path, should_pass in files:
    start = time.perf_counter()
    g = exercises.grade(key, path.read_text())
    checks = g.checks or []
    rows.append({"key": key, "file": str(path.relative_to(build.ROOT)), "should_pass": should_pass,
                 "passed": g.passed, "verdict": g.verdict, "hint": g.hint, "on_gpu": g.on_gpu,
                 "gpu_checks_passed": sum(c.passed for c in checks), "gpu_checks": len(checks),
                 "gpu_fault": g.fault.splitlines()[0] if g.fault else "", "simulated": g.simulated,
                 "sass": g.sass, "seconds": round(time.perf_counter() - start, 1), "lines": g.lines()})
json.dump(rows, open(sys.argv[1], "w"), indent=1)
wrong = [r for r in rows if r["passed"] != r["should_pass"]]
print(f"{'file':62} {'GPU checks':>10}  verdict: hint")
for r in rows:
    gpu = f"{r['gpu_checks_passed']}/{r['gpu_checks']}" if r["gpu_checks"] else (r["gpu_fault"][:10] or "-")
    print(f"{r['file'][-62:]:62} {gpu:>10}  {r['verdict'].split(':')[0]}: {r['hint'][:90]}")
print(f"{len(rows) - len(wrong)} of {len(rows)} graded as expected"
      + "".join(f"\n  UNEXPECTED: {r['file']} {r['verdict']}" for r in wrong))
sys.exit(1 if wrong else 0)
PY
graded=$?
echo "pytest exit $tests, grades exit $graded (0: as expected); details: $OUT/exercises_gpu.json, $OUT/pytest.log"
exit $(( tests || graded ))
