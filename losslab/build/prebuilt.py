"""Prebuilt kernels: each loss's operator kernels compiled once, when the wheel is built, into a
plain shared library ``losslab/_prebuilt/liblosslab_<loss>.so`` (the C entry points of
``csrc/c_abi.h``, the CUDA runtime linked in), called through ctypes: no compiler at run time and
no tie to one Python's or one PyTorch's C++ ABI.

:func:`compile_libraries` builds them (nvcc; setup.py's build step); :func:`load` opens one as an
object with the pybind extension's attributes (``ext.<rung>_forward(*ints)``), or None where there
is none or it was built from other sources than these (:func:`sources_digest`, stored beside it).
Standard library only: setup.py loads this file without losslab's dependencies.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

PREBUILT = Path(__file__).resolve().parents[1] / "_prebuilt"
NVCC_FLAGS = ("-O3", "-std=c++17", "-lineinfo")
# SASS for A100 (sm_80) and H100/H200 (sm_90; the cluster rung needs no sm_90a feature), and sm_90
# PTX that the driver compiles for newer GPUs at load.
GENCODE = ("-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_90,code=sm_90",
           "-gencode=arch=compute_90,code=compute_90")
SHIM_SUFFIX = "_prebuilt"  # csrc/<loss>_prebuilt.cpp: a loss's entry points (c_abi.h)


def library_path(problem: str) -> Path:
    """Where ``problem``'s prebuilt library lies (it may not exist)."""
    return PREBUILT / f"liblosslab_{problem}.so"


def problems(csrc: Path) -> tuple[str, ...]:
    """The losses with a prebuilt library: those with a ``csrc/<loss>_prebuilt.cpp``."""
    return tuple(sorted(p.stem.removesuffix(SHIM_SUFFIX) for p in csrc.glob(f"*{SHIM_SUFFIX}.cpp")))


def _shim(problem: str, csrc: Path) -> Path:
    return csrc / f"{problem}{SHIM_SUFFIX}.cpp"


def _compiled(problem: str, kernels: Path, csrc: Path) -> list[Path]:
    return [_shim(problem, csrc), *sorted((kernels / "common").glob("*.cu")),
            *sorted((kernels / problem).glob("*.cu"))]


def sources_digest(problem: str, kernels: Path, csrc: Path) -> str:
    """sha256 (hex) of every file ``problem``'s library is built from, by name and content: the
    files of ``kernels/common/`` and ``kernels/<problem>/`` (not its ``ladder/``), ``csrc/c_abi.h``
    and the loss's shim, and the compiler flags."""
    named = sorted((f"kernels/{folder}/{p.name}", p) for folder in ("common", problem)
                   for p in (kernels / folder).iterdir() if p.is_file())
    named += [(f"csrc/{p.name}", p) for p in (csrc / "c_abi.h", _shim(problem, csrc))]
    digest = hashlib.sha256(" ".join((*NVCC_FLAGS, *GENCODE)).encode())
    for name, path in named:
        digest.update(f"\0{name}\0".encode() + path.read_bytes())
    return digest.hexdigest()


def _run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stdout}{done.stderr}")


def compile_libraries(out: Path, kernels: Path, csrc: Path, nvcc: str = "nvcc", jobs: int | None = None) -> list[Path]:
    """Compile every loss's library (:func:`problems`) into ``out``, each with its sources digest
    beside it (``liblosslab_<loss>.sha256``); ``jobs`` nvcc processes at once (default: the CPUs).

    Raises:
        RuntimeError: nvcc failed (its command and output); OSError: no nvcc.
    """
    out.mkdir(parents=True, exist_ok=True)
    names = problems(csrc)
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(jobs or os.cpu_count()) as pool:
        objects = {s: Path(tmp) / f"{s.parent.name}_{s.name}.o" for p in names for s in _compiled(p, kernels, csrc)}
        flags = [*NVCC_FLAGS, *GENCODE, "-Xcompiler=-fPIC", f"-I{kernels}", f"-I{csrc}"]
        list(pool.map(_run, ([nvcc, *flags, "-c", str(s), "-o", str(o)] for s, o in objects.items())))
        libraries = {p: out / library_path(p).name for p in names}
        # The static CUDA runtime's symbols stay inside (--exclude-libs): the kernels register
        # with, and launch through, this library's runtime, never torch's libcudart.
        list(pool.map(_run, ([nvcc, "-shared", "-o", str(lib), *(str(objects[s]) for s in _compiled(p, kernels, csrc)),
                              "-Xlinker=--exclude-libs,ALL"] for p, lib in libraries.items())))
    for p, lib in libraries.items():
        lib.with_suffix(".sha256").write_text(sources_digest(p, kernels, csrc) + "\n")
    return list(libraries.values())


class _Entry(ctypes.Structure):  # LosslabEntry of c_abi.h
    _fields_ = [("name", ctypes.c_char_p), ("function", ctypes.c_void_p), ("params", ctypes.c_char_p),
                ("result", ctypes.c_char), ("outputs", ctypes.c_int)]


_TYPES = {b"p": ctypes.c_void_p, b"q": ctypes.c_int64, b"i": ctypes.c_int, b"f": ctypes.c_float}


class Library:
    """A prebuilt library's entry points as attributes, as the pybind extension has them: a
    launcher ``lib.<rung>_forward(*ints)`` takes pointers, sizes, the dtype code and the stream as
    Python numbers and raises RuntimeError("<name>: <CUDA's message>") when it returns an error.

    Raises:
        OSError: the file cannot be loaded (missing, or built for another system).
    """

    def __init__(self, path: Path):
        self.path = path
        self._dll = ctypes.CDLL(str(path))
        self._dll.losslab_error_string.restype = ctypes.c_char_p
        self._dll.losslab_error_string.argtypes = [ctypes.c_int]
        table = ctypes.POINTER(_Entry)()
        for entry in table[:self._dll.losslab_entries(ctypes.byref(table))]:
            setattr(self, entry.name.decode(), self._function(entry))

    def _function(self, entry: _Entry):
        name, types = entry.name.decode(), [_TYPES[bytes([c])] for c in entry.params]
        if entry.result == b"e":
            def check(result, function, args):
                if result:
                    raise RuntimeError(f"{name}: {self._dll.losslab_error_string(result).decode()}")

            # PYFUNCTYPE keeps the GIL as pybind11 does: a launch only enqueues (cheaper per call).
            launcher = ctypes.PYFUNCTYPE(ctypes.c_int, *types)(entry.function)
            launcher.errcheck = check
            return launcher
        n = entry.outputs
        function = ctypes.PYFUNCTYPE(ctypes.c_char_p, *types[:len(types) - n],
                                     *[ctypes.POINTER(ctypes.c_int64)] * n)(entry.function)

        def call(*args):  # (*the int64 outputs, the text)
            values = [ctypes.c_int64() for _ in range(n)]
            text = function(*args, *map(ctypes.byref, values))
            return (*(v.value for v in values), text.decode())

        return call


def load(problem: str, kernels: Path, csrc: Path) -> Library | None:
    """``problem``'s prebuilt library, or None where there is none, it cannot be loaded here, or it
    was built from other sources than those in ``kernels`` and ``csrc`` (a checkout whose kernels
    changed: a message says so; the caller builds them)."""
    path = library_path(problem)
    if not path.is_file():
        return None
    digest = path.with_suffix(".sha256")
    if not digest.is_file() or digest.read_text().strip() != sources_digest(problem, kernels, csrc):
        print(f"losslab: the prebuilt {problem} kernels ({path}) were built from other sources than "
              f"{kernels}; building them instead", file=sys.stderr, flush=True)
        return None
    try:
        return Library(path)
    except OSError as err:
        print(f"losslab: cannot load the prebuilt {problem} kernels ({err}); building them instead",
              file=sys.stderr, flush=True)
        return None
