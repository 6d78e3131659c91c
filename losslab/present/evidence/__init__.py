"""The evidence for each step of a ladder, read from a record: what the notebooks claim about a
rung, stated once here with the numbers that support it, so that prose and data cannot part.

One module per job: ``steps`` (× rung below per direction, naive's launch against the SM count),
``counters`` (the Nsight Compute counters per rung, and rows whose work was done elsewhere),
``claims`` (each claim a notebook makes, checked on the record), ``predictions`` (the reader's
predicted times scored) and ``long_rows`` (cross_entropy's rows too long for one SM, and cluster).
Every public name is re-exported here: ``evidence.<name>`` is the way to use them.
"""
from losslab.present.evidence.claims import (
    GENERIC,
    Claim,
    claim_keys,
    claims,
    claims_table,
    declared,
    fraction_of_ceiling,
    fraction_statement,
    roof_claims,
)
from losslab.present.evidence.counters import (
    COUNTERS,
    ELSEWHERE_SHARE,
    MEANINGS,
    NOT_RECORDED,
    STALL_MEANING,
    WHY_ELSEWHERE,
    Elsewhere,
    counters,
    counters_table,
    dram_over_minimum,
    mufu_headroom,
    ncu_record,
    work_elsewhere,
    work_elsewhere_note,
)
from losslab.present.evidence.long_rows import (
    CLUSTER_SASS,
    LONG_ROW_DTYPES,
    LONG_ROWS,
    READ_ONCE_CASES,
    RERECORD,
    LongRow,
    cluster_claims,
    cluster_machine_code,
    long_rows,
    long_rows_after,
    long_rows_before,
    split_rung,
)
from losslab.present.evidence.predictions import predict, score_prediction
from losslab.present.evidence.steps import (
    DIRECTIONS,
    MAX_WARPS_PER_SM,
    Parallelism,
    Step,
    naive_parallelism,
    naive_step_ratio,
    step,
    step_on_devices,
    steps,
    steps_table,
    threads_per_block,
    timed_row,
)

__all__ = ["CLUSTER_SASS", "COUNTERS", "DIRECTIONS", "ELSEWHERE_SHARE", "GENERIC", "LONG_ROWS", "LONG_ROW_DTYPES",
           "MAX_WARPS_PER_SM", "MEANINGS", "NOT_RECORDED", "READ_ONCE_CASES", "RERECORD", "STALL_MEANING",
           "WHY_ELSEWHERE", "Claim", "Elsewhere", "LongRow", "Parallelism", "Step", "claim_keys", "claims",
           "claims_table", "cluster_claims", "cluster_machine_code", "counters", "counters_table", "declared",
           "dram_over_minimum", "fraction_of_ceiling", "fraction_statement", "long_rows", "long_rows_after",
           "long_rows_before", "mufu_headroom", "naive_parallelism", "naive_step_ratio", "ncu_record", "predict",
           "roof_claims", "score_prediction", "split_rung", "step", "step_on_devices", "steps", "steps_table",
           "threads_per_block", "timed_row", "work_elsewhere", "work_elsewhere_note"]
