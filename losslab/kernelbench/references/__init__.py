"""Each problem's KernelBench level-1 problem file (``Model``, ``get_inputs``, ``get_init_inputs``),
as KernelBench writes it, at the problem's seed size: what ``losslab export`` puts at the top of a
single-file solution."""
