#!/usr/bin/env bash
# hinge_loss (KernelBench level 1, problem 100) on a GPU machine, in one call: the compile and gpu
# tiers of every test that names it (the teaching ladder against float64 and rung over rung, the
# operators, losslab.nn.functional.hinge_loss in every reduction, dtype and target layout, opcheck,
# torch.compile and CUDA graphs, export and evaluate), then its records through scripts/gpu_suite.sh
# (bench in every dtype with Nsight Compute, the sweep from 128 rows to 32768 x 32768 and 2048 x
# 131072, the ladder's claims). Logs and the records go to $OUT (default ./gpu-out); the short
# tables print last.
#   usage: OUT=/tmp/out bash scripts/hinge_loss_gpu.sh
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/losslab-extensions}

echo "== pytest: compile and gpu tiers, hinge_loss"
python3 -m pytest -v -rsP -m "gpu or compile" -p no:cacheprovider -k hinge_loss tests > "$OUT/hinge_loss_pytest.log" 2>&1
tests=$?
grep -E "^(FAILED|ERROR)" "$OUT/hinge_loss_pytest.log" | head -n 40
grep -A7 "hinge_loss ladder at 32768x32768" "$OUT/hinge_loss_pytest.log" | head -n 8  # the ladder's times, rung over rung
tail -n 3 "$OUT/hinge_loss_pytest.log"

STAGES=${STAGES:-bench sweep claims} OUT="$OUT" bash scripts/gpu_suite.sh hinge_loss
suite=$?
echo "hinge_loss: pytest exit $tests, gpu_suite exit $suite (logs and records under $OUT)"
exit $(( tests || suite ))
