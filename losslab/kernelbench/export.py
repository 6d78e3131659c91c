"""Export one rung of a ladder as a single-file KernelBench solution.

    python -m losslab export kl_div vectorized > solution.py

The file is self-contained (it needs torch, nvcc and nothing of losslab):

* ``Model``: the problem's PyTorch reference, as KernelBench's level-1 problem defines it;
* ``get_inputs()`` / ``get_init_inputs()``: the problem's seed size and input generator
  (CPU tensors from the global RNG, as KernelBench expects);
* ``ModelNew``: the same forward signature and the same 0-d loss, computed by the rung's
  kernels. Its sources (``kernels/<problem>/<variant>.cu``, the problem's second-stage
  ``.cu`` files, ``kernels/common/*.cu`` and every local header they include, each once)
  are inlined as text and built with ``torch.utils.cpp_extension.load_inline`` on the first
  ``ModelNew()``. The build has no torch headers (a pybind11 binding of the launchers, as in
  ``losslab/csrc/``), so it takes seconds; the host code that allocates the buffers and
  launches the kernels is Python, inside a ``torch.autograd.Function``, so ``loss.backward()``
  runs the rung's backward kernels too.
"""
from __future__ import annotations

import re
from pathlib import Path

from losslab import problems
from losslab.build import KERNELS

_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
_PRAGMA_ONCE = re.compile(r"^\s*#\s*pragma\s+once\b")


class ExportError(ValueError):
    """A source cannot be inlined (a local include not found, or text that cannot be quoted)."""


def inline_includes(path: Path, seen: set[Path] | None = None) -> str:
    """The text of ``path`` with every ``#include "..."`` replaced by the included file's text,
    recursively. A file with ``#pragma once`` is inlined the first time only (``seen`` carries
    that across calls, as one translation unit would); ``#include <...>`` lines stay.

    Quoted includes resolve against the including file's folder, then ``kernels/`` (the
    ``-I`` the package's own build uses).

    Raises:
        ExportError: an included file exists in neither place.
    """
    seen = set() if seen is None else seen
    path = path.resolve()
    text = path.read_text()
    once = any(_PRAGMA_ONCE.match(line) for line in text.splitlines())
    if once and path in seen:
        return ""
    seen.add(path)
    name = path.relative_to(KERNELS) if KERNELS in path.parents else path.name
    lines = [f"// ---- kernels/{name} ----"]
    for line in text.splitlines():
        match = _INCLUDE.match(line)
        if match:
            target = next((p for p in (path.parent / match.group(1), KERNELS / match.group(1)) if p.is_file()),
                          None)
            if target is None:
                raise ExportError(f"{path}: cannot find the included file {match.group(1)!r} "
                                  f"(looked in {path.parent} and {KERNELS})")
            lines.append(inline_includes(target, seen))
        elif not _PRAGMA_ONCE.match(line):
            lines.append(line)
    return "\n".join(lines)


def kernel_files(problem: str, variant: str) -> list[Path]:
    """The ``.cu`` files one rung needs: its own, the problem's files that are not a rung
    (second stages such as ``cross_entropy/valid_mean.cu``) and ``kernels/common/*.cu``.

    Raises:
        ValueError: unknown problem or variant.
    """
    spec = problems.get(problem)
    spec.check_variant_name(variant)
    support = [p for p in sorted((KERNELS / problem).glob("*.cu")) if p.stem not in spec.variants]
    return [KERNELS / problem / f"{variant}.cu", *support, *sorted((KERNELS / "common").glob("*.cu"))]


def cuda_source(problem: str, variant: str) -> str:
    """One CUDA translation unit holding the rung's kernels and launchers, free of local includes."""
    seen: set[Path] = set()
    return "\n\n".join(inline_includes(path, seen) for path in kernel_files(problem, variant))


def _raw(text: str) -> str:
    """``text`` as a Python raw triple-quoted literal, kept readable."""
    if "'''" in text:
        raise ExportError("a kernel source contains ''' and cannot be quoted as a raw string")
    return "r'''\n" + text.rstrip() + "\n'''"


# --- per problem: the reference, KernelBench's inputs, the binding and the host code ----------

_HEADER = '''\
"""{title}: a single-file KernelBench solution exported by losslab.

    python -m losslab export {problem} {variant} > solution.py
    python -m losslab evaluate solution.py --problem {problem}

Model is the PyTorch reference, get_inputs()/get_init_inputs() give KernelBench's inputs,
and ModelNew computes the same 0-d loss with losslab's `{variant}` kernels, built with
torch.utils.cpp_extension.load_inline on the first ModelNew() (CUDA_HOME must name the CUDA
toolkit; set TORCH_CUDA_ARCH_LIST to build for other GPUs than the visible one).
ModelNew supports autograd: loss.backward() runs the rung's backward kernels.
{note}"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.cpp_extension import load_inline
'''

_KL_DIV_MODEL = '''

class Model(nn.Module):
    """KL divergence with reduction="batchmean" (KernelBench level 1, 98_KLDivLoss).

    predictions, targets: (B, D) probability rows. Returns a 0-d tensor: the sum over all
    elements of t * (log t - log p), divided by B (not B * D).
    """

    def __init__(self):
        super().__init__()

    def forward(self, predictions, targets):
        return F.kl_div(torch.log(predictions), targets, reduction="batchmean")


batch_size = {rows}
input_shape = ({cols},)


def get_inputs():
    scale = torch.rand(())
    return [(torch.rand(batch_size, *input_shape) * scale).softmax(dim=-1),
            torch.rand(batch_size, *input_shape).softmax(dim=-1)]


def get_init_inputs():
    return []
'''

_CROSS_ENTROPY_MODEL = '''

class Model(nn.Module):
    """Cross-entropy over class indices, mean over the rows (KernelBench level 1, 95_CrossEntropyLoss).

    predictions: (N, C) logits; targets: (N,) int64 class indices (-100 = ignore_index).
    Returns a 0-d tensor.
    """

    def __init__(self):
        super().__init__()

    def forward(self, predictions, targets):
        return F.cross_entropy(predictions, targets)


batch_size = {rows}
num_classes = {cols}
input_shape = (num_classes,)


def get_inputs():
    return [torch.rand(batch_size, *input_shape), torch.randint(0, num_classes, (batch_size,))]


def get_init_inputs():
    return []
'''

# pybind11 only (no torch headers): Python passes data pointers, sizes, the dtype code and
# the CUDA stream as integers, as losslab/csrc/<problem>.cpp does.
_BINDING_PRELUDE = '''\
#include <pybind11/pybind11.h>
#include <cstdint>
#include <stdexcept>
#include <string>
{launchers}

template <typename T>
static T* ptr(uintptr_t address) {{ return reinterpret_cast<T*>(address); }}

static void check(cudaError_t err, const char* what) {{
    if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}}
'''

_KL_DIV_BINDING = '''
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {{
    m.def("forward", [](uintptr_t p, uintptr_t t, uintptr_t row_partials, uintptr_t loss, int64_t B,
                        int64_t D, int dtype, uintptr_t stream) {{
        check(kl_div_{variant}_forward(ptr<const {elem}>(p), ptr<const {elem}>(t), ptr<float>(row_partials),
                                       ptr<float>(loss), B, D, {dtype_arg}ptr<CUstream_st>(stream)),
              "kl_div {variant} forward");
    }});
    m.def("backward", [](uintptr_t p, uintptr_t t, uintptr_t grad_loss, uintptr_t grad, int64_t B,
                         int64_t D, int dtype, uintptr_t stream) {{
        check(kl_div_{variant}_backward(ptr<const {elem}>(p), ptr<const {elem}>(t), ptr<const float>(grad_loss),
                                        ptr<{elem}>(grad), B, D, {dtype_arg}ptr<CUstream_st>(stream)),
              "kl_div {variant} backward");
    }});
}}
'''

_KL_DIV_FUSED_BINDING = '''
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("forward", [](uintptr_t p, uintptr_t t, uintptr_t row_partials, uintptr_t loss, uintptr_t grad,
                        int64_t B, int64_t D, int dtype, uintptr_t stream) {
        check(kl_div_fused_forward(ptr<const void>(p), ptr<const void>(t), ptr<float>(row_partials),
                                   ptr<float>(loss), ptr<void>(grad), B, D, DType(dtype),
                                   ptr<CUstream_st>(stream)),
              "kl_div fused forward");
    });
    m.def("backward", [](uintptr_t grad, uintptr_t grad_loss, int64_t n, int dtype, uintptr_t stream) {
        check(kl_div_fused_backward(ptr<void>(grad), ptr<const float>(grad_loss), n, DType(dtype),
                                    ptr<CUstream_st>(stream)),
              "kl_div fused backward");
    });
}
'''

_CROSS_ENTROPY_COUNT = '''
    m.def("count_targets", [](uintptr_t t, uintptr_t counts, int64_t N, int64_t C, uintptr_t stream) {{
        check(cross_entropy_count_targets(ptr<const int64_t>(t), ptr<int64_t>(counts), N, C, ptr<CUstream_st>(stream)),
              "cross_entropy count_targets");
    }});'''

_CROSS_ENTROPY_BINDING = '''
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {{{count}
    m.def("forward", [](uintptr_t x, uintptr_t t, uintptr_t counts, uintptr_t row_losses, uintptr_t row_max,
                        uintptr_t row_log_sum, uintptr_t loss, int64_t N, int64_t C, int dtype, uintptr_t stream) {{
        check(cross_entropy_{variant}_forward(ptr<const {elem}>(x), ptr<const int64_t>(t), ptr<const int64_t>(counts),
                                              ptr<float>(row_losses), ptr<float>(row_max), ptr<float>(row_log_sum),
                                              ptr<float>(loss), N, C, {dtype_arg}ptr<CUstream_st>(stream)),
              "cross_entropy {variant} forward");
    }});
    m.def("backward", [](uintptr_t x, uintptr_t t, uintptr_t row_max, uintptr_t row_log_sum, uintptr_t counts,
                         uintptr_t grad_loss, uintptr_t grad, int64_t N, int64_t C, int dtype, uintptr_t stream) {{
        check(cross_entropy_{variant}_backward(ptr<const {elem}>(x), ptr<const int64_t>(t), ptr<const float>(row_max),
                                               ptr<const float>(row_log_sum), ptr<const int64_t>(counts),
                                               ptr<const float>(grad_loss), ptr<{elem}>(grad), N, C,
                                               {dtype_arg}ptr<CUstream_st>(stream)),
              "cross_entropy {variant} backward");
    }});
}}
'''

_CROSS_ENTROPY_FUSED_BINDING = '''
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {{{count}
    m.def("forward", [](uintptr_t x, uintptr_t t, uintptr_t counts, uintptr_t row_losses, uintptr_t loss,
                        uintptr_t grad, int64_t N, int64_t C, int dtype, uintptr_t stream) {{
        check(cross_entropy_fused_forward(ptr<const void>(x), ptr<const int64_t>(t), ptr<const int64_t>(counts),
                                          ptr<float>(row_losses), ptr<float>(loss), ptr<void>(grad), N, C,
                                          DType(dtype), ptr<CUstream_st>(stream)),
              "cross_entropy fused forward");
    }});
    m.def("backward", [](uintptr_t grad, uintptr_t grad_loss, int64_t n, int dtype, uintptr_t stream) {{
        check(cross_entropy_fused_backward(ptr<void>(grad), ptr<const float>(grad_loss), n, DType(dtype),
                                           ptr<CUstream_st>(stream)),
              "cross_entropy fused backward");
    }});
}}
'''

_LOAD = '''

CUDA_SOURCE = {cuda}

CPP_SOURCE = {cpp}

_extension = None


def extension():
    """Build (once per process; cached on disk by torch) and import the kernels."""
    global _extension
    if _extension is None:
        _extension = load_inline(name="{name}", cpp_sources=[CPP_SOURCE], cuda_sources=[CUDA_SOURCE],
                                 extra_cuda_cflags=["-O3", "-std=c++17"], no_implicit_headers=True)
    return _extension


DTYPE_CODES = {{torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}}  # kernels/common/dtype.h
DTYPES = {dtypes}


def check_inputs(predictions, targets):
    if not (isinstance(predictions, torch.Tensor) and isinstance(targets, torch.Tensor)):
        raise TypeError("predictions, targets: expected tensors")
    if predictions.device.type != "cuda" or targets.device != predictions.device:
        raise ValueError(f"expected both inputs on one CUDA device, got {{predictions.device}} and {{targets.device}}")
    if predictions.dtype not in DTYPES:
        raise TypeError(f"predictions: expected dtype {{DTYPES}}, got {{predictions.dtype}}")
    if predictions.dim() != 2 or predictions.numel() == 0:
        raise ValueError(f"predictions: expected a non-empty (rows, columns) tensor, got {{tuple(predictions.shape)}}")
'''

_KL_DIV_HOST = '''

class KLDivFunction(torch.autograd.Function):
    """Forward and backward of the {variant} kernels; losslab.problems.kl_div does the same."""

    @staticmethod
    def forward(ctx, predictions, targets):
        p, t = predictions.contiguous(), targets.contiguous()
        B, D = p.shape
        row_partials = torch.empty(B, device=p.device, dtype=torch.float32)
        loss = torch.empty((), device=p.device, dtype=torch.float32)
        with torch.cuda.device(p.device):
            stream = torch.cuda.current_stream(p.device).cuda_stream
            extension().forward(p.data_ptr(), t.data_ptr(), row_partials.data_ptr(), loss.data_ptr(), B, D,
                                DTYPE_CODES[p.dtype], stream)
        ctx.save_for_backward(p, t)
        return loss.to(p.dtype)  # accumulated and written in fp32

    @staticmethod
    def backward(ctx, grad_loss):
        p, t = ctx.saved_tensors
        grad_loss = grad_loss.to(device=p.device, dtype=torch.float32).contiguous()
        grad = torch.empty_like(p)
        with torch.cuda.device(p.device):
            stream = torch.cuda.current_stream(p.device).cuda_stream
            extension().backward(p.data_ptr(), t.data_ptr(), grad_loss.data_ptr(), grad.data_ptr(), *p.shape,
                                 DTYPE_CODES[p.dtype], stream)
        return grad, None
'''

_KL_DIV_FUSED_HOST = '''

class KLDivFunction(torch.autograd.Function):
    """The fused rung: the forward also writes dL/dp (for grad_loss = 1), the backward scales it
    in place. Its .cu has no loss-only forward, so inference writes the gradient too: export
    `vectorized` for inference."""

    @staticmethod
    def forward(ctx, predictions, targets):
        p, t = predictions.contiguous(), targets.contiguous()
        B, D = p.shape
        row_partials = torch.empty(B, device=p.device, dtype=torch.float32)
        loss = torch.empty((), device=p.device, dtype=torch.float32)
        grad = torch.empty_like(p)
        with torch.cuda.device(p.device):
            stream = torch.cuda.current_stream(p.device).cuda_stream
            extension().forward(p.data_ptr(), t.data_ptr(), row_partials.data_ptr(), loss.data_ptr(),
                                grad.data_ptr(), B, D, DTYPE_CODES[p.dtype], stream)
        ctx.save_for_backward(grad)
        ctx.backward_calls = 0
        return loss.to(p.dtype)

'''

_FUSED_BACKWARD = '''
    @staticmethod
    def backward(ctx, grad_loss):
        if ctx.backward_calls:
            raise RuntimeError("{problem} fused: backward can run once per forward (it scales in place)")
        ctx.backward_calls += 1
        (grad,) = ctx.saved_tensors
        grad_loss = grad_loss.to(device=grad.device, dtype=torch.float32).contiguous()
        with torch.cuda.device(grad.device):
            stream = torch.cuda.current_stream(grad.device).cuda_stream
            extension().backward(grad.data_ptr(), grad_loss.data_ptr(), grad.numel(), DTYPE_CODES[grad.dtype],
                                 stream)
        return grad, None
'''

_KL_DIV_MODEL_NEW = '''

class ModelNew(nn.Module):
    """Model's loss computed by losslab's kl_div {variant} kernels (same signature, same 0-d output)."""

    def __init__(self):
        super().__init__()
        extension()  # build now, not inside the first timed call

    def forward(self, predictions, targets):
        check_inputs(predictions, targets)
        if targets.shape != predictions.shape or targets.dtype != predictions.dtype:
            raise ValueError(f"targets: expected {{tuple(predictions.shape)}} {{predictions.dtype}}, "
                             f"got {{tuple(targets.shape)}} {{targets.dtype}}")
        if targets.requires_grad:
            raise ValueError("targets: the kernels give no gradient for targets; pass targets.detach()")
        return KLDivFunction.apply(predictions, targets)
'''

_CROSS_ENTROPY_HOST = '''

IGNORE_INDEX = -100


def count_targets(x, t, stream):
    """counts (2,) int64 = (rows with a class target, targets outside [0, C) that are not IGNORE_INDEX)."""
    counts = torch.empty(2, device=x.device, dtype=torch.int64)
    extension().count_targets(t.data_ptr(), counts.data_ptr(), *x.shape, stream)
    return counts


def raise_if_out_of_range(counts, C):
    if int(counts[1]) > 0:  # one host synchronization: a bad target is an error, never a wrong number
        raise ValueError(f"targets: {{int(counts[1])}} class index(es) outside [0, {{C}}) "
                         f"that are not ignore_index ({{IGNORE_INDEX}})")
'''

_CROSS_ENTROPY_FUNCTION = '''

class CrossEntropyFunction(torch.autograd.Function):
    """Forward and backward of the {variant} kernels; losslab.problems.cross_entropy does the same."""

    @staticmethod
    def forward(ctx, logits, targets):
        x, t = logits.contiguous(), targets.contiguous()
        N, C = x.shape
        row_losses, row_max, row_log_sum = torch.empty(3, N, device=x.device, dtype=torch.float32)
        loss = torch.empty((), device=x.device, dtype=torch.float32)
        with torch.cuda.device(x.device):
            stream = torch.cuda.current_stream(x.device).cuda_stream
            counts = count_targets(x, t, stream)
            extension().forward(x.data_ptr(), t.data_ptr(), counts.data_ptr(), row_losses.data_ptr(),
                                row_max.data_ptr(), row_log_sum.data_ptr(), loss.data_ptr(), N, C,
                                DTYPE_CODES[x.dtype], stream)
        raise_if_out_of_range(counts, C)
        ctx.save_for_backward(x, t, row_max, row_log_sum, counts)
        return loss.to(x.dtype)  # accumulated and written in fp32

    @staticmethod
    def backward(ctx, grad_loss):
        x, t, row_max, row_log_sum, counts = ctx.saved_tensors
        grad_loss = grad_loss.to(device=x.device, dtype=torch.float32).contiguous()
        grad = torch.empty_like(x)
        with torch.cuda.device(x.device):
            stream = torch.cuda.current_stream(x.device).cuda_stream
            extension().backward(x.data_ptr(), t.data_ptr(), row_max.data_ptr(), row_log_sum.data_ptr(),
                                 counts.data_ptr(), grad_loss.data_ptr(), grad.data_ptr(), *x.shape,
                                 DTYPE_CODES[x.dtype], stream)
        return grad, None
'''

_CROSS_ENTROPY_FUSED_FUNCTION = '''

class CrossEntropyFunction(torch.autograd.Function):
    """The fused rung: the forward also writes dL/dx (for grad_loss = 1), the backward scales it
    in place. Its .cu has no loss-only forward, so inference writes the gradient too: export
    `vectorized` for inference."""

    @staticmethod
    def forward(ctx, logits, targets):
        x, t = logits.contiguous(), targets.contiguous()
        N, C = x.shape
        row_losses = torch.empty(N, device=x.device, dtype=torch.float32)
        loss = torch.empty((), device=x.device, dtype=torch.float32)
        grad = torch.empty_like(x)
        with torch.cuda.device(x.device):
            stream = torch.cuda.current_stream(x.device).cuda_stream
            counts = count_targets(x, t, stream)
            extension().forward(x.data_ptr(), t.data_ptr(), counts.data_ptr(), row_losses.data_ptr(),
                                loss.data_ptr(), grad.data_ptr(), N, C, DTYPE_CODES[x.dtype], stream)
        raise_if_out_of_range(counts, C)
        ctx.save_for_backward(grad)
        ctx.backward_calls = 0
        return loss.to(x.dtype)

'''

_CROSS_ENTROPY_MODEL_NEW = '''

class ModelNew(nn.Module):
    """Model's loss computed by losslab's cross_entropy {variant} kernels (same signature, same 0-d output)."""

    def __init__(self):
        super().__init__()
        extension()  # build now, not inside the first timed call

    def forward(self, predictions, targets):
        check_inputs(predictions, targets)
        if targets.dtype != torch.int64 or targets.shape != predictions.shape[:1]:
            raise ValueError(f"targets: expected ({{predictions.shape[0]}},) int64 class indices, "
                             f"got {{tuple(targets.shape)}} {{targets.dtype}}")
        return CrossEntropyFunction.apply(predictions, targets)
'''


_FUSED_NOTE = ("\nfused writes the gradient in the forward even without autograd (its .cu has no\n"
               "loss-only kernel): export `vectorized` for inference.\n")


def export_solution(problem: str, variant: str) -> str:
    """The text of a single-file KernelBench solution (see the module docstring) for one rung.

    Returns Python source defining ``Model``, ``ModelNew``, ``get_inputs`` and
    ``get_init_inputs``; nothing is compiled until ``ModelNew()`` is constructed.

    Raises:
        ValueError: unknown problem or variant (ExportError, a ValueError, if a source
            cannot be inlined).
    """
    spec = problems.get(problem)
    spec.check_variant_name(variant)
    rows, cols = spec.sizes["seed"]
    launchers = inline_includes(KERNELS / problem / "launchers.h")
    prelude = _BINDING_PRELUDE.format(launchers=launchers)
    dtypes = "(" + ", ".join(str(d) for d in spec.dtypes(variant)) + ",)"
    note = ""
    typed = len(spec.dtypes(variant)) > 1  # templated kernels that take a dtype code
    if problem == "kl_div":
        model = _KL_DIV_MODEL.format(rows=rows, cols=cols)
        if variant == "fused":
            binding, note = _KL_DIV_FUSED_BINDING, _FUSED_NOTE
            host = _KL_DIV_FUSED_HOST.rstrip() + "\n" + _FUSED_BACKWARD.format(problem=problem)
        else:
            binding = _KL_DIV_BINDING.format(variant=variant, elem="void" if typed else "float",
                                             dtype_arg="DType(dtype), " if typed else "")
            host = _KL_DIV_HOST.format(variant=variant)
        host += _KL_DIV_MODEL_NEW.format(variant=variant)
    elif problem == "cross_entropy":
        model = _CROSS_ENTROPY_MODEL.format(rows=rows, cols=cols)
        count = _CROSS_ENTROPY_COUNT.format()
        if variant == "fused":
            binding = _CROSS_ENTROPY_FUSED_BINDING.format(count=count)
            host = (_CROSS_ENTROPY_HOST.format() + _CROSS_ENTROPY_FUSED_FUNCTION.rstrip() + "\n"
                    + _FUSED_BACKWARD.format(problem=problem))
            note = _FUSED_NOTE
        else:
            binding = _CROSS_ENTROPY_BINDING.format(count=count, variant=variant, elem="void" if typed else "float",
                                                    dtype_arg="DType(dtype), " if typed else "")
            host = _CROSS_ENTROPY_HOST.format() + _CROSS_ENTROPY_FUNCTION.format(variant=variant)
        host += _CROSS_ENTROPY_MODEL_NEW.format(variant=variant)
    else:  # a new problem needs its reference, binding and host code here
        raise ValueError(f"problem: export does not know {problem!r} yet")
    title = f"{problem} ({variant} kernels)"
    load = _LOAD.format(cuda=_raw(cuda_source(problem, variant)), cpp=_raw(prelude + binding),
                        name=f"losslab_solution_{problem}_{variant}", dtypes=dtypes)
    return (_HEADER.format(title=title, problem=problem, variant=variant, note=note)
            + model + load + host)
