"""What the compiler made of each rung, shown without a GPU: ptxas registers per thread and the
SASS instructions that carry a rung's idea (``LDG.E`` vs ``LDG.E.128``, ``BAR.SYNC``,
``SHFL.BFLY``, ``MUFU.LG2``/``MUFU.EX2``), from ``losslab.build.sass``.

Compiled results are cached (:func:`rung_code` says how). Without nvcc (or cuobjdump) every
function returns None and the tables say so in one line.
"""
from __future__ import annotations

import functools
import hashlib
import html
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from losslab import problems, records
from losslab.build import BuildError
from losslab.present.html import Html, message, table
from losslab.present.ladder import kernel_path

# the instruction families a step of the ladder changes, in the order the tables show them
FAMILIES = {
    "LDG 4 B": r"LDG\.E(\.CONSTANT)?\s",  # one 32-bit load per thread
    "LDG 16 B": r"LDG\.E\.128",  # one 16-byte (float4 / 8 x bf16) load per thread
    "STG": r"STG\.E",
    "MUFU": r"MUFU\.",  # the special-function unit: lg2, ex2, rcp
    "BAR": r"BAR\.SYNC",  # __syncthreads()
    "SHFL": r"SHFL\.",  # __shfl_xor_sync
}
_SHOWN = re.compile(r"\b(LDG|STG|MUFU|BAR|SHFL)\.")
_CACHE = Path(tempfile.gettempdir()) / "losslab-sass"
ENTRY_FORMAT = 2  # bumped when what an entry holds changes (2: kernel names read inside namespaces)


@dataclass(frozen=True)
class KernelCode:
    """One float32 kernel of a rung: its name (as in the source), direction ("forward",
    "backward" or "other"), ptxas registers per thread, spilled bytes, and the SASS lines of the
    instruction families in :data:`FAMILIES` (opcode and operands, addresses dropped)."""

    name: str
    direction: str
    registers: int
    spill_bytes: int
    lines: tuple[str, ...]

    def count(self, family: str) -> int:
        """How many instructions of ``family`` (a key of :data:`FAMILIES`) the kernel holds."""
        return sum(bool(re.search(FAMILIES[family], line)) for line in self.lines)


def _name_and_rest(mangled: str) -> tuple[str, str]:
    """The kernel's own name and what follows it in the mangled name: ``_Z34kl_div_..._kernelPKf``
    (a free function) or ``_ZN<len><namespace><len><name>E...`` (in a namespace, e.g. the anonymous
    one a teaching rung's kernels live in)."""
    nested = mangled.startswith("_ZN")
    at, name = (3 if nested else 2), ""
    while (found := re.match(r"\d+", mangled[at:])):
        at += len(found.group(0))
        name, at = mangled[at:at + int(found.group(0))], at + int(found.group(0))
        if not nested:
            break
    return (name, mangled[at:].removeprefix("E") if nested else mangled[at:]) if name else (mangled, "")


def _plain_name(mangled: str) -> str:
    """``_Z34kl_div_warp_shuffle_forward_kernelPKf...`` -> ``kl_div_warp_shuffle_forward_kernel``;
    ``_ZN..._GLOBAL__N__..14forward_kernelEPKf...`` -> ``forward_kernel``."""
    return _name_and_rest(mangled)[0]


def _is_float32(mangled: str) -> bool:
    """Untemplated kernels, or the float instantiation of a template (``<name>IfE...``)."""
    rest = _name_and_rest(mangled)[1]
    return not rest.startswith("I") or rest.startswith("IfE")


def _direction(name: str) -> str:
    return next((d for d in ("forward", "backward") if d in name), "other")


def _compile(problem: problems.Problem, rung: str, arch: str) -> list[KernelCode]:
    from losslab.build import sass

    with tempfile.TemporaryDirectory() as tmp:
        cubin, report = sass.compile_cubin(kernel_path(problem, rung), arch, Path(tmp))
        resources = {r.kernel: r for r in sass.resource_usage(report, arch)}
        disassembly = sass.disassemble(cubin)
    out = []
    for mangled, body in disassembly.items():
        if not _is_float32(mangled) or mangled not in resources:
            continue
        lines = []
        for raw in body.splitlines():
            text = re.sub(r"/\*[^*]*\*/", "", raw).strip().rstrip(";").strip()
            if _SHOWN.search(text):
                lines.append(re.sub(r"\s+", " ", text))
        res = resources[mangled]
        out.append(KernelCode(_plain_name(mangled), _direction(_plain_name(mangled)), res.registers,
                              res.spill_store_bytes + res.spill_load_bytes, tuple(lines)))
    return sorted(out, key=lambda k: (k.direction, k.name))


@functools.cache
def compiler_key() -> str:
    """A hash of the compiler as it is now: nvcc's path, size, modification time, ``--version``
    and losslab's flags (a wrapper that adds ``-G``, or another toolkit, gives another key).

    Raises:
        BuildError: no nvcc.
    """
    from losslab.build.extension import NVCC_FLAGS, nvcc_path

    nvcc = nvcc_path()
    try:
        stat = nvcc.stat()
        version = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as err:
        raise BuildError(f"nvcc at {nvcc} cannot be run: {err}") from err
    identity = "\0".join([str(nvcc), str(stat.st_size), str(stat.st_mtime_ns), version, *NVCC_FLAGS])
    return hashlib.sha256(identity.encode()).hexdigest()[:16]


def _read_entry(path: Path) -> list[KernelCode] | None:
    """The kernels a cache entry holds, or None when it is missing, truncated or not one this
    module writes."""
    names = {f.name: f.type for f in fields(KernelCode)}
    try:
        entries = json.loads(path.read_text())
        if not isinstance(entries, list) or not all(isinstance(k, dict) and k.keys() == names.keys() for k in entries):
            return None
        kernels = [KernelCode(**{**k, "lines": tuple(k["lines"])}) for k in entries]
    except (OSError, ValueError, TypeError):
        return None
    ok = all(isinstance(k.name, str) and isinstance(k.direction, str) and isinstance(k.registers, int)
             and isinstance(k.spill_bytes, int) and all(isinstance(line, str) for line in k.lines) for k in kernels)
    return kernels if ok else None


_warned: set[Path] = set()


def _write_entry(path: Path, kernels: list[KernelCode]) -> None:
    """Write ``path`` whole: a temporary file in its folder, renamed into place. An unwritable
    folder is said once per process, on stderr, and otherwise ignored."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "w") as out:
            json.dump([asdict(k) for k in kernels], out)
        os.replace(tmp, path)
    except OSError as err:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        if _CACHE not in _warned:
            _warned.add(_CACHE)
            print(f"losslab: the SASS cache folder {_CACHE} cannot be written ({err.strerror or err}); compiling "
                  "without a cache (set TMPDIR to a writable folder to move it)", file=sys.stderr)


def rung_code(problem: problems.Problem, rung: str, arch: str = "sm_90") -> list[KernelCode] | None:
    """The float32 kernels of the rung's file as the notebooks show it (``present.ladder.kernel_path``:
    the teaching rung where there is one) compiled for ``arch``, or None where nvcc or cuobjdump is
    missing.

    Compiling a rung takes nvcc a few seconds, so results are cached per (problem, rung, arch)
    under the system's temporary folder (``losslab-sass``; TMPDIR moves it), keyed by the hash of
    the sources a measurement depends on (``records.sources_sha256``) and of the rung's own file, and
    by the compiler (:func:`compiler_key`): a changed kernel or another nvcc is compiled again. Entries are
    written whole (a temporary file renamed into place) and checked when read: a truncated or
    foreign entry is compiled again and replaced. A cache folder that cannot be written costs
    the cache, not the result (one line on stderr says so).

    Raises:
        ValueError: unknown rung.
    """
    path = kernel_path(problem, rung)
    own = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    try:
        entry = f"{problem.name}-{rung}-{own}-{arch}-{compiler_key()}-v{ENTRY_FORMAT}.json"
        key = _CACHE / records.sources_sha256(problem.name)[:16] / entry
    except BuildError:
        return None
    kernels = _read_entry(key)
    if kernels is not None:
        return kernels
    try:
        kernels = _compile(problem, rung, arch)
    except (BuildError, OSError):
        return None
    _write_entry(key, kernels)
    return kernels


def arch_of(section) -> str:
    """``sm_XY`` for a section's compute capability "X.Y" (sm_90 when it has none)."""
    cc = getattr(section, "compute_capability", "") or "9.0"
    return "sm_" + cc.replace(".", "")


NO_NVCC = ("not compiled here: nvcc (or cuobjdump) is missing on this machine, so the registers and SASS "
           "are not shown; install the CUDA toolkit to see them")


def sass_table(problem: problems.Problem, rungs: list[str], arch: str = "sm_90", direction: str | None = None) -> Html:
    """Per rung and float32 kernel (of ``direction`` if given): registers per thread and the count
    of each instruction family of :data:`FAMILIES`. One line saying so where nvcc is missing."""
    body, plain = [], []
    for rung in rungs:
        kernels = rung_code(problem, rung, arch)
        if kernels is None:
            return message(NO_NVCC)
        for k in kernels:
            if direction and k.direction != direction:
                continue
            counts = [k.count(f) for f in FAMILIES]
            body.append([f"<code>{rung}</code>", f"<code>{html.escape(k.name)}</code>", str(k.registers),
                         *map(str, counts)])
            plain.append(f"{rung:14} {k.name:48} {k.registers:3} regs  "
                         + "  ".join(f"{f} {c}" for f, c in zip(FAMILIES, counts, strict=True)))
    head = ["rung", "kernel (float32)", "registers / thread", *FAMILIES]
    caption = f"ptxas and SASS for {arch} (compiled here, no GPU needed); counts are instructions in the code"
    return Html(table(head, body, caption=caption, text_columns=2), plain="\n".join(plain))


def sass_lines(problem: problems.Problem, rung: str, direction: str = "forward", arch: str = "sm_90",
               families: tuple[str, ...] = tuple(FAMILIES), limit: int = 16) -> Html:
    """The SASS lines of ``families`` in ``rung``'s float32 ``direction`` kernels (at most
    ``limit`` per kernel), with the registers per thread: the instructions that carry the idea."""
    kernels = rung_code(problem, rung, arch)
    if kernels is None:
        return message(NO_NVCC)
    parts = []
    for k in kernels:
        if k.direction != direction:
            continue
        shown = [line for line in k.lines if any(re.search(FAMILIES[f], line) for f in families)][:limit]
        parts.append(f"// {k.name}: {k.registers} registers per thread, {k.spill_bytes} bytes spilled ({arch})\n"
                     + "\n".join(shown))
    text = "\n\n".join(parts) or f"{rung} has no {direction} kernel of its own"
    return Html(f'<pre style="font-size:11px">{html.escape(text)}</pre>', plain=text)


def loads_per_base(kernel: KernelCode) -> int:
    """The most global loads issued from one base register at distinct offsets: 4 where the
    compiler unrolled a strided loop into four independent loads (``[R6.64]``, ``[R6.64+0x400]``,
    ``+0x800``, ``+0xc00``), 1 where each load waits for the loop's next address."""
    offsets: dict[str, set[str]] = {}
    for line in kernel.lines:
        found = re.search(r"LDG\S*\s+\S+\s+desc\[\w+\]\[(R\d+)\.64(\+?-?0x[0-9a-f]+)?\]", line)
        if found:
            offsets.setdefault(found.group(1), set()).add(found.group(2) or "+0x0")
    return max((len(v) for v in offsets.values()), default=0)
