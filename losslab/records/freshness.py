"""Freshness: the hash of every source that changes a measurement of a problem.

A record's rows carry the :func:`sources_sha256` they were measured with; a row is fresh
while that hash equals today's. A cpu-tier test fails when the newest record is not fresh.
"""
from __future__ import annotations

import hashlib
import inspect
from collections.abc import Sequence
from pathlib import Path

from losslab import build, problems
from losslab.build import KERNELS, ROOT, ladder, prebuilt

# bindings of extensions that no record section measures (losslab.distributed's kernels)
UNRECORDED_BINDINGS = frozenset({"vocab_parallel"})
# a loss package's module of what the notebooks claim of its measurements (checked on every record)
CLAIMS_MODULE = "claims.py"


def _files(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts] if folder.exists() else []


def measured_sources(problem: str, root: Path | None = None) -> list[Path]:
    """Every file a measurement of ``problem`` depends on, sorted: ``kernels/common``,
    ``kernels/<problem>`` (the operators' kernels and the teaching ladder's) and ``kernels/ceilings``
    (the bandwidth ceilings the rows are a fraction of), the bindings in ``losslab/build/csrc`` (but
    other problems' and :data:`UNRECORDED_BINDINGS`), the host launch code in ``losslab/problems``
    (but other problems' packages and each package's :data:`CLAIMS_MODULE`), ``losslab/ops.py``,
    ``losslab/nn/`` (the public operator's) and ``losslab/variants.py``, and the build modules that
    hold the compiler flags. ``root``: the
    repository (default this one)."""
    root = Path(root or ROOT)
    others = set(problems.names()) - {problem}
    kernels = root / KERNELS.relative_to(ROOT)
    builders = {Path(inspect.getsourcefile(inspect.unwrap(f))).resolve().relative_to(ROOT)
                for f in (build.load_extension, ladder.load_ladder)}
    files = [*_files(kernels / "common"), *_files(kernels / problem), *_files(kernels / "ceilings")]
    unmeasured = others | UNRECORDED_BINDINGS
    files += [p for p in _files(root / build.CSRC.relative_to(ROOT))
              if p.stem.removesuffix(f"_{ladder.LADDER}").removesuffix(prebuilt.SHIM_SUFFIX) not in unmeasured]
    package = root / "losslab" if (root / "losslab").is_dir() else root  # an installed wheel's root is the package
    packages = package / "problems"
    files += [p for p in _files(packages) if p.suffix == ".py" and p.relative_to(packages).parts[0] not in others
              and p.name != CLAIMS_MODULE]
    files += [p for p in _files(package / "nn") if p.suffix == ".py"]
    files += [package / "ops.py", package / "variants.py", *(root / b for b in builders)]
    return sorted(set(files))


def _digest(files: Sequence[Path], root: Path, extra: str = "") -> str:
    digest = hashlib.sha256(extra.encode() + b"\0")
    for path in sorted(set(files)):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _flags() -> str:
    """The compiler flags of the extension build, as text (they change the machine code)."""
    return repr([getattr(build, name, None) for name in ("NVCC_FLAGS", "CXX_FLAGS")])


def sources_sha256(problem: str, root: Path | None = None) -> str:
    """sha256 over :func:`measured_sources` (each file's path relative to the repository and its
    bytes) and the compiler flags: equal only when a measurement would run the same code."""
    root = Path(root or ROOT)
    return _digest(measured_sources(problem, root), root, _flags())


def pitfall_sources_sha256(extra: Sequence[Path] = (), root: Path | None = None) -> str:
    """sha256 for a pitfalls record: every problem's :func:`measured_sources`, the pitfall kernels
    under ``pitfalls/``, the flags, and ``extra`` files inside the repository (the modules that
    build and run them)."""
    root = Path(root or ROOT)
    files = [f for p in problems.names() for f in measured_sources(p, root)] + _files(root / "pitfalls")
    files += [root / Path(e).resolve().relative_to(ROOT) for e in extra]
    return _digest(files, root, _flags())
