#!/usr/bin/env bash
# Everything the GPU machine is for, in one call: build, the compile and gpu test tiers, then the
# benchmark that adds to reports/results/<device>.json (every dtype at the seed size; Nsight Compute
# last: DRAM bytes and each rung's counters, float32), the size sweep added to the same record
# (launch-bound to LLM-sized, fp32 and bf16, about 3-4 minutes on an H100), the ladder's claims
# checked against the new counters, and the pitfalls record reports/results/pitfalls/<device>.json.
# Full logs and the records go to $OUT (default: ./gpu-out); the short tables print last.
# Peers: eager, torch.compile, and Liger-Kernel and quack where they can run (quack: scripts/quack_install.sh,
# then its PYTHONPATH export); a peer that cannot run prints why once per problem and stage.
# STAGES picks stages (default "tests bench sweep claims pitfalls"), so the suite can run as several
# shorter calls on one warm machine (each stage adds to the record the earlier ones wrote).
# BENCH_ARGS replaces the bench options (default "--replace --dtypes float32,bfloat16,float16 --ncu":
# a full re-record of what the committed records hold; without --replace a run adds to the record);
# SWEEP_ARGS replaces the sweep's options (default "--dtypes float32,bfloat16");
# SWEEP=0 and PITFALLS=0 skip those stages.
#   usage: scripts/gpu_suite.sh [problem ...]      (default: every problem, then the summary)
#   e.g.   STAGES="tests" scripts/gpu_suite.sh; STAGES="bench claims" scripts/gpu_suite.sh;
#          STAGES="sweep pitfalls" scripts/gpu_suite.sh
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/losslab-extensions}
problems=("$@")
[ ${#problems[@]} -gt 0 ] || problems=(--all)
STAGES=" ${STAGES:-tests bench sweep claims pitfalls} "
[ "${SWEEP:-1}" != 0 ] || STAGES=${STAGES/ sweep / }
[ "${PITFALLS:-1}" != 0 ] || STAGES=${STAGES/ pitfalls / }
want() { [[ "$STAGES" == *" $1 "* ]]; }
tests=0 bench=0 sweep=0 claims=0 pitfalls=0
took=""  # each stage's wall time, printed last: what a lent machine's minutes went to
timed() { took+=" $1 $((SECONDS - started)) s;"; started=$SECONDS; }

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/nvidia-smi.txt"
started=$SECONDS
if want tests; then
    echo "== pytest: compile and gpu tiers"
    # -v: each test's outcome as it ends, so a run cut short by a time limit still names its failures
    python3 -m pytest -v -rs -m "gpu or compile" -p no:cacheprovider tests > "$OUT/pytest.log" 2>&1
    tests=$?
    tail -n 25 "$OUT/pytest.log"
    timed tests
fi
if want bench; then
    echo "== bench: ${problems[*]}"
    # shellcheck disable=SC2086  # BENCH_ARGS is a list of options
    python3 -m losslab bench "${problems[@]}" ${BENCH_ARGS:---replace --dtypes float32,bfloat16,float16 --ncu} 2>&1 \
        | tee "$OUT/bench.log" | grep -v "^  "
    bench=${PIPESTATUS[0]}
    timed bench
fi
if want sweep; then
    echo "== bench --sweep: ${problems[*]}"
    # shellcheck disable=SC2086  # SWEEP_ARGS is a list of options
    python3 -m losslab bench "${problems[@]}" --sweep ${SWEEP_ARGS:---dtypes float32,bfloat16} 2>&1 \
        | tee "$OUT/sweep.log" | grep -v "^  "
    sweep=${PIPESTATUS[0]}
    timed sweep
fi
if want claims; then
    echo "== the ladder's claims against the record's counters (tests/test_ladder_claims.py)"
    python3 -m pytest -q -rs -p no:cacheprovider tests/test_ladder_claims.py > "$OUT/claims.log" 2>&1
    claims=$?
    tail -n 15 "$OUT/claims.log"
    timed claims
fi
if want pitfalls; then
    echo "== pitfalls --record"
    python3 -m losslab pitfalls --record > "$OUT/pitfalls.log" 2>&1
    pitfalls=$?
    tail -n 15 "$OUT/pitfalls.log"
    timed pitfalls
fi
mkdir -p "$OUT/results/pitfalls"
cp reports/results/*.json "$OUT/results/" 2>/dev/null
cp reports/results/pitfalls/*.json "$OUT/results/pitfalls/" 2>/dev/null
python3 -m losslab summary | tee "$OUT/summary.txt"
echo "stages:$STAGES; pytest exit $tests, bench exit $bench, sweep exit $sweep, claims exit $claims, pitfalls exit $pitfalls"
echo "took:${took:- nothing}"
exit $(( tests || bench || sweep || claims || pitfalls ))
