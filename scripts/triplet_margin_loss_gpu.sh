#!/usr/bin/env bash
# triplet_margin_loss (KernelBench level 1, problem 99) on the GPU machine in one call: the compile and gpu
# tiers of its tests (tests/test_triplet_margin_loss.py, and the generic modules' cases for it: ladder, ops,
# problems, variants, export, evaluate, knobs, nn), losslab evaluate on its exported fused solution, then
# gpu_suite.sh's bench, sweep and claims stages for it (its section of reports/results/<device>.json).
# Logs, the evaluation's JSON and the records go to $OUT (default ./gpu-out); the summary prints last.
#   usage: scripts/triplet_margin_loss_gpu.sh
#   TESTS=0 skips the tests; STAGES is gpu_suite.sh's (default here "bench sweep claims")
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/losslab-extensions}
problem=triplet_margin_loss

tests=0
if [ "${TESTS:-1}" != 0 ]; then
    echo "== pytest: compile and gpu tiers for $problem"
    python3 -m pytest -v -rs -m "gpu or compile" -p no:cacheprovider tests/test_triplet_margin_loss.py \
        > "$OUT/pytest-own.log" 2>&1
    own=$?
    python3 -m pytest -v -rs -m "gpu or compile" -p no:cacheprovider -k "$problem" tests/test_ladder.py \
        tests/test_ops.py tests/test_problems.py tests/test_variants_gpu.py tests/test_export.py \
        tests/test_evaluate.py tests/test_knobs.py tests/test_compile.py tests/test_nn.py \
        > "$OUT/pytest-generic.log" 2>&1
    generic=$?
    tests=$(( own || generic ))
    grep -hE "FAILED|ERROR|passed|failed" "$OUT/pytest-own.log" "$OUT/pytest-generic.log" | tail -n 30
fi

echo "== losslab export $problem fused, then losslab evaluate (KernelBench's size)"
python3 -m losslab export "$problem" fused --output "$OUT/${problem}_fused.py" \
    && python3 -m losslab evaluate "$OUT/${problem}_fused.py" --problem "$problem" --json "$OUT/evaluate.json" \
        2>&1 | tee "$OUT/evaluate.log"
evaluate=${PIPESTATUS[0]}

STAGES=${STAGES:-bench sweep claims} PITFALLS=0 OUT="$OUT" bash scripts/gpu_suite.sh "$problem"
suite=$?
echo "tests exit $tests, evaluate exit $evaluate, gpu_suite exit $suite"
exit $(( tests || evaluate || suite ))
