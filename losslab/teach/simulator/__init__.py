"""A CPU simulator of the CUDA thread hierarchy: grading the exercises without a GPU.

``grade_on_cpu("vectorize", source)`` (CUDA text, a path, or None: the skeleton) gives ``.passed`` and
``.messages``, most specific first. The .cu is compiled with g++ (AddressSanitizer and UBSan on) against
``cuda_sim.h`` (whose header says what it models), run on small designed inputs in a child process with a
time limit, compared with float64, and a wrong answer explained from the numbers. Its outputs match the
GPU's up to float rounding (``__logf`` is ``logf``); races show only as far as the two thread orders it
tries expose them. Modules: ``build`` (source rewrite + g++), ``run`` (the outputs or a structured failure
of each case), ``cases`` (inputs and references), ``diagnose`` (messages and :func:`grade_on_cpu`).
Needs g++ with libasan/libubsan (g++ 9+, x86-64 or arm64 Linux); no CUDA, no GPU.
"""
from losslab.teach.simulator.diagnose import CpuGrade, grade_on_cpu

__all__ = ["CpuGrade", "grade_on_cpu"]
