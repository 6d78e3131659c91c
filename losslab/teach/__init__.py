"""What participants do by hand: write their own variants, grade exercises, study mistakes, explore.

- ``custom``       your own CUDA variant of a problem for its launcher contract (``launchers.h``): built,
                   checked and benched in a child process; the ``%%losslab_variant`` magic
- ``isolated``     a GPU check in a child process with a time limit: a hang or a fault is a verdict
- ``exercises``    the graded exercises of notebook 05: a skeleton, a grade, a solution
- ``pitfalls``     the deliberate mistakes of notebook 06, run through the checker, and their records
- ``explorer``     notebook 04's selection of problem, variants, size and dtype, live or recorded
- ``environment``  what this machine can do (GPU, nvcc, ncu, cuobjdump) and each notebook's behaviour here
- ``simulator``    a CPU model of the thread hierarchy that runs exercise kernels without a GPU
"""
