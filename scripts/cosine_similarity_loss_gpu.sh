#!/usr/bin/env bash
# cosine_similarity_loss on a GPU, in one call: its compile and gpu tiers (tests/test_cosine_similarity_loss.py
# and every generic test's cosine_similarity_loss cases: the ladder, the rungs, the operators, export and
# evaluate), then the benchmark that adds it to reports/results/<device>.json (every dtype at the seed size,
# 32768 x 8192, then the sweep from 128 rows, float32 and bfloat16), and the exported fused solution graded
# by losslab evaluate. The records and full logs go to $OUT (default ./gpu-out). It prints the failing
# tests, the bench's tables at the seed size (the rungs, the teaching rungs, losslab.nn and the peers, with
# "of bw": the cost model's bytes / time against the bandwidth measured in the same process; the issue asks
# >= 90 % for losslab.nn, forward and forward_backward, and no slower than torch.compile) and the verdict.
#   usage: scripts/cosine_similarity_loss_gpu.sh [tests|bench]   (default: both)
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT/results"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/losslab-extensions}
part=${1:-both}
problem=cosine_similarity_loss

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv 2>&1 | tee "$OUT/nvidia-smi.txt"
tests=0 bench=0 sweep=0 evaluate=0
if [ "$part" != bench ]; then
    echo "== pytest: compile and gpu tiers, $problem"
    python3 -m pytest -v -rs -m "gpu or compile" -p no:cacheprovider -k "$problem" tests \
        --junitxml="$OUT/junit.xml" > "$OUT/pytest.log" 2>&1
    tests=$?
    grep -E "^(FAILED|ERROR)" "$OUT/pytest.log" | head -n 40
    tail -n 3 "$OUT/pytest.log"
fi
if [ "$part" != tests ]; then
    echo "== bench $problem: float32, bfloat16, float16 at the seed size"
    python3 -m losslab bench "$problem" --dtypes float32,bfloat16,float16 --json "$OUT/bench.json" > "$OUT/bench.log" 2>&1
    bench=$?
    echo "== bench $problem --sweep: float32, bfloat16"
    python3 -m losslab bench "$problem" --sweep --dtypes float32,bfloat16 --json "$OUT/sweep.json" > "$OUT/sweep.log" 2>&1
    sweep=$?
    cp reports/results/*.json "$OUT/results/" 2>/dev/null
    echo "== export $problem fused, then losslab evaluate it (KernelBench's problem 97 at 32768 x 8192)"
    python3 -m losslab export "$problem" fused -o "$OUT/solution_fused.py" &&
        python3 -m losslab evaluate "$OUT/solution_fused.py" --problem "$problem" > "$OUT/evaluate.txt" 2>&1
    evaluate=$?
    tail -n 12 "$OUT/evaluate.txt"
    grep -v "^  " "$OUT/bench.log" | tail -n 60
fi
echo "pytest exit $tests, bench exit $bench, sweep exit $sweep, evaluate exit $evaluate; logs: $OUT/pytest.log," \
    "$OUT/bench.log, $OUT/sweep.log, $OUT/evaluate.txt"
exit $(( tests || bench || sweep || evaluate ))
