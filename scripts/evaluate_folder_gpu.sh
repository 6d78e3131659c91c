#!/usr/bin/env bash
# `losslab evaluate DIR` on a GPU, in one call: the gpu and compile tiers of tests/test_folder.py,
# tests/test_evaluate.py and tests/test_child.py (the evaluator after its split into evaluate/parent,
# child/clocks/failures), then a folder of mixed answers graded from the command line: exported rungs
# of both losses (honest), every answer of tests/solutions/ (cheats, named kl_div by a '# problem:'
# line), a segfault and a device-side assert. $OUT/grades.json and $OUT/grades.html hold the report;
# the table and fast_p print last (expected: the exported rungs passed with a speedup and a % of the
# speed of light, each cheat its verdict as in tests/test_evaluate.py, the two crashes crashed).
#   usage: scripts/evaluate_folder_gpu.sh [tests|folder]   (default: both; each part takes a few minutes)
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
part=${1:-both}

nvidia-smi --query-gpu=name,driver_version --format=csv 2>&1 | tee "$OUT/machine.txt"
tests=0
if [ "$part" != folder ]; then
    echo "== pytest: gpu and compile tiers of the folder, the evaluator and its child"
    python3 -m pytest -v -rs -m "gpu or compile" -p no:cacheprovider tests/test_folder.py tests/test_evaluate.py \
        tests/test_child.py --junitxml="$OUT/evaluate-junit.xml" > "$OUT/pytest.log" 2>&1
    tests=$?
    tail -n 30 "$OUT/pytest.log"
fi
graded=0
if [ "$part" != tests ]; then
    answers=$(mktemp -d)
    for problem in kl_div cross_entropy; do
        for rung in naive vectorized; do
            python3 -m losslab export "$problem" "$rung" -o "$answers/${problem}_$rung.py"
        done
    done
    for path in tests/solutions/*.py; do
        { echo "# problem: kl_div"; cat "$path"; } > "$answers/cheat_$(basename "$path")"
    done
    printf '# problem: kl_div\nimport os, signal, torch.nn as nn\n\nclass ModelNew(nn.Module):\n    def forward(self, p, t):\n        os.kill(os.getpid(), signal.SIGSEGV)\n' \
        > "$answers/crash_segfault.py"
    printf '# problem: kl_div\nimport torch, torch.nn as nn\n\nclass ModelNew(nn.Module):\n    def forward(self, p, t):\n        return p.flatten()[torch.full((1,), 2**40, device=p.device)].sum()\n' \
        > "$answers/crash_device_assert.py"
    echo "== python -m losslab evaluate $(ls "$answers" | wc -l) answers --jobs 4 (checks in parallel, timing one at a time)"
    start=$(date +%s)
    python3 -m losslab evaluate "$answers" --jobs 4 --trials 2 --repeats 10 --no-compile --timeout 300 \
        --json "$OUT/grades.json" --html "$OUT/grades.html" > "$OUT/grades.txt" 2> "$OUT/grades.err"
    graded=$?
    echo "exit $graded in $(( $(date +%s) - start )) s (1: some answer did not pass, as expected; 2: bad input)"
    tail -n 5 "$OUT/grades.err"
    cat "$OUT/grades.txt"
    rm -rf "$answers"
fi
echo "pytest exit $tests, evaluate exit $graded; details: $OUT/pytest.log, $OUT/grades.json, $OUT/grades.html"
exit $(( tests || graded > 1 ))
