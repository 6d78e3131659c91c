"""What the notebooks claim of cosine_similarity_loss's ladder and peers, checked on every record
(``losslab.present.evidence``, tests/test_ladder_claims.py): statements about measurements, so
not among the sources a measurement depends on (``records.freshness``)."""

# its first record (H100): vectorized [ladder]'s forward at the read ceiling (0.703 ms for 2 GiB); no step
# claimed: from warp_shuffle on, every rung's forward is DRAM-bound (0.718, 0.703, 0.703 ms)
SATURATES = ("vectorized", "forward", 0.90)

STEP_CLAIMS = ()

MUFU_ROOF = "far"  # two square roots a row: the MUFU roof far above the time measured

PEER_NOTES = {}

# The kernel headers' claims (tests/test_ladder_claims.py) that the newest record refutes: each one an
# expected failure, with what was measured, until the rung is fixed and re-recorded.
REFUTED = {
    "fused_reads_once": (
        "H100 record: fused [ladder]'s forward+backward moved 5346 MB of DRAM traffic, vectorized [ladder]'s "
        "5359 MB, in 1.765 ms against 1.771: its second pass over the row (64 KiB a block) is evicted before it "
        "is read again and comes from DRAM, not L1/L2 as its header says; the operator's fused keeps the row in "
        "registers and takes 1.060 ms"),
}
