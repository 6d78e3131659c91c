#!/usr/bin/env bash
# The wheel on the GPU machine (issue 28), in one call: build losslab-0.2.0-*.whl here with this
# machine's nvcc from a clean copy of the sources (or take WHEEL=path), install it with
# `pip install --no-deps` into a fresh virtual environment with --system-site-packages (this
# machine's torch), hide nvcc, and run tests/helpers/installed_check.py there, away from the checkout
# (first call of each loss beyond the CUDA context, every operator against float64, host time per
# call); the same check from the checkout (its pybind build, for the host time beside it); then every
# tier of tests/test_prebuilt.py. Logs, JSON and the wheel go to $OUT (default ./gpu-out); the table
# prints last.   usage: scripts/wheel_gpu.sh
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
REPO=$PWD
PY=${PYTHON:-python3}
WORK=$(mktemp -d)
export PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/losslab-extensions}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/nvidia-smi.txt"
$PY -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda)" | tee "$OUT/torch.txt"

if [ -z "${WHEEL:-}" ]; then
    echo "== building the wheel (nvcc $(nvcc --version | grep -o 'release [0-9.]*'))"
    mkdir "$WORK/src" && cp -r pyproject.toml setup.py losslab kernels exercises pitfalls "$WORK/src/"
    find "$WORK/src" -name __pycache__ -prune -exec rm -rf {} + ; rm -rf "$WORK/src/losslab/_prebuilt"
    start=$(date +%s)
    if ! $PY -m pip wheel --no-deps --no-build-isolation -w "$OUT/dist" "$WORK/src" > "$OUT/wheel_build.log" 2>&1; then
        tail -n 30 "$OUT/wheel_build.log"; exit 1
    fi
    echo "built in $(( $(date +%s) - start )) s" | tee -a "$OUT/wheel_build.log"
    WHEEL=$(ls "$OUT"/dist/losslab-*.whl)
fi
echo "== installing $WHEEL into a fresh venv (--system-site-packages, --no-deps)"
$PY -m venv --system-site-packages --without-pip "$WORK/venv"
VPY=$WORK/venv/bin/python
if ! "$VPY" -c "import torch" 2> /dev/null; then  # $PY is itself a venv's: see its packages as a system's
    $PY -c "import sys; print('\n'.join(p for p in sys.path if p.endswith('site-packages')))" \
        > "$("$VPY" -c "import sysconfig; print(sysconfig.get_path('purelib'))")/outer.pth"
fi
$PY -m pip --python "$VPY" install -q --no-deps "$WHEEL" > "$OUT/install.log" 2>&1 \
    || "$VPY" -m pip install -q --no-deps "$WHEEL" >> "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
NO_NVCC_PATH=$(tr ':' '\n' <<< "$PATH" | while read -r d; do [ -x "$d/nvcc" ] || printf '%s:' "$d"; done)
echo "== the installed wheel, nvcc hidden (PATH without it: $(PATH=$NO_NVCC_PATH command -v nvcc || echo none))"
(cd "$WORK" && env -u PYTHONPATH -u CUDA_HOME PATH="$NO_NVCC_PATH" "$VPY" "$REPO/tests/helpers/installed_check.py") \
    > "$OUT/installed.json" 2> "$OUT/installed.log"
installed=$?
echo "== the checkout (pybind build)"
PYTHONPATH=$REPO $PY tests/helpers/installed_check.py > "$OUT/checkout.json" 2> "$OUT/checkout.log"
checkout=$?
echo "== pytest tests/test_prebuilt.py (every tier)"
$PY -m pytest -v -rs -p no:cacheprovider tests/test_prebuilt.py > "$OUT/pytest.log" 2>&1
tests=$?
tail -n 15 "$OUT/pytest.log"
[ $installed = 0 ] || tail -n 30 "$OUT/installed.log"
[ $checkout = 0 ] || tail -n 30 "$OUT/checkout.log"

$PY - "$OUT" "$installed" "$checkout" "$tests" <<'PYEOF'
import json, sys
from pathlib import Path
out, codes = Path(sys.argv[1]), dict(zip(("installed", "checkout", "pytest"), sys.argv[2:]))
runs = {}
for name in ("installed", "checkout"):
    try:
        runs[name] = json.loads((out / f"{name}.json").read_text())
    except (OSError, ValueError):
        runs[name] = {}
def cell(run, get):
    try:
        return get(run)
    except (KeyError, TypeError, ValueError):
        return "-"
rows = [("losslab from", lambda r: str(Path(r["losslab"]).parents[1].name)),
        ("kernels served by", lambda r: ", ".join(sorted(set(r["extension"].values())))),
        ("CUDA context s", lambda r: f"{r['context_s']:.2f}")]
rows += [(f"first call {loss} s", lambda r, loss=loss: f"{r['first_call_s'][loss]:.3f}")
         for loss in ("cross_entropy", "kl_div")]
rows += [(f"max rel. error {d}", lambda r, d=d: f"{max(e for k, e in r['errors'].items() if k.endswith(d)):.1e}")
         for d in ("float32", "bfloat16", "float16")]
rows += [("checks vs float64", lambda r: str(len(r["errors"]))),
         ("host us/call CE fwd seed", lambda r: f"{r['host_us']:.1f}"), ("torch", lambda r: r["torch"])]
print(f"\n{'':28}{'wheel (ctypes)':>18}{'checkout (pybind)':>20}")
for label, get in rows:
    print(f"{label:28}{cell(runs['installed'], get):>18}{cell(runs['checkout'], get):>20}")
print("exit codes: " + ", ".join(f"{k} {v}" for k, v in codes.items()) + f"; logs and JSON in {out}")
PYEOF
rm -rf "$WORK"
exit $(( installed || checkout || tests ))
