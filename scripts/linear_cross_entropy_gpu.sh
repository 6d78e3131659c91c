#!/usr/bin/env bash
# The linear cross-entropy on the GPU machine in one call (issue 30): the carried peer wheels
# (Liger-Kernel, cut-cross-entropy: pure Python, installed without their dependencies into
# /tmp/site), the compile and gpu tiers of tests/test_linear_cross_entropy.py (which build the
# kernel), then the benchmark with --record: reports/results/linear_cross_entropy/<device>.json.
# Logs and the record go to $OUT (default ./gpu-out); the table and the goal lines print last.
#   usage: scripts/linear_cross_entropy_gpu.sh
#   WHEELS=<folder of the .whl files> (default .whl); TESTS=0 skips the tests; BENCH_ARGS replaces the
#   bench's options (default "--record"), e.g. BENCH_ARGS="--heads llama-3-8b,gemma-2-2b --record"
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
WHEELS=${WHEELS:-.whl}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/losslab-extensions}
wheels=("$WHEELS"/liger_kernel-*.whl "$WHEELS"/cut_cross_entropy-*.whl)
if ls "${wheels[@]}" > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        "${wheels[@]}" || exit
    export PYTHONPATH=/tmp/site
else
    echo "no Liger-Kernel / cut-cross-entropy wheels in $WHEELS: those peers print why they are not measured"
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/nvidia-smi.txt"

tests=0
if [ "${TESTS:-1}" != 0 ]; then
    echo "== pytest: compile and gpu tiers of tests/test_linear_cross_entropy.py"
    python3 -m pytest -v -rs -m "gpu or compile" -p no:cacheprovider tests/test_linear_cross_entropy.py \
        > "$OUT/pytest.log" 2>&1
    tests=$?
    grep -E "FAILED|ERROR|passed|failed" "$OUT/pytest.log" | tail -n 20
fi

bench_args=${BENCH_ARGS:---record}
echo "== python -m losslab.linear_cross_entropy.bench $bench_args (progress: $OUT/bench-progress.log)"
# shellcheck disable=SC2086  # bench_args is a list of options
python3 -m losslab.linear_cross_entropy.bench $bench_args 2> "$OUT/bench-progress.log" | tee "$OUT/bench.log"
bench=${PIPESTATUS[0]}
cp reports/results/linear_cross_entropy/*.json "$OUT/" 2> /dev/null
[ "$tests" -eq 0 ] && [ "$bench" -eq 0 ]
