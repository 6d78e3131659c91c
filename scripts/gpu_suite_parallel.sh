#!/usr/bin/env bash
# scripts/gpu_suite.sh on several GPUs of one machine at once, so a multi-GPU machine records every
# problem in the time of the slowest: each argument is a group of problems (comma-separated) that
# runs on its own GPU, in its own copy of the repository (its own record file and build folder):
# gpu_suite.sh's STAGES (default "bench sweep") one problem after the other, each followed by its
# fused rung exported as a KernelBench answer and graded by losslab evaluate (EVALUATE=0 skips
# it), then the gpu tier of the tests that name the group's problems (TESTS=0 skips it).
# WORKER_TIMEOUT (seconds, default 540) stops a group where it is: a problem whose stages ended is
# whole. No group times while another compiles: each first builds its problems' kernels and teaching
# ladders (ninja at this machine's cores / GPUs jobs), then waits until every group has, since a
# sibling's nvcc on all cores slowed the host-bound cells of a record by up to 3x; torch.compile's
# workers and OpenMP get the same share of the cores. Then each group's sections are gathered into
# reports/results/<device>.json (replacing those problems' sections, keeping the others'), the
# ladder's claims are checked on the gathered record, and the summary prints last.
# Logs: $OUT/gpu<i>.log (each group's; the suite's own under /tmp/losslab-gpu<i>-out/); the gathered
# records: $OUT/results/ (a few files, so that all of $OUT comes back from a lent machine); each
# group's record as it stood after each of its problems: $OUT/results/gpu<i>/ (a call cut off before
# the gathering still brings back the problems it finished: save their sections with
# losslab.records.save_section).
#   usage: scripts/gpu_suite_parallel.sh GROUP [GROUP ...]
#   e.g.   scripts/gpu_suite_parallel.sh cross_entropy kl_div hinge_loss,mse_loss
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
groups=("$@")
gpus=$(nvidia-smi -L 2>/dev/null | grep -c "^GPU")
if [ "$gpus" -eq 0 ]; then
    echo "gpu_suite_parallel: no GPU visible here (nvidia-smi -L lists none)" >&2
    exit 2
fi
if [ ${#groups[@]} -eq 0 ] || [ ${#groups[@]} -gt "$gpus" ]; then
    echo "gpu_suite_parallel: GROUP: expected 1 to $gpus groups (one per GPU), got ${#groups[@]}" >&2
    exit 2
fi
mkdir -p "$OUT/results"
root=$PWD
barrier() {  # barrier NAME: this group has reached NAME; wait until every group has
    touch "/tmp/losslab-$1$i"
    while [ "$(find /tmp -maxdepth 1 -name "losslab-$1*" | wc -l)" -lt "$GROUPS_N" ]; do sleep 2; done
}
worker() {  # worker GPU "problem ..."
    local i=$1 names=$2
    cd "/tmp/losslab-gpu$i" || exit 1
    export CUDA_VISIBLE_DEVICES=$i PYTHONPATH=/tmp/losslab-gpu$i${PYTHONPATH:+:$PYTHONPATH} TORCH_EXTENSIONS_DIR=/tmp/ext$i
    python3 -c "import sys; from losslab.build import extension, ladder
for name in sys.argv[1:]: extension.load_extension(name); ladder.load_ladder(name)" $names
    barrier built  # built or failed (the suite then says why): the others may start
    for name in $names; do  # the suite's own logs stay on the machine: only $OUT/gpu<i>.log comes back
        STAGES=${STAGES:-bench sweep} OUT="/tmp/losslab-gpu$i-out/$name" bash scripts/gpu_suite.sh "$name"
        # the group's record so far comes back even if the caller's time limit cuts this call off
        mkdir -p "$OUT/results/gpu$i" && cp reports/results/*.json "$OUT/results/gpu$i/"
        if [ "${EVALUATE:-1}" != 0 ]; then  # the fused rung as a KernelBench answer, graded at KernelBench's size
            python3 -m losslab export "$name" fused -o "/tmp/losslab-gpu$i-out/$name/answer_fused.py" \
                && python3 -m losslab evaluate "/tmp/losslab-gpu$i-out/$name/answer_fused.py" --problem "$name" 2>&1 \
                | tail -n 8
        fi
    done
    barrier timed  # the tests compile on all their cores: not while a sibling times
    if [ "${TESTS:-1}" != 0 ]; then
        echo "== pytest -m gpu -k '${names// / or }'"
        python3 -m pytest -q -rs -m gpu -p no:cacheprovider -k "${names// / or }" tests 2>&1 | tail -n 30
    fi
}
export -f barrier worker
GROUPS_N=${#groups[@]} MAX_JOBS=$(( $(nproc) / ${#groups[@]} > 1 ? $(nproc) / ${#groups[@]} : 1 ))
# each group's share of the cores for what still compiles while siblings time: torch.compile's peers
TORCHINDUCTOR_COMPILE_THREADS=$MAX_JOBS OMP_NUM_THREADS=$MAX_JOBS
export OUT TESTS STAGES EVALUATE GROUPS_N MAX_JOBS TORCHINDUCTOR_COMPILE_THREADS OMP_NUM_THREADS
rm -f /tmp/losslab-built* /tmp/losslab-timed*
pids=()
for i in "${!groups[@]}"; do
    rm -rf "/tmp/losslab-gpu$i" "/tmp/losslab-gpu$i-out" && cp -a "$root" "/tmp/losslab-gpu$i"
    timeout "${WORKER_TIMEOUT:-540}" bash -c "worker $i '${groups[$i]//,/ }'" > "$OUT/gpu$i.log" 2>&1 &
    pids+=($!)
    echo "GPU $i: ${groups[$i]//,/ } (log: $OUT/gpu$i.log)"
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done

echo "== gathering each group's sections into reports/results/"
python3 - "${groups[@]}" <<'PY'
import sys
from pathlib import Path

import torch

from losslab import records
from losslab.records import files

here = files.device_slug(torch.cuda.get_device_name(0))  # this machine's record only
for i, group in enumerate(sys.argv[1:]):
    for record in files.load_records(Path(f"/tmp/losslab-gpu{i}/reports/results")):
        for problem in group.split(","):
            if files.device_slug(record.device) == here and problem in record.sections:
                path = records.save_section(problem, record.sections[problem], replace=True)
                print(f"{problem} ({record.device}) from GPU {i} -> {path}")
PY
python3 -m pytest -q -rs -p no:cacheprovider tests/test_ladder_claims.py > "$OUT/claims.log" 2>&1 || status=1
tail -n 5 "$OUT/claims.log"
cp reports/results/*.json "$OUT/results/"  # the records of every device, this one's gathered
for i in "${!groups[@]}"; do echo "== GPU $i: ${groups[$i]}"; grep -E "passed|failed|error|exit" "$OUT/gpu$i.log" | tail -n 4; done
python3 -m losslab summary
exit $status
