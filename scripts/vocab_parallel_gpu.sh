#!/usr/bin/env bash
# The vocabulary-parallel cross-entropy on a GPU machine, in one call (under 5 minutes warm): the
# compile and gpu tiers of tests/test_distributed.py (the kernels against float64, a CUDA graph,
# NCCL over two GPUs when two are visible), then the benchmark under torchrun on NPROC GPUs
# (default 2, the goal; at least 2 must be visible): N 8192, V 128256 and 256000, bfloat16,
# forward+backward, against Megatron-style, loss_parallel() and the single-GPU floor, with the
# collectives' latency and bandwidth and the copy bandwidth its goal is computed from; and the
# linear loss at the Llama-3-8B and Gemma-2-2B heads against the logits slice made whole and the
# three GEMMs alone. Logs and JSON
# go to $OUT (default ./gpu-out); RECORD=1 also writes
# reports/results/vocab_parallel/<device>-x<world>.json. The benchmark's table prints last.
#   usage: scripts/vocab_parallel_gpu.sh        e.g. RECORD=1 OUT=/tmp/out scripts/vocab_parallel_gpu.sh
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/losslab-extensions}
export NCCL_NVLS_ENABLE=0  # NVLink multicast (NVLS) off
gpus=$(python3 -c "import torch; print(torch.cuda.device_count())")
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$OUT/nvidia-smi.txt"

echo "== pytest: compile and gpu tiers of tests/test_distributed.py and tests/test_vocab_parallel_combine.py"
python3 -c "from losslab.distributed import kernels; kernels.extension()" > "$OUT/build.log" 2>&1 \
    || { tail -n 20 "$OUT/build.log"; exit 1; }  # built once here, before the tests and torchrun's ranks
python3 -m pytest -v -rs -m "gpu or compile" -p no:cacheprovider tests/test_distributed.py \
    tests/test_vocab_parallel_combine.py > "$OUT/pytest.log" 2>&1
tests=$?
tail -n 15 "$OUT/pytest.log"

bench=2
nproc=${NPROC:-2}
if [ "$gpus" -ge "$nproc" ] && [ "$nproc" -ge 2 ]; then
    echo "== torchrun --nproc-per-node=$nproc -m losslab.distributed.bench"
    record=(); [ "${RECORD:-0}" = 1 ] && record=(--record)
    # torchrun of this python (python -m torch.distributed.run is torchrun)
    timeout 300 python3 -m torch.distributed.run --nproc-per-node="$nproc" -m losslab.distributed.bench \
        --json "$OUT/vocab_parallel.json" "${record[@]}" > "$OUT/bench.log" 2>&1
    bench=$?
    [ "${RECORD:-0}" = 1 ] && cp reports/results/vocab_parallel/*.json "$OUT/" 2>/dev/null
    [ "$bench" = 0 ] || tail -n 30 "$OUT/bench.log"
else
    echo "== bench skipped: it needs $nproc GPUs (at least 2), $gpus visible"
fi
echo "tests rc=$tests bench rc=$bench (logs and JSON in $OUT)"
if [ -f "$OUT/vocab_parallel.json" ]; then  # the table last, from the JSON rank 0 wrote
    python3 -c "import json, sys; from losslab.distributed import record
print(record.table(json.load(open(sys.argv[1]))))" "$OUT/vocab_parallel.json"
fi
[ "$tests" = 0 ] && [ "$bench" = 0 ]
