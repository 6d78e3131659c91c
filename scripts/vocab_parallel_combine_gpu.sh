#!/usr/bin/env bash
# losslab_distributed::combine on one GPU, in one call (about a minute warm): the compile and gpu
# tiers of tests/test_vocab_parallel_combine.py (the CUDA kernel against the CPU operator in
# float64), then the kernel timed against the plain-torch algebra it replaces (algebra.combine,
# row_losses, reduce's weight) at N 8192, W 2 and 8, label smoothing 0.1: GPU ms per call (L2
# flushed, and back to back) and host us per call. JSON and logs go to $OUT (default ./gpu-out);
# the table prints last.
#   usage: scripts/vocab_parallel_combine_gpu.sh        e.g. OUT=/tmp/out scripts/vocab_parallel_combine_gpu.sh
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/losslab-extensions}
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$OUT/nvidia-smi.txt"

echo "== pytest: compile and gpu tiers of tests/test_vocab_parallel_combine.py"
python3 -c "from losslab.distributed import kernels; kernels.extension()" > "$OUT/build.log" 2>&1 \
    || { tail -n 20 "$OUT/build.log"; exit 1; }
python3 -m pytest -v -rs -m "gpu or compile" -p no:cacheprovider tests/test_vocab_parallel_combine.py \
    > "$OUT/pytest.log" 2>&1
tests=$?
tail -n 15 "$OUT/pytest.log"
echo "tests rc=$tests (logs and JSON in $OUT)"

echo "== timing: the combine kernel against the torch algebra"
python3 - "$OUT/combine.json" <<'PY'
import json, sys
import torch
from losslab.distributed import algebra, kernels
from losslab.measure import timing

VOCAB, N, IGNORE, EPS = 128256, 8192, -100, 0.1

def torch_algebra(gathered, target):
    combined = algebra.combine(gathered)
    losses = algebra.row_losses(combined, target, VOCAB, IGNORE, EPS)
    weight = algebra.reduce(losses, target, IGNORE, "sum")[1]
    return torch.stack([combined.row_max, combined.row_log_sum, losses, weight])

rows, flush = [], timing.flush_buffer()
for world in (2, 8):
    gathered = torch.stack([torch.randn(world, N) * 4, 1 + torch.rand(world, N) * 1000,
                            torch.randn(world, N), torch.randn(world, N) * 1000], -1).cuda()
    target = torch.randint(0, VOCAB, (N,), device="cuda")
    for name, fn in (("combine kernel", lambda: kernels.combine(gathered, target, VOCAB, IGNORE, EPS)),
                     ("torch algebra", lambda: torch_algebra(gathered, target))):
        t = timing.time_cuda(fn, repeats=100, flush=flush)
        rows.append({"op": name, "world": world, "N": N, "gpu_ms": t.median_ms, "back_to_back_ms": t.back_to_back_ms,
                     "host_us": timing.single_call_host_us(fn, 200)})
device = torch.cuda.get_device_name()
json.dump({"device": device, "torch": torch.__version__, "rows": rows}, open(sys.argv[1], "w"), indent=1)
print(device)
print(f"{'op':<16}{'W':>3}{'N':>6}{'GPU ms':>10}{'b2b ms':>10}{'host us':>10}")
for r in rows:
    print(f"{r['op']:<16}{r['world']:>3}{r['N']:>6}{r['gpu_ms']:>10.4f}{r['back_to_back_ms']:>10.4f}{r['host_us']:>10.1f}")
PY
bench=$?
[ "$tests" = 0 ] && [ "$bench" = 0 ]
