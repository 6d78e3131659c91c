"""What the notebooks show, made from results that ``losslab.records`` holds; nothing here measures.

- ``parameters``  each notebook's parameters checked in its first code cell (one line per mistake)
- ``results``     the results a notebook shows (live through ``records.measure_section``, else the
                  newest record) and the banner naming device, run dates, versions and sources hash
- ``tables``      cost model, measured floor, checks, timings, ceilings, the list of records
- ``charts``      achieved bandwidth per implementation; the cache lines one warp load touches
- ``ladder``      the rungs' kernel sources: headers, two side by side
- ``roofline``    the roofline plot and its PNG files
- ``html``        the ``Html`` output type, ``table``, messages, byte and date formats
- ``report``      every notebook executed headless into ``reports/`` with an index page
"""
