"""Compile CUDA sources for the CPU simulator: a source rewrite, then g++ with sanitizers.

:func:`rewrite` turns the CUDA-only syntax (launches, dynamic shared memory) into calls of the
simulator, keeping every newline so that g++'s line numbers are the source's; :func:`build`
compiles the rewritten source with ``g++ -x c++ -include cuda_sim.h`` and AddressSanitizer and
UBSan (:data:`FLAGS`), and links it with the simulator, the problem's driver and the support
kernels, cached by content under ``$LOSSLAB_CACHE/simulator`` or ``~/.cache/losslab/simulator``.
"""
from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from losslab.build.knobs import KERNELS
from losslab.build.ladder import support_sources

HERE = Path(__file__).resolve().parent
CXX = os.environ.get("CXX_SIM", "g++")
FLAGS = ("-std=c++17", "-O0", "-g", "-w", "-ffp-contract=off", "-fno-omit-frame-pointer",
         "-fsanitize=address,undefined", "-fno-sanitize-recover=all")
PROBLEMS = tuple(sorted(p.stem for p in (HERE / "drivers").glob("*.cpp")))  # those with a driver under drivers/
# The kernel's name before "<<<": qualified, with template arguments nested one level.
_NAME_BEFORE = re.compile(r"([A-Za-z_]\w*(?:\s*::\s*[A-Za-z_]\w*)*"
                          r"(?:\s*<[^;{}()<>]*(?:<[^;{}()<>]*>[^;{}()<>]*)*>)?)\s*$")
_EXTERN_SHARED = re.compile(r"extern\s+__shared__\s+(?:__align__\(\s*\d+\s*\)\s+)?([A-Za-z_][\w:<> ]*?)\s+"
                            r"(?:__align__\(\s*\d+\s*\)\s+)?([A-Za-z_]\w*)\s*\[\s*\]\s*;")


_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)


class CompileError(Exception):
    """g++ rejected the source (or the link failed); the text is g++'s, with the source's lines."""


class SimulatorError(Exception):
    """The simulator itself could not be built or run here (not the participant's fault)."""


def _matching_paren(text: str, open_at: int) -> int:
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return i
    raise CompileError(f"a kernel launch's argument list never closes (from offset {open_at})")


def blank_comments(text: str) -> str:
    """``text`` with comments replaced by spaces (newlines kept): positions stay valid."""
    return _COMMENT.sub(lambda m: re.sub(r"[^\n]", " ", m[0]), text)


def _in_function(code: str, pos: int) -> bool:
    """Whether ``pos`` lies in a function body (where a statement may follow a declaration):
    the innermost open brace before it follows ``)``, another brace, ``;``, else or do."""
    depth = 0
    for i in range(pos - 1, -1, -1):
        if code[i] == "}":
            depth += 1
        elif code[i] == "{":
            if depth == 0:
                before = code[:i].rstrip()
                return before.endswith((")", "{", "}", ";", "else", "do", "const", "noexcept"))
            depth -= 1
    return False


def _split_top(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch in "<[(" and 1 or (ch in ">])" and -1 or 0)
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return parts + [text[start:]]


def _scope_end(code: str, pos: int) -> int:
    """The position of the brace that closes the block ``pos`` lies in (the end of the text if none)."""
    depth = 0
    for i in range(pos, len(code)):
        if code[i] == "{":
            depth += 1
        elif code[i] == "}":
            if depth == 0:
                return i
            depth -= 1
    return len(code)


_UPDATE = re.compile(r"\s*(?:(?:\+|-|\*|/|%|&|\||\^|<<|>>)=(?!=)|\+\+|--)")


def _accessed(code: str, start: int) -> int:
    """The end of the lvalue that starts with a name at ``start``: the name and its subscripts
    and members (``a[i][j].max``)."""
    end = start + len(re.match(r"\w+", code[start:])[0])
    while (rest := re.match(r"\s*(\[|\.\s*\w+|->\s*\w+)", code[end:])) is not None:
        end += rest.end()
        depth = rest[1] == "["  # to the matching ]
        while depth and end < len(code):
            depth += {"[": 1, "]": -1}.get(code[end], 0)
            end += 1
    return end


def _register_shared(text: str) -> str:
    """``__shared__ T a[n], b[m];`` in a function body becomes ``static T a[n], b[m];`` followed,
    on the same line, by calls that let the simulator fill them with NaN at each block's start
    (reading shared memory no thread wrote then shows as a NaN loss); each later update of an
    element of ``a`` in its block (``a[i] += v``, ``a[i]++``, ``a[i] = a[i] + v``) becomes
    ``(*::cuda_sim::update(&(a[i]), __FILE__, __LINE__)) += v``, which tells the simulator
    which thread updates which address (a lost update: ``cuda_sim.h``). Elsewhere the header's
    ``#define __shared__ static`` applies."""
    code = blank_comments(text)
    edits, done = [], 0  # (start, end, replacement) in text, in order
    for m in re.finditer(r"\b__shared__\b", code):
        end = code.find(";", m.end())
        if end < 0 or m.start() < done or not _in_function(code, m.start()):
            continue
        declarators = _split_top(code[m.end():end])
        first = re.split(r"[\[=]", declarators[0])[0].split()
        names = [first[-1].lstrip("*&")] + [re.match(r"\s*[*&]*\s*(\w+)", d)[1] for d in declarators[1:]]
        calls = "".join(f' ::cuda_sim::shared_region(&{n}, sizeof({n}), "{n}");' for n in names)
        edits += [(m.start(), m.end(), "static"), (end + 1, end + 1, calls)]
        uses = re.compile(rf"(?<![\w.:>&])({'|'.join(map(re.escape, names))})\b")
        for use in uses.finditer(code, end + 1, _scope_end(code, end + 1)):
            stop = _accessed(code, use.start())
            lvalue = code[use.start():stop]
            statement = code[stop:code.find(";", stop)]
            plain = re.match(r"\s*=(?!=)(.*)", statement, re.DOTALL)
            if _UPDATE.match(statement) or (plain and " ".join(lvalue.split()) in " ".join(plain[1].split())):
                edits.append((use.start(), stop,
                              f"(*::cuda_sim::update(&({text[use.start():stop]}), __FILE__, __LINE__))"))
        done = end + 1
    out, pos = [], 0
    for start, stop, replacement in sorted(edits, key=lambda e: (e[0], e[1])):
        if start < pos:  # an update inside another's subscript: the outer one is watched
            continue
        out += [text[pos:start], replacement]
        pos = stop
    return "".join(out) + text[pos:]


def rewrite(text: str) -> str:
    """The source with launches, dynamic shared memory and shared arrays rewritten for the
    simulator; every newline is kept. Raises CompileError for a launch it cannot parse.

    Each launch ``k<<<grid, block, smem, stream>>>(args)`` becomes a call of
    ``cuda_sim::launch``, each ``extern __shared__ T name[];`` a pointer to the launch's dynamic
    shared memory."""
    text = _EXTERN_SHARED.sub(lambda m: f"{m[1]}* {m[2]} = reinterpret_cast<{m[1]}*>(::cuda_sim::dynamic_shared());",
                              text)
    text = _register_shared(text)
    out, pos = [], 0
    while (start := text.find("<<<", pos)) >= 0:
        name = _NAME_BEFORE.search(text, pos, start)
        close = text.find(">>>", start)
        paren = text.find("(", close)
        if name is None or close < 0 or paren < 0 or text[close + 3:paren].strip():
            line = text.count("\n", 0, start) + 1
            raise CompileError(f"line {line}: cannot read this kernel launch (expected name<<<grid, block>>>(args))")
        end = _matching_paren(text, paren)
        config, args = text[start + 3:close], text[paren + 1:end]
        kernel = name[1].strip()
        label = re.sub(r"\s+", " ", kernel).replace('"', "")
        out.append(text[pos:name.start(1)])
        out.append(f'::cuda_sim::launch("{label}", ::cuda_sim::config({config}), {kernel}'
                   + (f", {args})" if args.strip() else ")"))
        pos = end + 1
    out.append(text[pos:])
    return "".join(out)


def cache_root() -> Path:
    base = os.environ.get("LOSSLAB_CACHE")
    return (Path(base) if base else Path.home() / ".cache" / "losslab") / "simulator"


def _unwritable(folder: Path, err: OSError) -> SimulatorError:
    return SimulatorError(f"the simulator's cache folder {folder} is not writable ({err.strerror or err}); "
                          "set LOSSLAB_CACHE to a writable folder to move it")


@functools.cache
def _compiler_version() -> str:
    """``CXX --version`` ("" where it cannot run: the build says so itself)."""
    try:
        return subprocess.run([CXX, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def _digest(paths) -> str:
    """The cache key: the files' paths and contents, the compiler's version and the flags."""
    h = hashlib.sha256()
    for path in sorted(paths):
        h.update(str(path).encode())
        h.update(path.read_bytes())
    h.update(" ".join((CXX, *FLAGS)).encode())
    h.update(_compiler_version().encode())
    return h.hexdigest()[:16]


def _run(cmd: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    try:
        # LC_ALL=C: plain ASCII quotes in g++'s messages, which diagnose.py's hints match.
        return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=120,
                              env=dict(os.environ, LC_ALL="C"))
    except FileNotFoundError as err:
        raise SimulatorError(f"the CPU simulator needs {CXX} (g++ 9 or newer): {err}") from err


def _compile(source: Path, obj: Path, include: Path) -> subprocess.CompletedProcess:
    return _run([CXX, "-x", "c++", *FLAGS, "-include", str(HERE / "cuda_sim.h"), "-I", str(HERE / "include"),
                 "-I", str(HERE), "-I", str(include), "-c", str(source), "-o", str(obj)])


def _remove_stale(folder: Path) -> None:
    """Remove the temporary build folders (``<name>.tmp<pid>-...``) of processes that are gone
    (a build killed before its cleanup ran); a live process's stay."""
    if not Path("/proc/self").exists():  # no way to tell a live process here
        return
    for path in folder.glob("*.tmp*-*"):
        found = re.search(r"\.tmp(\d+)-", path.name)
        if found and not Path(f"/proc/{found[1]}").exists():
            shutil.rmtree(path, ignore_errors=True)


def _atomic_dir(final: Path, fill) -> Path:
    """Build a cache folder in a temporary sibling and move it into place (parallel callers agree).

    Raises:
        SimulatorError: the cache folder cannot be written (naming it and LOSSLAB_CACHE).
    """
    if final.is_dir():
        return final
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale(final.parent)
        tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f"{final.name}.tmp{os.getpid()}-"))
    except OSError as err:  # read-only, not ours, or a file where the folder should be
        raise _unwritable(final.parent, err) from None
    try:
        fill(tmp)
        os.replace(tmp, final)
    except OSError:
        if not final.is_dir():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _support(problem: str) -> Path:
    """The cached folder with the rewritten kernels/ tree and the objects every build links."""
    kernel_files = [p for p in KERNELS.rglob("*") if p.suffix in (".cu", ".cuh", ".h") and p.is_file()]
    sim_files = [HERE / "cuda_sim.h", HERE / "cuda_sim.cpp", HERE / "driver.h", HERE / "drivers" / f"{problem}.cpp"]
    final = cache_root() / f"{problem}-{_digest(kernel_files + sim_files)}"

    def fill(tmp: Path) -> None:
        mirror = tmp / "kernels"
        for path in kernel_files:
            target = mirror / path.relative_to(KERNELS)
            target.parent.mkdir(parents=True, exist_ok=True)
            text = path.read_text()
            target.write_text(rewrite(text) if path.suffix in (".cu", ".cuh") else text)
        for i, src in enumerate((HERE / "cuda_sim.cpp", HERE / "drivers" / f"{problem}.cpp")):
            result = _compile(src, tmp / f"{i:02d}-{src.stem}.o", mirror)
            if result.returncode != 0:
                raise SimulatorError(f"the simulator could not compile {src.name}:\n{result.stderr[-3000:]}")
        skipped = []
        for i, src in enumerate(support_sources(mirror, problem), start=2):
            result = _compile(src, tmp / f"{i:02d}-{src.stem}.o", mirror)
            if result.returncode != 0:  # a construct the simulator lacks: only a source that calls it fails
                skipped.append(f"{src.relative_to(mirror)}: {(result.stderr.strip().splitlines() or [''])[0]}")
        (tmp / "skipped.txt").write_text("\n".join(skipped))

    return _atomic_dir(final, fill)


def build(problem: str, source: str, label: str = "source.cu") -> Path:
    """Compile ``source`` (CUDA C++ text) for ``problem`` and link the simulator's driver:
    returns the executable's path (cached by content).

    The support kernels (``support_sources``, rewritten the same way) are compiled once per
    content and cached, keyed by the files, g++'s version and the flags. A compile error names
    the source by ``label`` with its own line numbers. Each cache entry is built in a temporary
    folder (``<name>.tmp<pid>-...``) and renamed into place; one left by a killed build is
    removed by the next build, and a cache folder that cannot be written raises
    :class:`SimulatorError` naming it and LOSSLAB_CACHE.

    Raises:
        CompileError: g++ rejected the source or the link failed (text with ``label``'s lines).
        SimulatorError: g++ is missing, or the simulator's own files do not compile here.
    """
    if problem not in PROBLEMS:
        raise ValueError(f"problem: the simulator has no driver for {problem!r}; expected one of "
                         f"{', '.join(PROBLEMS)}")
    support = _support(problem)
    key = hashlib.sha256((label + "\0" + source).encode()).hexdigest()[:16]
    exe = support / "builds" / key / "sim"
    if exe.exists():
        return exe
    safe_label = re.sub(r'["\\\n]', "_", label)

    def fill(tmp: Path) -> None:
        src = tmp / "source.cu"
        src.write_text(f'#line 1 "{safe_label}"\n' + rewrite(source))
        result = _compile(src, tmp / "source.o", support / "kernels")
        if result.returncode != 0:
            raise CompileError(_clean(result.stderr, support))
        objects = sorted(str(p) for p in support.glob("*.o"))
        result = _run([CXX, *FLAGS, str(tmp / "source.o"), *objects, "-o", str(tmp / "sim")])
        if result.returncode != 0:
            skipped = (support / "skipped.txt").read_text().strip()
            note = f"\n(kernels the CPU simulator could not compile, so not linked:\n{skipped})" if skipped else ""
            raise CompileError(_clean(result.stderr, support) + note)

    _atomic_dir(exe.parent, fill)
    return exe


def _clean(stderr: str, support: Path) -> str:
    """g++'s messages with the cache paths replaced by the repository's."""
    text = stderr.replace(str(support / "kernels"), "kernels").replace(str(HERE) + "/", "simulator/")
    text = re.sub(r"/tmp/[^\s:]*/(source\.o|sim)", r"\1", text)
    text = re.sub(r"\S*drivers/\w+\.cpp:\d+: ", "link: ", text)  # the driver calls what the source lacks
    return text.strip()
