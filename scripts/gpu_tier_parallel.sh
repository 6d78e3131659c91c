#!/usr/bin/env bash
# The gpu tier of the tests on several GPUs of one machine at once: each argument is a group of test
# files (comma-separated) that runs on its own GPU with its own extension build folder, so a
# four-GPU machine runs the tier in about a quarter of the time. TIER_TIMEOUT (seconds, default
# 540) interrupts a group as Ctrl-C would: pytest still prints what ran and writes its JUnit XML.
# FIRST_GPU (default 0) leaves the GPUs below it to other work: group i runs on GPU FIRST_GPU + i.
# A group may carry pytest's options, comma-separated like its files: "-n,16,tests/test_exercises.py"
# grades the exercises in 16 processes (their time is nvcc's: 83 tests took 40 s each one at a time,
# 196 s in all so on a 4 x H200 host); keep timing tests (test_ops, test_ladder) in one process.
# Logs and XML: $OUT/tier<i>.log, $OUT/tier<i>.xml; each group's last lines print at the end.
#   usage: scripts/gpu_tier_parallel.sh GROUP [GROUP ...]
#   e.g.   scripts/gpu_tier_parallel.sh tests/test_nn.py tests/test_ops.py,tests/test_ladder.py
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
groups=("$@")
gpus=$(nvidia-smi -L 2>/dev/null | grep -c "^GPU")
if [ "$gpus" -eq 0 ]; then
    echo "gpu_tier_parallel: no GPU visible here (nvidia-smi -L lists none)" >&2
    exit 2
fi
first=${FIRST_GPU:-0}
if ! [[ "$first" =~ ^[0-9]+$ ]] || [ "$first" -ge "$gpus" ]; then
    echo "gpu_tier_parallel: FIRST_GPU: expected a GPU index from 0 to $((gpus - 1)), got '$first'" >&2
    exit 2
fi
if [ ${#groups[@]} -eq 0 ] || [ ${#groups[@]} -gt $((gpus - first)) ]; then
    echo "gpu_tier_parallel: GROUP: expected 1 to $((gpus - first)) groups (one per GPU), got ${#groups[@]}" >&2
    exit 2
fi
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
pids=()
for i in "${!groups[@]}"; do
    # shellcheck disable=SC2086  # the group's files are a list
    CUDA_VISIBLE_DEVICES=$((first + i)) TORCH_EXTENSIONS_DIR=/tmp/tier-ext$i timeout -s INT "${TIER_TIMEOUT:-540}" \
        python3 -m pytest -q -rfE -m gpu -p no:cacheprovider --junitxml="$OUT/tier$i.xml" ${groups[$i]//,/ } \
        > "$OUT/tier$i.log" 2>&1 &
    pids+=($!)
done
status=0
for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || status=1
    echo "== GPU $((first + i)): ${groups[$i]//,/ }"
    grep -E "^(FAILED|ERROR)|passed|failed|KeyboardInterrupt" "$OUT/tier$i.log" | tail -n 15
done
exit $status
