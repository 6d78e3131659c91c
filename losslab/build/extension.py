"""Build a problem's kernels into a Python extension.

``load_extension(problem)`` builds ``kernels/common/*.cu``, ``kernels/<problem>/*.cu``
and the pybind11 binding ``losslab/build/csrc/<problem>.cpp`` into one Python
extension with ``torch.utils.cpp_extension`` (ninja: cached, incremental). The
binding includes no torch headers: it binds each launcher of
``kernels/<problem>/launchers.h`` through ``csrc/bind.h``. ``defines`` builds another launch
configuration (``knobs``: ``-DLOSSLAB_<PROBLEM>_<RUNG>_<KNOB>=<value>``) as its own extension,
``losslab_<problem>_<hash of the flags>``, cached by those flags beside the default one. The
default build comes prebuilt in a wheel (``prebuilt``): loaded instead where built from these sources.
"""
from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from losslab.build import knobs, prebuilt

KERNELS = knobs.KERNELS
ROOT = KERNELS.parent
CSRC = Path(__file__).resolve().parent / "csrc"
NVCC_FLAGS = prebuilt.NVCC_FLAGS
DEFAULT_ARCHS = ("8.0", "9.0")  # A100 and H100/H200, when no GPU says which


def dtype_code(dtype) -> int:
    """The DType code (kernels/common/dtype.h) a launcher takes for a torch dtype.

    Raises:
        KeyError: a dtype no launcher takes.
    """
    from losslab.problems.launch import DTYPE_CODES

    return DTYPE_CODES[dtype]


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


def find_tool(name: str) -> str | None:
    """Path of one of the CUDA toolkit's programs (``ncu``, ``compute-sanitizer``, ``cuobjdump``)
    on PATH, else in the toolkit's ``bin`` (:func:`find_cuda_home`), else None."""
    found = shutil.which(name)
    if found:
        return found
    try:
        candidate = find_cuda_home() / "bin" / name
    except (BuildError, OSError):
        return None
    return str(candidate) if candidate.is_file() else None


def cuda_arch_list() -> str:
    """The architectures to build for: the visible GPU's, else DEFAULT_ARCHS (``"8.0;9.0"``)."""
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


def define_flags(problem: str, defines: tuple[tuple[str, int], ...]) -> list[str]:
    """``-D<macro>=<value>`` for each of ``defines``, sorted.

    Raises:
        ValueError: a macro that is no knob of ``problem``'s rungs, or a value that is not an int.
    """
    declared = {k.macro for path in (KERNELS / problem).glob("*.cu") for k in knobs.knobs(problem, path.stem, KERNELS)}
    for macro, value in defines:
        if macro not in declared:
            raise ValueError(f"defines: {macro!r} is no knob of the {problem} kernels; their knobs: "
                             + ", ".join(sorted(declared)))
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"defines: {macro} must be an int, got {value!r}")
    return sorted(f"-D{macro}={value}" for macro, value in defines)


def extension_name(problem: str, defines: tuple[tuple[str, int], ...] = ()) -> str:
    """The extension's module name and build folder: ``losslab_<problem>`` for the default
    build, ``losslab_<problem>_<first 10 hex digits of sha256 of the sorted -D flags>`` for another."""
    flags = define_flags(problem, defines)
    if not flags:
        return f"losslab_{problem}"
    return f"losslab_{problem}_{hashlib.sha256(' '.join(flags).encode()).hexdigest()[:10]}"


def compile_error_line(output: str) -> str | None:
    """The first ``static_assert`` failure in compiler output, as one line
    (``kernels/kl_div/vectorized.cu:25: static assertion failed with "..."``), or None."""
    match = re.search(r"([\w./-]+)\((\d+)\): error: (static assertion failed[^\n]*)", output)
    if match is None:
        return None
    path = Path(match.group(1))
    shown = path.relative_to(ROOT) if path.is_absolute() and path.is_relative_to(ROOT) else path
    return f"{shown}:{match.group(2)}: {match.group(3).strip()}"


@functools.cache
def load_extension(problem: str, verbose: bool = False, defines: tuple[tuple[str, int], ...] = ()):
    """Build (if needed) and import the extension of ``problem``'s kernels; the default build
    (no ``defines``) is the wheel's prebuilt library where it holds one built from these sources
    (:func:`losslab.build.prebuilt.load`: no compiler, no wait).

    The first build takes about a minute (less with a warm cache); later calls in
    any process reuse the build unless a source changed. Set $TORCH_EXTENSIONS_DIR
    to move the build cache and $TORCH_CUDA_ARCH_LIST to choose architectures
    (default: the visible GPU's, else sm_80 and sm_90).

    Args:
        defines: (knob macro, value) pairs (``knobs.Config.defines``): another launch
            configuration, built and cached as :func:`extension_name` says; () the default build.
    Raises:
        ValueError: a define that is no knob (see :func:`define_flags`).
        BuildError: torch has no CUDA support, nvcc is missing, or compilation failed (a
            failed ``static_assert`` of a knob as one line naming it).
    """
    if not defines:
        library = prebuilt.load(problem, KERNELS, CSRC)
        if library is not None:
            return library
    name, flags = extension_name(problem, defines), define_flags(problem, defines)
    what = f"the {problem} kernels" + (f" with {' '.join(flags)}" if flags else "")
    return build(name, what, sources(problem), flags, verbose)


def build(name: str, what: str, files: list[Path], flags: list[str] = (), verbose: bool = False,
          include: list[Path] = ()):
    """Build (if needed) and import the extension ``name`` from ``files`` with losslab's flags
    (:data:`NVCC_FLAGS` and ``flags``, ``kernels/`` and ``include`` on the include path), cached by
    ``torch.utils.cpp_extension`` under $TORCH_EXTENSIONS_DIR. ``what`` names it in messages
    ("the kl_div kernels"). What :func:`load_extension`, the teaching ladder's ``load_ladder`` and
    the linear cross-entropy's ``load`` share.

    Raises:
        BuildError: torch has no CUDA support, nvcc is missing, the build folder cannot be
            written (one line naming it and TORCH_EXTENSIONS_DIR), or compilation failed.
    """
    import torch

    if torch.version.cuda is None:
        raise BuildError(f"cannot build {what}: torch {torch.__version__} is a CPU-only build; "
                         "install a CUDA build of torch")
    os.environ["CUDA_HOME"] = str(find_cuda_home())
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", cuda_arch_list())
    from torch.utils import cpp_extension

    cpp_extension.CUDA_HOME = os.environ["CUDA_HOME"]  # it was fixed when cpp_extension was imported
    print(f"losslab: building {what} for sm {os.environ['TORCH_CUDA_ARCH_LIST']} "
          "(cached after the first build) ...", file=sys.stderr, flush=True)
    try:
        return cpp_extension.load(
            name=name,
            sources=[str(f) for f in files],
            extra_include_paths=[str(KERNELS), *map(str, include)],
            extra_cflags=["-O2"],
            extra_cuda_cflags=[*NVCC_FLAGS, *flags],
            verbose=verbose,
        )
    except OSError as err:  # PermissionError, a read-only or full file system: not a compile error
        where = err.filename or os.environ.get("TORCH_EXTENSIONS_DIR", "torch's extension cache")
        raise BuildError(f"cannot build {what}: cannot write {where} ({err.strerror or err}); set "
                         "TORCH_EXTENSIONS_DIR to a writable folder") from err
    except (RuntimeError, subprocess.CalledProcessError) as err:
        line = compile_error_line(str(err))
        raise BuildError(f"building {what} failed: {line}" if line else f"building {what} failed: {err}") from err
