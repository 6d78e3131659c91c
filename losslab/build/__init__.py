"""Compile the kernels, and read what the compiler made of them.

``load_extension(problem)`` builds ``kernels/common/*.cu``, ``kernels/<problem>/*.cu``
and the pybind11 binding ``losslab/csrc/<problem>.cpp`` into one Python
extension with ``torch.utils.cpp_extension`` (ninja: cached, incremental).
``compile_cubin``/``resource_usage``/``disassemble`` compile a single kernel
file to machine code for one architecture and report registers, spills,
shared memory and SASS, with no GPU needed.
"""
from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "kernels"
CSRC = Path(__file__).resolve().parent / "csrc"
NVCC_FLAGS = ("-O3", "-std=c++17", "-lineinfo")
DEFAULT_ARCHS = ("8.0", "9.0")  # A100 and H100/H200, when no GPU says which


def dtype_code(dtype) -> int:
    """The DType code (kernels/common/dtype.h) a launcher takes for a torch dtype."""
    import torch

    return {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}[dtype]


class BuildError(RuntimeError):
    """The kernels cannot be built here: a tool is missing or the compiler failed."""


def find_cuda_home() -> Path:
    """The CUDA toolkit's root.

    Uses $CUDA_HOME if set, else asks the ``nvcc`` on PATH (which may be a
    wrapper script whose parent folder is not the toolkit) via ``nvcc --dryrun``.

    Raises:
        BuildError: no nvcc on PATH and no $CUDA_HOME.
    """
    if os.environ.get("CUDA_HOME"):
        return Path(os.environ["CUDA_HOME"])
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise BuildError("cannot build the kernels: nvcc (the CUDA compiler) is not on PATH and "
                         "CUDA_HOME is not set; install the CUDA toolkit or set CUDA_HOME")
    dry = subprocess.run([nvcc, "--dryrun", "-c", "-x", "cu", os.devnull, "-o", os.devnull],
                         capture_output=True, text=True)
    match = re.search(r"^#\$ TOP=(.+)$", dry.stdout + dry.stderr, re.MULTILINE)
    return Path(match.group(1)).resolve() if match else Path(nvcc).resolve().parent.parent


def nvcc_path() -> Path:
    return find_cuda_home() / "bin" / "nvcc"


def _cuda_arch_list() -> str:
    import torch

    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return f"{major}.{minor}"
    return ";".join(DEFAULT_ARCHS)


def sources(problem: str) -> list[Path]:
    """The files one problem's extension is built from."""
    binding = CSRC / f"{problem}.cpp"
    kernels = sorted((KERNELS / problem).glob("*.cu"))
    if not binding.exists() or not kernels:
        raise BuildError(f"problem: no kernels for {problem!r} "
                         f"(expected {binding} and {KERNELS / problem}/*.cu)")
    return [binding, *sorted((KERNELS / "common").glob("*.cu")), *kernels]


@functools.cache
def load_extension(problem: str, verbose: bool = False):
    """Build (if needed) and import the extension of ``problem``'s kernels.

    The first build takes about a minute (less with a warm cache); later calls in
    any process reuse the build unless a source changed. Set $TORCH_EXTENSIONS_DIR
    to move the build cache and $TORCH_CUDA_ARCH_LIST to choose architectures
    (default: the visible GPU's, else sm_80 and sm_90).

    Raises:
        BuildError: torch has no CUDA support, nvcc is missing, or compilation failed.
    """
    import torch

    if torch.version.cuda is None:
        raise BuildError(f"cannot build the kernels: torch {torch.__version__} is a CPU-only build; "
                         "install a CUDA build of torch")
    os.environ["CUDA_HOME"] = str(find_cuda_home())
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", _cuda_arch_list())
    from torch.utils import cpp_extension

    cpp_extension.CUDA_HOME = os.environ["CUDA_HOME"]  # it was fixed when cpp_extension was imported
    print(f"losslab: building the {problem} kernels for sm {os.environ['TORCH_CUDA_ARCH_LIST']} "
          "(cached after the first build) ...", file=sys.stderr, flush=True)
    try:
        return cpp_extension.load(
            name=f"losslab_{problem}",
            sources=[str(s) for s in sources(problem)],
            extra_include_paths=[str(KERNELS)],
            extra_cflags=["-O2"],
            extra_cuda_cflags=list(NVCC_FLAGS),
            verbose=verbose,
        )
    except (RuntimeError, subprocess.CalledProcessError) as err:
        raise BuildError(f"building the {problem} kernels failed: {err}") from err


@dataclass(frozen=True)
class KernelResources:
    """What ptxas reports for one kernel on one architecture (bytes unless named)."""

    kernel: str
    arch: str
    registers: int
    shared_bytes: int
    stack_bytes: int
    spill_store_bytes: int
    spill_load_bytes: int


def compile_cubin(source: Path, arch: str, out_dir: Path) -> tuple[Path, str]:
    """Compile one ``.cu`` file to a cubin for ``arch`` (e.g. ``"sm_90"``).

    Returns the cubin's path and ptxas's verbose report.

    Raises:
        BuildError: nvcc missing or compilation failed (with the compiler's message).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    cubin = out_dir / f"{source.parent.name}_{source.stem}_{arch}.cubin"
    cmd = [str(nvcc_path()), *NVCC_FLAGS, "-cubin", f"-arch={arch}", "-Xptxas", "-v",
           "-I", str(KERNELS), str(source), "-o", str(cubin)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise BuildError(f"nvcc failed on {source} for {arch}:\n{result.stderr}")
    return cubin, result.stderr


def resource_usage(ptxas_report: str, arch: str) -> list[KernelResources]:
    """Parse ``-Xptxas -v`` output into one record per kernel."""
    kernels = []
    for block in re.split(r"Compiling entry function ", ptxas_report)[1:]:
        name = block.split("'")[1]

        def number(pattern: str) -> int:
            found = re.search(pattern, block)
            return int(found.group(1)) if found else 0

        kernels.append(KernelResources(
            kernel=name, arch=arch,
            registers=number(r"Used (\d+) registers"),
            shared_bytes=number(r"(\d+) bytes smem"),
            stack_bytes=number(r"(\d+) bytes stack frame"),
            spill_store_bytes=number(r"(\d+) bytes spill stores"),
            spill_load_bytes=number(r"(\d+) bytes spill loads"),
        ))
    return kernels


def find_cuobjdump() -> Path:
    """cuobjdump from the toolkit, PATH, or the ``nvidia-cuda-cuobjdump`` wheel.

    Raises:
        BuildError: none found.
    """
    candidates = [find_cuda_home() / "bin" / "cuobjdump"]
    if shutil.which("cuobjdump"):
        candidates.append(Path(shutil.which("cuobjdump")))
    try:
        import nvidia  # namespace package of NVIDIA's wheels

        candidates += [Path(p) / sub / "bin" / "cuobjdump" for p in nvidia.__path__ for sub in ("cu13", "cuda_cuobjdump")]
    except ImportError:
        pass
    for path in candidates:
        if path.is_file():
            return path
    raise BuildError("cuobjdump not found: install the CUDA toolkit's cuobjdump or "
                     "`pip install nvidia-cuda-cuobjdump`")


def disassemble(cubin: Path) -> dict[str, str]:
    """SASS of every kernel in ``cubin``, keyed by the kernel's mangled name.

    Raises:
        BuildError: cuobjdump missing or failing (it needs nvdisasm beside it).
    """
    run = subprocess.run([str(find_cuobjdump()), "--dump-sass", str(cubin)], capture_output=True, text=True)
    if run.returncode != 0:  # e.g. nvdisasm, which it runs, missing: `pip install nvidia-cuda-nvdisasm`
        raise BuildError(f"cuobjdump --dump-sass {cubin} failed: {run.stderr.strip() or run.stdout.strip()}")
    text = run.stdout
    kernels = {}
    for part in re.split(r"\n\s*Function : ", text)[1:]:
        name, _, body = part.partition("\n")
        kernels[name.strip()] = body
    return kernels
