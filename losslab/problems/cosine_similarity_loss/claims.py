"""What the notebooks claim of cosine_similarity_loss's ladder and peers, checked on every record
(``losslab.present.evidence``, tests/test_ladder_claims.py): statements about measurements, so
not among the sources a measurement depends on (``records.freshness``)."""

# its first record (H100): vectorized [ladder]'s forward at the read ceiling (0.703 ms for 2 GiB); no step
# claimed: from warp_shuffle on, every rung's forward is DRAM-bound (0.718, 0.703, 0.703 ms)
SATURATES = ("vectorized", "forward", 0.90)

STEP_CLAIMS = ()

MUFU_ROOF = "far"  # two square roots a row: the MUFU roof far above the time measured

PEER_NOTES = {}
