#!/usr/bin/env bash
# smooth_l1_loss (KernelBench 96) on a GPU, in one call: the compile and gpu tiers of every test that
# names it (tests/test_smooth_l1_loss.py; the generic ladder, ops, problems, export, evaluate, compile and
# variants tests' smooth_l1_loss cases), the exported fused solution through `losslab evaluate` at the
# KernelBench size, then the bench of its rungs, teaching ladder and losslab.nn against eager and
# torch.compile (scripts/gpu_suite.sh's bench and sweep stages, which add to
# reports/results/<device>.json). Full logs, the evaluation JSON and the records go to $OUT
# (default: ./gpu-out); the short table prints last.
#   usage: scripts/smooth_l1_loss_gpu.sh
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/losslab-extensions}

echo "== pytest: compile and gpu tiers, smooth_l1_loss"
python3 -m pytest -v -rs -m "gpu or compile" -k smooth_l1_loss -p no:cacheprovider tests/test_smooth_l1_loss.py \
    tests/test_ladder.py tests/test_ops.py tests/test_problems.py tests/test_export.py tests/test_evaluate.py \
    tests/test_compile.py tests/test_variants_gpu.py > "$OUT/smooth_l1_loss_pytest.log" 2>&1
tests=$?
tail -n 25 "$OUT/smooth_l1_loss_pytest.log"

echo "== losslab export smooth_l1_loss fused, then losslab evaluate at the KernelBench size"
python3 -m losslab export smooth_l1_loss fused --output "$OUT/smooth_l1_loss_fused.py" \
    && python3 -m losslab evaluate "$OUT/smooth_l1_loss_fused.py" --problem smooth_l1_loss --json "$OUT/smooth_l1_loss_evaluate.json" \
    > "$OUT/smooth_l1_loss_evaluate.log" 2>&1
evaluate=$?
tail -n 12 "$OUT/smooth_l1_loss_evaluate.log"

echo "== bench and sweep (scripts/gpu_suite.sh)"
STAGES="bench sweep" OUT="$OUT" bash scripts/gpu_suite.sh smooth_l1_loss > "$OUT/smooth_l1_loss_suite.log" 2>&1
suite=$?
grep -v "^  " "$OUT/smooth_l1_loss_suite.log" | tail -n 40
echo "pytest exit $tests, evaluate exit $evaluate, bench+sweep exit $suite"
exit $(( tests || evaluate || suite ))
