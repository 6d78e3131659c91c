"""What the notebooks show, made from results that ``losslab.records`` holds; nothing here measures.

- ``parameters``  each notebook's parameters checked in its first code cell (one line per mistake)
- ``results``     the results a notebook shows (live through ``records.measure_section``, else the
                  newest record) and the banner naming device, run dates, versions and sources hash
- ``tables``      cost model, measured floor, checks, timings, ceilings, the list of records
- ``charts``      achieved bandwidth per implementation; time and bandwidth against size (log axes);
                  the cache lines one warp load touches
- ``ladder``      the rungs' kernel sources: headers, two side by side, adjacent rungs as a diff
                  with the helpers they rely on inlined
- ``machine_code`` ptxas registers per thread and the SASS lines that carry each rung's idea (nvcc, no GPU)
- ``listings``    the SASS quoted beside the prose: a rung's own kernel of a direction, uncut, and the
                  load offsets the prose cites, read from that listing
- ``evidence``    each step's x rung below, naive's launch against the SM count, the ncu counters per
                  rung, the notebooks' claims checked on the record, predictions scored
- ``roofline``    the roofline plot (FP32, MUFU and bandwidth roofs, datasheet peak) and its PNG files
- ``html``        the ``Html`` output type, ``table``, messages, byte and date formats
- ``report``      every notebook executed headless into ``reports/`` with an index page
"""
