"""What the notebooks show, made from results that ``losslab.records`` holds; nothing here measures.

``parameters`` (each notebook's parameters, checked), ``results`` (live or the newest record, and the
banner saying which), ``tables``, ``charts``, ``roofline``, ``ladder`` (the rungs' kernel sources, side
by side and as diffs), ``machine_code`` (registers and SASS, nvcc, no GPU), ``listings`` (the SASS
quoted beside the prose), ``evidence`` (each claim with its recorded numbers), ``html`` (the output
type and formats) and ``report`` (every notebook executed into ``reports/``); each says more in its
own docstring.
"""
