"""Your own variant: compile CUDA you write for a problem's launcher signature, then check
it, time it and place it on the ladder beside the shipped rungs.

    from losslab.teach import custom
    mine = custom.compile_variant("kl_div", "mine", source)   # source: a str of CUDA C++
    mine(predictions, targets)                                # a 0-d loss, like the reference
    section = custom.evaluate(mine)                           # checks + bench, the ladder beside it
    workbook.check_table(section); workbook.timing_table(section); roofline.plot_roofline(section)

The source defines the problem's float32 launchers under the name ``custom``
(the exact C signatures are in :data:`CONTRACTS` and ``signature(problem)``):

kl_div (``kernels/kl_div/launchers.h``)::

    cudaError_t kl_div_custom_forward(const float* predictions,  // (B, D)
                                      const float* targets,      // (B, D)
                                      float* row_partials,       // (B,)  scratch you may use
                                      float* loss,               // ()    write sum / B here
                                      int64_t B, int64_t D, cudaStream_t stream);
    cudaError_t kl_div_custom_backward(const float* predictions,  // (B, D)
                                       const float* targets,      // (B, D)
                                       const float* grad_loss,    // ()
                                       float* grad_predictions,   // (B, D)
                                       int64_t B, int64_t D, cudaStream_t stream);

cross_entropy (``kernels/cross_entropy/launchers.h``)::

    cudaError_t cross_entropy_custom_forward(const float* logits,      // (N, C)
                                             const int64_t* targets,   // (N,)
                                             const int64_t* counts,    // (2,) n_valid, out of range
                                             float* row_losses,        // (N,) scratch you may use
                                             float* row_max,           // (N,) for the backward
                                             float* row_log_sum,       // (N,) log sum exp(x - max)
                                             float* loss,              // ()   sum over valid rows / n_valid
                                             int64_t N, int64_t C, cudaStream_t stream);
    cudaError_t cross_entropy_custom_backward(const float* logits, const int64_t* targets,
                                              const float* row_max, const float* row_log_sum,
                                              const int64_t* counts, const float* grad_loss,
                                              float* grad_logits, int64_t N, int64_t C,
                                              cudaStream_t stream);

The backward is optional: without one, the shipped ``warp_shuffle`` rung's backward runs
on what your forward saved (say so with ``backward=``). Pointers are device pointers to
contiguous data; launch on ``stream`` and return ``cudaGetLastError()``. For cross_entropy,
``counts`` is computed before your forward runs and a target out of range is refused
before any launch; rows whose target is -100 (ignore_index) count in neither the sum nor
n_valid = counts[0]. ``#include`` works relative to ``kernels/`` (``"common/reduce.cuh"``,
``"common/sum_partials.cuh"``, ``"kl_div/kl_div.cuh"``, ...); ``kernels/common/*.cu``
(``launch_sum_partials``) and, for cross_entropy, ``kernels/cross_entropy/valid_mean.cu``
(``cross_entropy_valid_mean``, declared in ``cross_entropy/launchers.h``) are linked in.

Each source builds in its own folder, ``~/.cache/losslab/custom/<problem>-<name>-<hash>/``
($LOSSLAB_CACHE moves it), named by a hash of the source and the kernels it includes: no
clash with the shipped variants or an earlier attempt, and an unchanged source is not
rebuilt. nvcc runs first on your source alone, so a compile error comes back in seconds as
a :class:`CustomCompileError` whose message gives your source's line numbers; nothing
crashes the Python process. (A kernel that faults at run time, e.g. an illegal address,
leaves the process's CUDA context unusable, as in any CUDA program: restart the kernel.)

In Jupyter, ``%load_ext losslab.teach.custom`` adds the cell magic
``%%losslab_variant <problem> <name>``, which compiles the cell into ``<name>``.
"""
from __future__ import annotations

import hashlib
import html
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch

from losslab import build
from losslab import problems

TORCH_CUDA_FLAGS = ("-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
                    "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__",
                    "--expt-relaxed-constexpr")  # what torch.utils.cpp_extension passes nvcc
DEFAULT_BACKWARD = "warp_shuffle"
_TEMPLATE_VERSION = "1"  # bump when the generated wrapper or binding changes: old builds are not reused
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def cache_root() -> Path:
    """Where custom builds live: $LOSSLAB_CACHE/custom, default ~/.cache/losslab/custom."""
    return Path(os.environ.get("LOSSLAB_CACHE", Path.home() / ".cache" / "losslab")) / "custom"


@dataclass(frozen=True)
class Contract:
    """The launchers a custom variant of one problem defines, and how Python calls them.

    ``forward``/``backward`` are the C declarations; ``forward_type``/``backward_type``
    the function-pointer types they must have; ``binding`` the pybind11 body that binds
    them as ``forward``/``backward`` taking integers (pointers, sizes, the stream);
    ``support`` the .cu files under ``kernels/`` linked in.
    """

    problem: str
    forward: str
    backward: str
    forward_type: str
    backward_type: str
    binding_forward: str
    binding_backward: str
    support: tuple[str, ...]


CONTRACTS = {
    "kl_div": Contract(
        problem="kl_div",
        forward="""cudaError_t kl_div_custom_forward(const float* predictions,  // (B, D)
                                  const float* targets,      // (B, D)
                                  float* row_partials,       // (B,)  scratch you may use
                                  float* loss,               // ()    write sum / B here
                                  int64_t B, int64_t D, cudaStream_t stream);""",
        backward="""cudaError_t kl_div_custom_backward(const float* predictions,  // (B, D)
                                   const float* targets,      // (B, D)
                                   const float* grad_loss,    // ()
                                   float* grad_predictions,   // (B, D)
                                   int64_t B, int64_t D, cudaStream_t stream);""",
        forward_type="cudaError_t (*)(const float*, const float*, float*, float*, int64_t, int64_t, cudaStream_t)",
        backward_type="cudaError_t (*)(const float*, const float*, const float*, float*, int64_t, int64_t, cudaStream_t)",
        binding_forward="""[](uintptr_t p, uintptr_t t, uintptr_t row_partials, uintptr_t loss, int64_t B, int64_t D,
       uintptr_t stream) {
        check(kl_div_custom_forward(ptr<const float>(p), ptr<const float>(t), ptr<float>(row_partials),
                                    ptr<float>(loss), B, D, reinterpret_cast<cudaStream_t>(stream)), "forward");
    }""",
        binding_backward="""[](uintptr_t p, uintptr_t t, uintptr_t grad_loss, uintptr_t grad, int64_t B, int64_t D,
       uintptr_t stream) {
        check(kl_div_custom_backward(ptr<const float>(p), ptr<const float>(t), ptr<const float>(grad_loss),
                                     ptr<float>(grad), B, D, reinterpret_cast<cudaStream_t>(stream)), "backward");
    }""",
        support=(),
    ),
    "cross_entropy": Contract(
        problem="cross_entropy",
        forward="""cudaError_t cross_entropy_custom_forward(const float* logits,      // (N, C)
                                         const int64_t* targets,   // (N,)
                                         const int64_t* counts,    // (2,)  n_valid, out of range (read)
                                         float* row_losses,        // (N,)  scratch you may use
                                         float* row_max,           // (N,)  for the backward
                                         float* row_log_sum,       // (N,)  log sum exp(x - max)
                                         float* loss,              // ()
                                         int64_t N, int64_t C, cudaStream_t stream);""",
        backward="""cudaError_t cross_entropy_custom_backward(const float* logits,       // (N, C)
                                          const int64_t* targets,    // (N,)
                                          const float* row_max,      // (N,)
                                          const float* row_log_sum,  // (N,)
                                          const int64_t* counts,     // (2,)
                                          const float* grad_loss,    // ()
                                          float* grad_logits,        // (N, C)
                                          int64_t N, int64_t C, cudaStream_t stream);""",
        forward_type=("cudaError_t (*)(const float*, const int64_t*, const int64_t*, float*, float*, float*, "
                      "float*, int64_t, int64_t, cudaStream_t)"),
        backward_type=("cudaError_t (*)(const float*, const int64_t*, const float*, const float*, const int64_t*, "
                       "const float*, float*, int64_t, int64_t, cudaStream_t)"),
        binding_forward="""[](uintptr_t x, uintptr_t t, uintptr_t counts, uintptr_t row_losses, uintptr_t row_max,
       uintptr_t row_log_sum, uintptr_t loss, int64_t N, int64_t C, uintptr_t stream) {
        check(cross_entropy_custom_forward(ptr<const float>(x), ptr<const int64_t>(t), ptr<const int64_t>(counts),
                                           ptr<float>(row_losses), ptr<float>(row_max), ptr<float>(row_log_sum),
                                           ptr<float>(loss), N, C, reinterpret_cast<cudaStream_t>(stream)),
              "forward");
    }""",
        binding_backward="""[](uintptr_t x, uintptr_t t, uintptr_t row_max, uintptr_t row_log_sum, uintptr_t counts,
       uintptr_t grad_loss, uintptr_t grad, int64_t N, int64_t C, uintptr_t stream) {
        check(cross_entropy_custom_backward(ptr<const float>(x), ptr<const int64_t>(t), ptr<const float>(row_max),
                                            ptr<const float>(row_log_sum), ptr<const int64_t>(counts),
                                            ptr<const float>(grad_loss), ptr<float>(grad), N, C,
                                            reinterpret_cast<cudaStream_t>(stream)), "backward");
    }""",
        support=("cross_entropy/valid_mean.cu",),
    ),
}


def contract(problem: str) -> Contract:
    """The launcher contract of ``problem``. Raises ValueError for a problem without one."""
    problems.get(problem)
    if problem not in CONTRACTS:
        raise ValueError(f"problem: custom variants of {problem!r} are not supported yet; "
                         f"expected one of {', '.join(CONTRACTS)}")
    return CONTRACTS[problem]


def signature(problem: str) -> str:
    """The C declarations a custom variant of ``problem`` defines (the backward optional)."""
    c = contract(problem)
    return f"{c.forward}\n\n// optional: without it the shipped {DEFAULT_BACKWARD} backward runs\n{c.backward}"


# --- compile errors, in the user's line numbers -------------------------------------------------

@dataclass(frozen=True)
class CompileMessage:
    """One nvcc diagnostic: ``line`` in the user's source (None when it is elsewhere)."""

    line: int | None
    kind: str  # "error" or "warning"
    text: str
    where: str = ""  # the file it was reported in, when not the user's source


class CustomCompileError(build.BuildError):
    """nvcc rejected a custom variant; ``messages`` holds the diagnostics, the str() lists
    them with the user's line numbers and source lines."""

    def __init__(self, message: str, messages: Sequence[CompileMessage] = ()):
        super().__init__(message)
        self.messages = list(messages)


_DIAGNOSTIC = re.compile(r"^(?P<file>[^\s(:][^(:]*?)(?:\((?P<line>\d+)\)|:(?P<gline>\d+)(?::\d+)?):\s*"
                         r"(?P<kind>catastrophic error|fatal error|error|warning)[^:]*:\s*(?P<text>.*)$")


def parse_diagnostics(output: str, user_file: str, wrapper_file: str = "") -> list[CompileMessage]:
    """nvcc's (and the host compiler's) diagnostics in ``output``, with line numbers kept for
    those in ``user_file`` (matched by file name) and the rest labelled with their file.
    A diagnostic in ``wrapper_file`` is the launcher-signature check."""
    found = []
    for raw in output.splitlines():
        match = _DIAGNOSTIC.match(raw.strip())
        if not match:
            continue
        name = Path(match["file"]).name
        kind = "warning" if match["kind"] == "warning" else "error"
        line = int(match["line"] or match["gline"])
        text = re.sub(r' \(aka "[^"]*"\)', "", match["text"]).strip()
        if name == Path(user_file).name:
            found.append(CompileMessage(line, kind, text))
        else:
            where = "the launcher-signature check" if wrapper_file and name == Path(wrapper_file).name else name
            found.append(CompileMessage(None, kind, text, where))
    return found


def format_diagnostics(messages: Sequence[CompileMessage], source: str, problem: str) -> str:
    """Each diagnostic as ``line N: error: text`` followed by that line of ``source``; a
    failed signature check is followed by the expected declarations."""
    lines = source.splitlines()
    out = []
    for m in messages:
        if m.line is not None:
            out.append(f"line {m.line}: {m.kind}: {m.text}")
            if 0 < m.line <= len(lines):
                out.append(f"  {m.line:4d} | {lines[m.line - 1]}")
        else:
            out.append(f"{m.where}: {m.kind}: {m.text}")
    if any(m.where == "the launcher-signature check" and m.kind == "error" for m in messages):
        out.append(f"your source must define the launchers of {problem} with exactly these signatures:\n"
                   + signature(problem))
    return "\n".join(out)


# --- building ------------------------------------------------------------------------------------

def source_hash(problem: str, name: str, source: str) -> str:
    """sha256 (hex) naming a build: the problem, the name, the source, the kernels it may
    include (``kernels/common`` and the problem's folder) and the architectures."""
    from losslab.records import kernels_sha256

    digest = hashlib.sha256()
    for part in (problem, name, source, kernels_sha256(problem), _archs(), torch.__version__, _TEMPLATE_VERSION):
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()



def build_dir(problem: str, name: str, source: str, root: Path | None = None) -> Path:
    """The folder a source builds in: ``<root>/<problem>-<name>-<first 16 hex of its hash>``."""
    return Path(root or cache_root()) / f"{problem}-{name}-{source_hash(problem, name, source)[:16]}"


def _archs() -> str:
    if os.environ.get("TORCH_CUDA_ARCH_LIST"):
        return os.environ["TORCH_CUDA_ARCH_LIST"]
    return build._cuda_arch_list()


def _first_arch() -> str:
    arch = _archs().replace(" ", ";").split(";")[0].replace("+PTX", "")
    return "sm_" + arch.replace(".", "")


def _wrapper(problem: str, name: str) -> str:
    c = contract(problem)
    return (f'// generated by losslab.teach.custom: your source, then a check that its launchers have\n'
            f'// the signatures the binding calls\n#include "{name}.cu"\n'
            f"[[maybe_unused]] static constexpr {c.forward_type.replace('(*)', '(*losslab_forward_check)')} = "
            f"&{problem}_custom_forward;\n")


def _wrapper_backward(problem: str) -> str:
    c = contract(problem)
    return (f"[[maybe_unused]] static constexpr {c.backward_type.replace('(*)', '(*losslab_backward_check)')} = "
            f"&{problem}_custom_backward;\n")


def _binding(problem: str, has_backward: bool) -> str:
    c = contract(problem)
    declarations = c.forward + ("\n" + c.backward if has_backward else "")
    backward = f'    m.def("backward", {c.binding_backward});\n' if has_backward else ""
    return f"""// generated by losslab.teach.custom: pybind11 only, no torch headers
#include <pybind11/pybind11.h>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <cuda_runtime.h>

{declarations}

template <typename T> static T* ptr(uintptr_t address) {{ return reinterpret_cast<T*>(address); }}
static void check(cudaError_t err, const char* what) {{
    if (err != cudaSuccess)
        throw std::runtime_error(std::string("{problem} custom ") + what + ": " + cudaGetErrorString(err));
}}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {{
    m.def("forward", {c.binding_forward});
{backward}}}
"""


def defines_backward(problem: str, source: str) -> bool:
    """True if ``source`` defines ``<problem>_custom_backward`` (comments ignored)."""
    code = re.sub(r"//[^\n]*|/\*.*?\*/", "", source, flags=re.DOTALL)
    return re.search(rf"\b{problem}_custom_backward\s*\([^;{{]*\)\s*\{{", code) is not None


def _write_if_changed(path: Path, text: str) -> None:
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


@dataclass
class CompiledSource:
    """A source that nvcc compiled for one architecture (``object_path`` holds its machine
    code, for SASS), and the warnings in the user's line numbers."""

    problem: str
    name: str
    source: str
    folder: Path
    object_path: Path
    arch: str
    has_backward: bool
    warnings: list[CompileMessage] = field(default_factory=list)

    def sass(self) -> str:
        """The SASS of every kernel in the source (needs cuobjdump: see ``build.find_cuobjdump``)."""
        return "\n".join(f"Function : {k}\n{v}" for k, v in build.disassemble(self.object_path).items())


def check_source(problem: str, source: str, name: str = "custom", *, backward: str | None = None,
                 root: Path | None = None) -> CompiledSource:
    """Compile ``source`` with nvcc for one architecture (no GPU, no Python binding): the
    fast first step of :func:`compile_variant`, also what the compile tier and a notebook
    without a GPU run.

    Args:
        backward: "source" to require the source's own backward launcher, a shipped rung's
            name to use its backward, or None: the source's if it defines one, else the
            shipped warp_shuffle backward.
    Raises:
        ValueError: unknown problem, a name that is not a C identifier, an empty source.
        CustomCompileError: nvcc's errors, with the source's line numbers.
        build.BuildError: no nvcc here.
    """
    if not _NAME.fullmatch(name or ""):
        raise ValueError(f"name: expected a C identifier such as 'my_variant', got {name!r}")
    if not source.strip():
        raise ValueError("cuda_source: the source is empty")
    contract(problem)
    has_backward = defines_backward(problem, source)
    if backward == "source" and not has_backward:
        raise ValueError(f"backward: 'source' needs the source to define {problem}_custom_backward")
    if backward not in (None, "source"):
        problems.get(problem).check_variant_name(backward)
    use_own = has_backward and backward in (None, "source")
    folder = build_dir(problem, name, source, root)
    folder.mkdir(parents=True, exist_ok=True)
    user_file, wrapper = folder / f"{name}.cu", folder / "custom_variant.cu"
    _write_if_changed(user_file, source)  # unchanged files keep their mtime: ninja does not rebuild
    _write_if_changed(wrapper, _wrapper(problem, name) + (_wrapper_backward(problem) if use_own else ""))
    _write_if_changed(folder / "binding.cpp", _binding(problem, use_own))
    arch = _first_arch()
    obj, log = folder / f"check_{arch}.o", folder / f"check_{arch}.log"
    if obj.exists() and log.exists():  # this exact source compiled before
        output, returncode = log.read_text(), 0
    else:
        cmd = [str(build.nvcc_path()), *build.NVCC_FLAGS, *TORCH_CUDA_FLAGS, "-c", f"-arch={arch}",
               "-Xcompiler", "-fPIC", "-I", str(build.KERNELS), wrapper.name, "-o", obj.name]
        result = subprocess.run(cmd, capture_output=True, text=True, cwd=folder)
        output, returncode = result.stdout + result.stderr, result.returncode
        if returncode == 0:
            log.write_text(output)
    messages = parse_diagnostics(output, user_file.name, wrapper.name)
    if returncode != 0:
        errors = [m for m in messages if m.kind == "error"] or [
            CompileMessage(None, "error", output.strip()[-2000:], "nvcc")]
        raise CustomCompileError(f"{problem} variant {name!r} does not compile (nvcc, {arch}): "
                                 f"{len(errors)} error(s)\n" + format_diagnostics(errors, source, problem), errors)
    return CompiledSource(problem, name, source, folder, obj, arch, use_own,
                          [m for m in messages if m.kind == "warning" and m.line is not None])


def compile_variant(problem: str, name: str, cuda_source: str, *, backward: str | None = None,
                    verbose: bool = False, root: Path | None = None) -> "CustomVariant":
    """Compile ``cuda_source`` (CUDA C++ defining ``<problem>_custom_forward`` and optionally
    ``<problem>_custom_backward``, see :func:`signature`) into a variant called ``name``.

    nvcc checks the source first (seconds); then ``torch.utils.cpp_extension`` builds it with
    a generated pybind11 binding in the source's own folder (:func:`build_dir`) and imports it.
    A second call with the same source reuses the build. No GPU is needed to build; calling
    the variant needs one.

    Args:
        backward: see :func:`check_source`.
        verbose: print the build's commands.
        root: the folder of builds (default :func:`cache_root`).
    Returns a :class:`CustomVariant`, callable like the reference.

    Raises:
        ValueError: unknown problem, bad name, empty source.
        CustomCompileError: the source does not compile (message in its line numbers).
        build.BuildError: no nvcc, a CPU-only torch, or the build or link failed.
    """
    compiled = check_source(problem, cuda_source, name, backward=backward, root=root)
    if torch.version.cuda is None:
        raise build.BuildError(f"cannot build: torch {torch.__version__} is a CPU-only build")
    os.environ["CUDA_HOME"] = str(build.find_cuda_home())
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", _archs())
    from torch.utils import cpp_extension

    cpp_extension.CUDA_HOME = os.environ["CUDA_HOME"]
    folder = compiled.folder
    sources = [folder / "binding.cpp", folder / "custom_variant.cu",
               *sorted((build.KERNELS / "common").glob("*.cu")),
               *(build.KERNELS / s for s in contract(problem).support)]
    out = folder / "build"
    out.mkdir(exist_ok=True)
    print(f"losslab: building {problem} variant {name!r} in {folder} ...", file=sys.stderr, flush=True)
    try:
        module = cpp_extension.load(
            name=f"losslab_custom_{folder.name.rsplit('-', 1)[1]}",
            sources=[str(s) for s in sources], extra_include_paths=[str(build.KERNELS), str(folder)],
            extra_cflags=["-O2"], extra_cuda_cflags=list(build.NVCC_FLAGS), build_directory=str(out),
            verbose=verbose)
    except (RuntimeError, subprocess.CalledProcessError, ImportError, OSError) as err:
        text = str(err)
        messages = parse_diagnostics(text, f"{name}.cu", "custom_variant.cu")
        detail = format_diagnostics(messages, cuda_source, problem) if messages else text[-3000:]
        raise CustomCompileError(f"building {problem} variant {name!r} failed:\n{detail}", messages) from None
    backward_from = None if compiled.has_backward else (backward or DEFAULT_BACKWARD)
    return CustomVariant(problem, name, cuda_source, compiled, module, backward_from)


# --- running -------------------------------------------------------------------------------------

def target_counts(targets: torch.Tensor, num_classes: int) -> torch.Tensor:
    """(2,) int64 on the targets' device: rows whose target is in [0, C), and targets outside
    [0, C) that are not ignore_index (-100). Computed with torch before a custom
    cross_entropy forward runs (one host synchronization, to refuse bad targets)."""
    ignored = targets == -100
    in_range = (targets >= 0) & (targets < num_classes)
    return torch.stack([in_range.sum(), (~in_range & ~ignored).sum()])


class _CustomFunction(torch.autograd.Function):
    """Autograd glue: forward/backward delegate to the variant's launchers."""

    @staticmethod
    def forward(ctx, variant, *inputs):
        loss, saved = variant.launch_forward(inputs)
        ctx.save_for_backward(*saved)
        ctx.variant, ctx.num_inputs = variant, len(inputs)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        grad = ctx.variant.launch_backward(ctx.saved_tensors, grad_loss) if ctx.needs_input_grad[1] else None
        return (None, grad) + (None,) * (ctx.num_inputs - 1)


class PythonVariant:
    """A variant defined by its two launch methods; callable like the reference (with autograd).

    Subclasses implement ``launch_forward(inputs, out=None, needs_grad=False, grad_out=None)
    -> (loss, saved)`` and ``launch_backward(saved, grad_loss, out=None) -> grad``, as the
    problems' launchers do; ``losslab.measure.check`` and ``losslab.measure.bench`` accept any such object
    where they take a variant's name.
    """

    problem: str
    name: str
    dtypes: tuple[torch.dtype, ...] = (torch.float32,)

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        spec = problems.get(self.problem)
        spec.validate(*inputs)
        if inputs[0].dtype not in self.dtypes:
            raise TypeError(f"predictions: {self.problem} {self.name} takes dtype "
                            f"{', '.join(map(str, self.dtypes))}, got {inputs[0].dtype}")
        return _CustomFunction.apply(self, *inputs)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.problem} {self.name!r}>"


class CustomVariant(PythonVariant):
    """A variant compiled from your CUDA source (see :func:`compile_variant`).

    Attributes:
        problem, name, source: what was compiled.
        compiled: the nvcc check's result (``.folder`` the build folder, ``.warnings``, ``.sass()``).
        module: the imported extension (``forward``/``backward`` taking pointers as integers).
        backward_from: the shipped rung whose backward runs, or None for the source's own.
    """

    def __init__(self, problem: str, name: str, source: str, compiled: CompiledSource, module,
                 backward_from: str | None):
        self.problem, self.name, self.source = problem, name, source
        self.compiled, self.module, self.backward_from = compiled, module, backward_from

    def launch_forward(self, inputs, out=None, needs_grad=False, grad_out=None):
        """Run the source's forward launcher; returns the 0-d loss (in ``out`` if given) and
        what the backward needs."""
        predictions, targets = (x.contiguous() for x in inputs)
        rows, cols = predictions.shape
        device = predictions.device
        loss = torch.empty((), device=device, dtype=torch.float32) if out is None else out
        with torch.cuda.device(device):
            stream = torch.cuda.current_stream(device).cuda_stream
            if self.problem == "kl_div":
                row_partials = torch.empty(rows, device=device, dtype=torch.float32)
                self.module.forward(predictions.data_ptr(), targets.data_ptr(), row_partials.data_ptr(),
                                    loss.data_ptr(), rows, cols, stream)
                return loss, (predictions, targets)
            counts = target_counts(targets, cols)
            if int(counts[1]) > 0:  # before any launch: your kernels never see a bad target
                from losslab.problems.cross_entropy import out_of_range_message

                raise ValueError(out_of_range_message(targets, cols))
            row_losses, row_max, row_log_sum = torch.empty(3, rows, device=device, dtype=torch.float32)
            self.module.forward(predictions.data_ptr(), targets.data_ptr(), counts.data_ptr(),
                                row_losses.data_ptr(), row_max.data_ptr(), row_log_sum.data_ptr(), loss.data_ptr(),
                                rows, cols, stream)
        return loss, (predictions, targets, row_max, row_log_sum, counts)

    def launch_backward(self, saved, grad_loss, out=None):
        """Run the source's backward launcher (or the shipped ``backward_from`` rung's):
        the gradient w.r.t. the first input, scaled by the 0-d ``grad_loss``."""
        if self.backward_from is not None:
            return problems.get(self.problem).launch_backward(self.backward_from, saved, grad_loss, out=out)
        predictions = saved[0]
        rows, cols = predictions.shape
        grad_loss = grad_loss.to(device=predictions.device, dtype=torch.float32).contiguous()
        grad = torch.empty_like(predictions) if out is None else out
        with torch.cuda.device(predictions.device):
            stream = torch.cuda.current_stream(predictions.device).cuda_stream
            if self.problem == "kl_div":
                targets = saved[1]
                self.module.backward(predictions.data_ptr(), targets.data_ptr(), grad_loss.data_ptr(),
                                     grad.data_ptr(), rows, cols, stream)
            else:
                targets, row_max, row_log_sum, counts = saved[1:]
                self.module.backward(predictions.data_ptr(), targets.data_ptr(), row_max.data_ptr(),
                                     row_log_sum.data_ptr(), counts.data_ptr(), grad_loss.data_ptr(),
                                     grad.data_ptr(), rows, cols, stream)
        return grad

    def _repr_html_(self) -> str:
        backward = "its own" if self.backward_from is None else f"the shipped {self.backward_from} rung's"
        warnings = "".join(f"<br>line {w.line}: warning: {html.escape(w.text)}" for w in self.compiled.warnings)
        return (f"<p>{self.problem} variant <code>{html.escape(self.name)}</code>: compiled in "
                f"<code>{html.escape(str(self.compiled.folder))}</code>; backward: {backward}.{warnings}</p>")


# --- evaluating: checks, bench, the ladder beside it ----------------------------------------------

def evaluate(variant: PythonVariant, size: str = "small", *, sizes: Sequence[str] | None = None,
             ladder: Sequence[str] | None = None, repeats: int = 20, edge_cases: bool = True,
             compile_peer: bool = False) -> dict:
    """Check ``variant`` and time it beside the ladder and the PyTorch peers (needs a GPU).

    Checks run at ``sizes`` (default: every size but the seed) and on the edge cases; the
    bench times ``variant``, the ``ladder`` rungs (default all) and the peers (eager, and
    ``torch.compile`` if ``compile_peer``) at ``size``. Returns a section shaped like a live
    ``workbook.load_results`` section (``source`` "live"), for ``workbook.check_table``,
    ``workbook.timing_table``, ``workbook.bandwidth_chart`` and ``roofline.plot_roofline``.

    Raises:
        RuntimeError: no CUDA GPU.
    """
    from losslab import records
    from losslab.measure.bench import bench_problem
    from losslab.measure.check import check_edge_cases, check_variant
    from losslab.present.roofline import measure_bandwidth

    if not torch.cuda.is_available():
        raise RuntimeError("evaluate needs a CUDA GPU and none is visible here")
    spec = problems.get(variant.problem)
    sizes = list(sizes or [s for s in spec.sizes if s != "seed"])
    checks = [c for s in sizes for c in check_variant(variant.problem, variant, spec.sizes[s])]
    if edge_cases:
        checks += check_edge_cases(variant.problem, variant)
    shape = spec.sizes[size]
    bandwidth = measure_bandwidth()
    rungs = list(spec.variants if ladder is None else ladder)
    rows = bench_problem(variant.problem, shape, [*rungs, variant], repeats=repeats, bandwidth=bandwidth,
                         peers=("eager", "compile") if compile_peer else ("eager",))
    section = records.provenance(variant.problem)
    section.update(shape=list(shape), dtype="float32", repeats=repeats, bandwidth_gbps=bandwidth,
                   rows=[r.as_dict() for r in rows], checks=[c.as_dict() for c in checks])
    return {**section, "problem": variant.problem, "source": "live"}


# --- the cell magic ---------------------------------------------------------------------------------

def load_ipython_extension(ipython) -> None:
    """``%load_ext losslab.teach.custom``: adds ``%%losslab_variant <problem> <name> [backward rung]``,
    which compiles the cell and binds the variant to ``<name>`` in the notebook. A compile
    error is printed with line numbers counted from the line after the magic (no traceback)
    and binds nothing."""

    def losslab_variant(line, cell):
        words = line.split()
        if len(words) not in (2, 3):
            print("usage: %%losslab_variant <problem> <name> [backward rung]", file=sys.stderr)
            return None
        problem, name = words[:2]
        try:
            variant = compile_variant(problem, name, cell, backward=words[2] if len(words) == 3 else None)
        except (build.BuildError, ValueError) as err:
            print(err, file=sys.stderr)
            return None
        ipython.user_ns[name] = variant
        return variant

    ipython.register_magic_function(losslab_variant, "cell", "losslab_variant")
