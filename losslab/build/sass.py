"""Read what the compiler made of one kernel file, with no GPU needed.

``compile_cubin`` compiles a single ``.cu`` file to machine code for one
architecture; ``resource_usage`` reads ptxas's report (registers, spills, stack,
shared memory); ``disassemble`` gives each kernel's SASS.
"""
from __future__ import annotations

import errno
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from losslab.build.extension import KERNELS, NVCC_FLAGS, BuildError, find_tool, nvcc_path

# A start can fail for a moment on a busy machine (ETXTBSY, EAGAIN, ENOMEM: CI's 2 cores once failed two
# cuobjdump starts in a row), so it is tried again; a missing or forbidden program is not.
_LASTING = frozenset({errno.ENOENT, errno.EACCES, errno.ENOEXEC, errno.ENOTDIR})
_RETRY_S = (0.5, 2.0, 5.0)


def run_tool(cmd: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``cmd`` (a toolkit program: nvcc, cuobjdump) run in ``cwd``: its completed process, text output,
    its start tried again after an error that can pass.

    Raises:
        BuildError: the program could not be started (with the system's reason).
    """
    for wait in (*_RETRY_S, None):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
        except OSError as err:
            if err.errno in _LASTING or wait is None:
                raise BuildError(f"could not start {cmd[0]}: {err}") from err
            time.sleep(wait)


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


def compile_cubin(source: Path, arch: str, out_dir: Path, flags: tuple[str, ...] = ()) -> tuple[Path, str]:
    """Compile one ``.cu`` file to a cubin for ``arch`` (e.g. ``"sm_90"``), with extra nvcc
    ``flags`` (e.g. ``extension.define_flags``: a launch configuration).

    Returns the cubin's path and ptxas's verbose report.

    Raises:
        BuildError: nvcc missing or not started, or compilation failed (with the compiler's message).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    cubin = out_dir / f"{source.parent.name}_{source.stem}_{arch}.cubin"
    cmd = [str(nvcc_path()), *NVCC_FLAGS, *flags, "-cubin", f"-arch={arch}", "-Xptxas", "-v",
           "-I", str(KERNELS), str(source), "-o", str(cubin)]
    result = run_tool(cmd)
    if result.returncode != 0:
        raise BuildError(f"nvcc failed on {source} for {arch}:\n{result.stderr}")
    return cubin, result.stderr


def resource_usage(ptxas_report: str, arch: str) -> list[KernelResources]:
    """Parse ``-Xptxas -v`` output into one record per kernel."""
    kernels = []
    for block in re.split(r"Compiling entry function ", ptxas_report)[1:]:
        name = block.split("'")[1]

        def number(pattern: str, block: str = block) -> int:
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
    found = find_tool("cuobjdump")
    candidates = [Path(found)] if found else []
    try:
        import nvidia  # namespace package of NVIDIA's wheels

        candidates += [Path(p) / sub / "bin" / "cuobjdump"
                       for p in nvidia.__path__ for sub in ("cu13", "cuda_cuobjdump")]
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
    run = run_tool([str(find_cuobjdump()), "--dump-sass", str(cubin)])
    if run.returncode != 0:  # e.g. nvdisasm, which it runs, missing: `pip install nvidia-cuda-nvdisasm`
        raise BuildError(f"cuobjdump --dump-sass {cubin} failed: {run.stderr.strip() or run.stdout.strip()}")
    text = run.stdout
    kernels = {}
    for part in re.split(r"\n\s*Function : ", text)[1:]:
        name, _, body = part.partition("\n")
        kernels[name.strip()] = body
    return kernels
