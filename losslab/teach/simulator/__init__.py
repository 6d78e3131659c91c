"""A CPU simulator of the CUDA thread hierarchy: grading the exercises without a GPU.

The one call a grader needs::

    from losslab.teach.simulator import grade_on_cpu
    grade = grade_on_cpu("vectorize", source)     # source: CUDA text, a path, or None (the skeleton)
    grade.passed                                   # bool
    grade.messages                                 # list[str], most specific first, e.g.
    # ["misaligned 16-byte load at row 1: peel the head first ... (case 2 x 37; row 1, thread 0; line 27)"]

It compiles the participant's .cu with g++ (AddressSanitizer and UBSan on) against
``cuda_sim.h``, which models blocks run one after another, a block's threads as fibers,
``__shared__`` memory, ``__syncthreads``, warp shuffles and votes (masks and convergence
checked), float4/uint4 loads that must be 16-byte aligned, atomics and the runtime calls
the exercises use; the kernels' ``kernels/common`` helpers are compiled the same way.
It runs the launchers on small designed inputs in a child process with a time limit and
compares with float64 (``cases``), then explains a wrong answer from the numbers
(``diagnose``). Its outputs match the GPU's up to float rounding (``__logf`` is ``logf``
here); races show only as far as the two thread orders it tries expose them.

Modules: ``build`` (source rewrite + g++), ``run`` (``run.run(source, problem)`` -> the
outputs or a structured failure for each case), ``cases`` (inputs and references),
``diagnose`` (messages and :func:`grade_on_cpu`). Needs g++ with libasan/libubsan (g++ 9+,
x86-64 or arm64 Linux); no CUDA, no GPU.
"""
from losslab.teach.simulator.diagnose import CpuGrade, grade_on_cpu

__all__ = ["CpuGrade", "grade_on_cpu"]
