#!/usr/bin/env bash
# quack-kernels 0.6.5 (the optional quack peer: Dao-AILab's CuTe-DSL kernels) onto the GPU machine, which
# has no network. Its CUDA 13 CuTe-DSL libraries wheel (92 MB) is more than one transfer carries, so it
# travels in two halves over two calls on one warm machine. Run from the repository root.
#   here, with a network, the wheels (nvidia-cutlass-dsl 4.8 loads its MLIR bindings from libs-base: without
#   it `import quack` fails on _cutlass_ir; liger-kernel, the other optional peer, comes along):
#     pip download --no-deps --only-binary=:all: --platform manylinux_2_28_x86_64 --python-version 3.12 \
#       -d .whl/quack quack-kernels==0.6.5 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1 \
#       nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1 "apache-tvm-ffi<0.2" \
#       torch-c-dlpack-ext einops liger-kernel==0.8.5
#   here:      scripts/quack_install.sh prepare   .whl/quack/*.whl -> .whl/quack-a (first half of the cu13
#                                                 wheel), .whl/quack-b (second half, sha256, the small wheels)
#   call 1:    carry .whl/quack-a:  scripts/quack_install.sh stage     (copies it to /tmp/quack-stage)
#   call 2:    carry .whl/quack-b:  scripts/quack_install.sh install   (joins the halves, checks the sha256,
#                                                 pip install --no-index --no-deps --target /tmp/site)
# then, in each later call on that machine (pip --target skips nvidia_cutlass_dsl's .pth file, which puts
# nvidia_cutlass_dsl/dsl_packages on sys.path):
#   export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH
# smoke test (quack's cross_entropy at 4096x4096 bf16: first call with its JIT compile, then one timed
# call, against torch's loss in float64):
#   python3 -c "import time, torch, quack; x = torch.randn(4096, 4096, device='cuda', dtype=torch.bfloat16); t = torch.randint(0, 4096, (4096,), device='cuda'); quack.cross_entropy(x, t); torch.cuda.synchronize(); s = time.perf_counter(); loss = quack.cross_entropy(x, t); torch.cuda.synchronize(); ms = (time.perf_counter() - s) * 1e3; ref = torch.nn.functional.cross_entropy(x.double(), t); print(f'quack {loss.item():.6f} in {ms:.3f} ms (host clock, one call); torch float64 {ref.item():.6f}')"
set -euo pipefail
STAGE=/tmp/quack-stage SITE=/tmp/site
DSL_PACKAGES=$SITE/nvidia_cutlass_dsl/dsl_packages

case "${1:-}" in
prepare)
    big=$(ls .whl/quack/*cu13*.whl)
    rm -rf .whl/quack-a .whl/quack-b
    mkdir -p .whl/quack-a .whl/quack-b
    split -b 47000000 "$big" "/tmp/$(basename "$big").part-"
    mv "/tmp/$(basename "$big").part-aa" .whl/quack-a/
    mv "/tmp/$(basename "$big").part-ab" .whl/quack-b/
    find .whl/quack -name '*.whl' ! -name '*cu13*' -exec cp {} .whl/quack-b/ \;
    (cd "$(dirname "$big")" && sha256sum "$(basename "$big")") > .whl/quack-b/cu13.sha256
    du -b .whl/quack-a .whl/quack-b ;;
stage)
    rm -rf "$STAGE" && mkdir -p "$STAGE" && cp .whl/quack-a/* "$STAGE"/
    ls -l "$STAGE" ;;
install)
    cp .whl/quack-b/* "$STAGE"/
    cd "$STAGE"
    big=$(cut -d' ' -f3 cu13.sha256)
    cat "$big".part-aa "$big".part-ab > "$big"
    sha256sum -c cu13.sha256
    rm -rf "$SITE"
    python3 -m pip install -q --no-index --no-deps --target "$SITE" ./*.whl
    export PYTHONPATH=$SITE:$DSL_PACKAGES${PYTHONPATH:+:$PYTHONPATH}
    python3 -c "import quack; print('quack', quack.__version__, 'imports from', quack.__file__)"
    echo "export PYTHONPATH=$SITE:$DSL_PACKAGES:\$PYTHONPATH" ;;
*)
    sed -n '2,18p' "$0"; exit 2 ;;
esac
