#!/usr/bin/env bash
# Everything the GPU machine is for, in one call: build, the compile and gpu test
# tiers, then the benchmark that records reports/results/<device>.json.
# Full logs and the record go to $OUT (default: ./gpu-out); the short tables print last.
# BENCH_ARGS adds options to `losslab bench` (e.g. "--dtypes float32,bfloat16 --ncu").
#   usage: scripts/gpu_suite.sh [problem ...]      (default: every problem)
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/losslab-extensions}
problems=("$@")
[ ${#problems[@]} -gt 0 ] || mapfile -t problems < <(python3 -c "from losslab import problems; print(*problems.names(), sep='\n')")

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/nvidia-smi.txt"
echo "== pytest: compile and gpu tiers"
python3 -m pytest -q -rs -m "gpu or compile" -p no:cacheprovider tests > "$OUT/pytest.log" 2>&1
tests=$?
tail -n 25 "$OUT/pytest.log"
echo "== bench: ${problems[*]}"
python3 -m losslab bench "${problems[@]}" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" | grep -v "^  "
bench=${PIPESTATUS[0]}
cp reports/results/*.json "$OUT/" 2>/dev/null
echo "pytest exit $tests, bench exit $bench"
exit $(( tests || bench ))
